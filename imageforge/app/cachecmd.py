"""cache.ls / cache.prune / cache.push / cache.pull / explain: the artifact cache by hand."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from imageforge import cachedir
from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.buildkit.transfer import pull_entries, push_entries
from imageforge.cache import remote as remote_mod
from imageforge.cache.remote import RemoteUnavailable
from imageforge.errors import CacheError, UsageError
from imageforge.jsonfile import read_object
from imageforge.planning.execute import to_build
from imageforge.textsafe import escaped

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)B?", re.I)
_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_size(text: str) -> int:
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise UsageError(f"--max-size {text}: expected a size like 500M or 20G.")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def parse_age(text: str) -> float:
    match = _AGE.fullmatch(text.strip())
    if not match:
        raise UsageError(f"--older-than {text}: expected an age like 12h or 7d.")
    return float(match.group(1)) * _SECONDS[match.group(2).lower()]


def human_size(size: float) -> str:
    for unit in ("B", "K", "M", "G"):
        if size < 1024:
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}T"


def human_age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit}"
    return f"{seconds:.0f}s"


def list_entries(ws: Workspace, *, as_json: bool = False) -> str:
    store = ws.store
    entries = sorted(store.all_entries(), key=lambda e: (e.stage, -e.last_used))
    if as_json:
        return json.dumps([e.meta() for e in entries], indent=2)
    now = time.time()
    lines = [f"{'stage':<18} {'key':<19} {'size':>8} {'age':>6} {'used':>6} {'hits':>5}"]
    lines += [f"{e.stage:<18} {e.key[:19]:<19} {human_size(e.size):>8} "
              f"{human_age(now - e.created):>6} {human_age(now - e.last_used):>6} {e.hits:>5}"
              for e in entries]
    lines.append(f"{len(entries)} artifacts, {human_size(store.size())} on disk in {store.root}")
    return "\n".join(lines)


def prune(ws: Workspace, *, max_size: str | None, older_than: str | None,
          keep_last: int) -> str:
    if max_size is None and older_than is None:
        raise UsageError("cache.prune needs --max-size and/or --older-than.")
    store = ws.store
    removed = store.prune(max_size=parse_size(max_size) if max_size else None,
                          older_than=parse_age(older_than) if older_than else None,
                          keep_last=keep_last or None)
    lines = [f"removed {e.stage} {e.key[:19]} ({human_size(e.size)})" for e in removed]
    lines.append(f"{len(removed)} removed; {human_size(store.size())} left")
    return "\n".join(lines)


def push(ws: Workspace, target: str | None) -> str:
    store = ws.store
    if not ws.remote:
        raise UsageError("cache.push needs --remote (or imageforge.remote in invoke.yaml).")
    if target:
        keys = [s.key for s in project.plan(ws, target).stages if s.status == "cached"]
    else:
        keys = [e.key for e in store.all_entries()]
    # A stage that is only its base image (base) has nothing to push.
    keys = [k for k in keys if store.get(k) is not None]
    with remote_mod.session(ws.remote, verified_in=ws.verified_in) as remote:
        assert remote is not None
        pushed = push_entries(store, remote, keys, required=True)
    return f"pushed {len(pushed)} of {len(keys)} artifacts to {ws.remote}"


def pull(ws: Workspace, target: str) -> str:
    if not ws.remote:
        raise UsageError("cache.pull needs --remote (or imageforge.remote in invoke.yaml).")
    store = ws.store
    with remote_mod.session(ws.remote, verified_in=ws.verified_in) as remote:
        assert remote is not None
        missing = [s for s in project.plan(ws, target).stages if s.status == "build"]
        try:
            # Asked directly: planning would take an unreachable registry for an empty one.
            found = remote.holds([(s.name, s.key) for s in missing])
        except RemoteUnavailable as exc:
            raise CacheError(f"remote cache {ws.remote} is unreachable ({exc}); nothing "
                             "was pulled: run cache.pull again once it answers.") from None
        wanted = [(s.name, s.key) for s, ok in zip(missing, found, strict=True) if ok]
        pulled = pull_entries(store, remote, wanted)
    return f"pulled {len(pulled)} artifacts from {ws.remote}"


def explain(ws: Workspace, target: str) -> str:
    """Why each stage that must rebuild does: the inputs that differ from its last build."""
    with remote_mod.session(ws.remote, verified_in=ws.verified_in) as remote:
        planned = project.plan(ws, target, remote=remote)
    building = to_build(planned)
    if not building:
        return f"{target}: nothing to build; every stage needed is cached"
    last_dir = cachedir.last_builds(ws.cache_dir)
    lines = []
    for name in building:
        stage = planned.stage(name)
        last = read_object(last_dir / f"{name}.json")
        if last is None or not isinstance(last.get("inputs"), dict) or not isinstance(
                last.get("deps", {}), dict):
            # Missing, or not a record imageforge wrote: nothing known of its last build.
            lines.append(f"{name}: never built with this cache")
            continue
        reasons = _differences(last["inputs"], dict(stage.inputs))
        changed_deps = [d for d in stage.deps
                        if last.get("deps", {}).get(d) != planned.stage(d).key]
        reasons += [f"dependency {d} changed" for d in changed_deps]
        if not reasons and last.get("recipe") != stage.recipe:
            reasons.append("its recipe (stage code) changed")
        if not reasons and last.get("key") == stage.key:
            reasons.append("built before, but its artifact is no longer cached")
        lines.append(f"{name}: " + ("; ".join(reasons) or "base image or platform changed"))
    return "\n".join(lines)


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [f"{k} {_show(old.get(k))} -> {_show(new.get(k))}"
            for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def _show(value: Any) -> str:
    # A record's values are shown escaped, and cut where no URL or version reaches: the file
    # could hold anything.
    return "(unset)" if value is None else escaped(str(value), 400)

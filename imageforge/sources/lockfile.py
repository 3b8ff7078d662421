"""The lock file's format: `<manifest>.lock.json`, its entries, reading, writing and diffing.

The file holds entries. Each is one resolved pin with what it was resolved from (its "from"):
a source's sha256 (from its url) or commit (from its repo and ref), the base image's registry
digest (from its reference), each stage's lock-time pins (imageforge.model.lockpin), the
extended image (from its reference), a stage's pip closure, and the versions `lock --upgrade`
moved to (from the manifest's version and policy).

Entries sit in the JSON at paths (`stages.efa.src-efa`, `base`, `upgraded.efa`): a dict with
a "from" key is an entry, so reading, writing and `diff` need nothing new for a new kind of
pin. Every value read is checked (imageforge.sources.lockcheck): a lock arrives through pull
requests and CI caches, and is input like the manifest. A lock file is written whole or not
at all.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from imageforge import jsonfile
from imageforge.errors import LockError
from imageforge.model import lockpin
from imageforge.model.manifest import Manifest
from imageforge.model.stage import Stage
from imageforge.sources import lockcheck, piplock
from imageforge.textsafe import escaped, shown

FORMAT = 2
# Keys of the file that are not entries.
HEADER = ("format", "manifest", "source_date_epoch")

EntryPath = tuple[str, ...]
BASE: EntryPath = ("base",)
EXTENDS: EntryPath = ("extends",)
UPGRADED = "upgraded"
STAGES = "stages"
PIP = "pip"


def lock_path(manifest_path: Path) -> Path:
    return manifest_path.with_name(manifest_path.stem + ".lock.json")


def name(path: EntryPath) -> str:
    """An entry as messages name it: `stages.efa.src-efa`. Its parts are a lock file's keys,
    which may hold any character: each is escaped and cut short."""
    return ".".join(escaped(part) for part in path)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
    """One resolved pin and what it was resolved from."""

    origin: Mapping[str, Any]
    pin: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"from": dict(self.origin), **self.pin}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lock:
    entries: Mapping[EntryPath, Entry]
    # When these pins were first resolved: images built from this lock carry it as their
    # creation time (SOURCE_DATE_EPOCH), so the same pins give the same image config.
    source_date_epoch: int | None = None

    def to_json(self, manifest: Manifest) -> dict[str, Any]:
        data: dict[str, Any] = {"format": FORMAT, "manifest": manifest.path.name,
                                "source_date_epoch": self.source_date_epoch}
        for path, entry in sorted(self.entries.items()):
            node = data
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = entry.to_json()
        return data

    def section(self, prefix: str) -> dict[str, Entry]:
        """The entries under `prefix` by their next path part (e.g. upgraded -> stage)."""
        return {path[1]: entry for path, entry in self.entries.items()
                if len(path) == 2 and path[0] == prefix}

    def versions(self) -> dict[str, str]:
        """stage -> the version `lock --upgrade` moved it to."""
        return {stage: str(entry.pin["to"]) for stage, entry in self.section(UPGRADED).items()}

    def pins(self) -> dict[str, Mapping[str, Any]]:
        """The pins of the entries that are sections of their own (base, extends and the
        stages' lock pins), by section."""
        return {path[0]: entry.pin for path, entry in self.entries.items() if len(path) == 1}


def read(path: Path, *, old_ok: bool = False) -> Lock | None:
    """The lock at `path`, None when there is none (or, with `old_ok`, when an older
    imageforge wrote it: `invoke lock` replaces it)."""
    if not path.exists():
        return None
    try:
        data = jsonfile.load(path)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise LockError(f"{path}: not a valid imageforge lock file ({exc}); delete it and run "
                        "`invoke lock`.") from None
    if data.get("format") != FORMAT:
        if old_ok:
            return None
        raise LockError(f"{path} is in lock format {shown(data.get('format'))}, not {FORMAT}; run "
                        "`invoke lock` to rewrite it.")
    try:
        entries = dict(_entries(data, ()))
    except (ValueError, KeyError, TypeError) as exc:
        raise LockError(f"{path}: not a valid imageforge lock file ({exc}); delete it and run "
                        "`invoke lock`.") from None
    epoch = lockcheck.epoch_problem(data.get("source_date_epoch"))
    if epoch:
        raise LockError(f"{path}: {epoch}; delete the key and run `invoke lock`.")
    for entry_path, entry in entries.items():
        found = lockcheck.problem(entry.pin, entry_path[0])
        if found:
            key, why = found
            raise LockError(f"{path}: {name(entry_path)}.{key}: {why}; a lock holds only what "
                            "`invoke lock` writes: delete that entry and run `invoke lock`.")
    return Lock(entries=entries, source_date_epoch=data.get("source_date_epoch"))


def _entries(node: Mapping[str, Any], at: EntryPath) -> list[tuple[EntryPath, Entry]]:
    found = []
    for key, value in node.items():
        if not at and key in HEADER:
            continue
        if not isinstance(value, dict):
            raise ValueError(f"{name((*at, key))} is not a table")
        if "from" in value:
            if not isinstance(value["from"], dict):
                raise ValueError(f"{name((*at, key))}.from is not a table")
            pin = {k: v for k, v in value.items() if k != "from"}
            found.append(((*at, key), Entry(origin=value["from"], pin=pin)))
        else:
            found += _entries(value, (*at, key))
    return found


def text(lock: Lock, manifest: Manifest) -> str:
    return json.dumps(lock.to_json(manifest), indent=2) + "\n"


def write(path: Path, lock: Lock, manifest: Manifest) -> None:
    """Atomic: the lock file is replaced whole or left as it was."""
    jsonfile.write_text(path, text(lock, manifest))


def pins_moved(old: Lock | None, new: Lock) -> bool:
    """True when some pin differs (not merely where it was resolved from)."""
    before = old.entries if old else {}
    return any(before.get(path, Entry(origin={}, pin={})).pin != entry.pin
               for path, entry in new.entries.items()) or bool(set(before) - set(new.entries))


def diff(old: Lock | None, new: Lock, registry: Mapping[str, Stage] | None = None
         ) -> list[str]:
    """Human lines describing what changed between two locks, entry by entry; a stage's lock
    pin in `registry` is described in its own words."""
    before = old.entries if old else {}
    described = lockpin.declared(registry or {})
    lines = []
    for path in sorted(set(before) | set(new.entries)):
        a, b = before.get(path), new.entries.get(path)
        if a == b:
            continue
        if a is not None and b is not None and a.pin == b.pin:
            lines.append(f"{name(path)}: same pin, now from {_words(b.origin)}")
        else:
            lines.append(_pin_line(path, a, b, described))
    return lines


def _pin_line(path: EntryPath, a: Entry | None, b: Entry | None,
              described: Mapping[str, lockpin.LockPin]) -> str:
    if path[0] == STAGES:
        return f"{path[1]}: {path[2]} {_pin(a)} -> {_pin(b)}"
    if path[0] == UPGRADED:
        if b is None:
            assert a is not None
            return f"{path[1]}: {a.pin['to']} -> {a.origin['version']} (the manifest's version)"
        start = a.pin["to"] if a else b.origin["version"]
        return f"{path[1]}: {start} -> {b.pin['to']} (policy {b.origin['policy']})"
    if path[0] == PIP:
        return f"{path[1]}: pip " + piplock.moves(a.pin if a else {}, b.pin if b else {})
    if len(path) == 1 and path[0] in described:
        return described[path[0]].describe(a.pin if a else None, b.pin if b else None)
    return f"{name(path)}: {_pin(a)} -> {_pin(b)}"


def _pin(entry: Entry | None) -> str:
    if entry is None:
        return "(none)"
    pin = entry.pin
    return str(pin.get("commit") or pin.get("sha256") or pin.get("digest") or _words(pin))


def _words(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items() if not isinstance(v, dict | list))

"""Moving artifacts between the local store and the registry cache, through BuildKit."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

from imageforge.buildkit import bakefail
from imageforge.buildkit.bake import BAKE_ENV, Invocation, retried
from imageforge.cache import remote as remote_mod
from imageforge.cache.artifacts import ArtifactStore
from imageforge.cache.remote import Remote
from imageforge.cmd import run
from imageforge.errors import (
    CacheError,
)


def push_entries(store: ArtifactStore, remote: Remote, keys: Sequence[str], *,
                 required: bool = False) -> list[str]:
    """Push local artifacts to the registry. A failure is a warning (the build stands),
    or with `required` (cache.push, whose only job this is) a CacheError."""
    entries = [e for e in (store.get(k) for k in keys) if e is not None]
    if not entries:
        return []
    targets = {
        f"push-{i}": {"dockerfile-inline": "FROM artifact\n", "context": str(store.root),
                      "contexts": {"artifact": e.context},
                      "output": [f"type=registry,name={remote.ref(e.stage, e.key)}"]}
        for i, e in enumerate(entries)
    }
    failure = _bake_quietly(store, {"group": {"default": {"targets": list(targets)}},
                                    "target": targets}, remote)
    if failure is None:
        return [e.key for e in entries]
    if required:
        raise CacheError(f"could not push {len(entries)} artifact(s) to {remote.repository} "
                         f"({failure}); the local cache is unchanged: run cache.push again "
                         "once the registry answers.")
    remote_mod.warn_push_failed(remote, len(entries), failure)
    return []


def pull_entries(store: ArtifactStore, remote: Remote, wanted: Sequence[tuple[str, str]],
                 ) -> list[str]:
    """Download (stage, key) artifacts from the registry into the local store."""
    scratch = store.scratch()
    try:
        dirs = {key: scratch / key[7:] for _, key in wanted}
        targets = {
            f"pull-{i}": {"dockerfile-inline": "FROM artifact\n", "context": str(scratch),
                          "contexts": {"artifact": remote.context(stage, key)},
                          "output": [f"type=oci,dest={dirs[key]},tar=false"]}
            for i, (stage, key) in enumerate(wanted)
        }
        if not targets:
            return []
        failure = _bake_quietly(store, {"group": {"default": {"targets": list(targets)}},
                                        "target": targets}, remote, outputs=list(dirs.values()))
        if failure is not None:
            raise CacheError(f"could not pull artifacts from {remote.repository} ({failure}); "
                             "nothing was stored: check that it answers and that the "
                             "credentials are right, then run again.")
        for stage, key in wanted:
            store.add(key=key, stage=stage, inputs={}, layout=dirs[key], build_seconds=0.0)
        return [key for _, key in wanted]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def fetch_layout(store: ArtifactStore, remote: Remote, stage: str, key: str, digest: str,
                 dest: Path) -> None:
    """The registry's artifact of `key`, by `digest`, as an OCI layout at `dest` (not
    stored): what `verify --rebuild --remote` compares a rebuild with."""
    ref = f"{remote.ref(stage, key)}@{digest}"
    target = {"dockerfile-inline": "FROM artifact\n", "context": str(dest.parent),
              "contexts": {"artifact": f"docker-image://{ref}"},
              "output": [f"type=oci,dest={dest},tar=false"]}
    failure = _bake_quietly(store, {"group": {"default": {"targets": ["fetch"]}},
                                    "target": {"fetch": target}}, remote, outputs=[dest])
    if failure is not None:
        raise CacheError(f"could not read {ref} from {remote.repository} ({failure}); check "
                         "that it answers and that the credentials are right, then run again.")


def _bake_quietly(store: ArtifactStore, bake: dict[str, Any], remote: Remote,
                  outputs: Sequence[Path] = ()) -> str | None:
    """Run a bake that moves artifacts; None when it worked, else BuildKit's reason. Like a
    build's bake, one that failed only in a way another attempt gets past runs again."""
    scratch = store.scratch()
    try:
        # Image entries are names in one engine's image store: that engine moves them.
        context = store.images.context if store.images is not None else None
        argv = Invocation(spec=bake, workdir=scratch, progress="quiet",
                          engine=["--context", context, "buildx"] if context else ["buildx"]
                          ).write()

        def once() -> CompletedProcess[bytes]:
            return run(argv, env={**remote.env, **BAKE_ENV}, timeout=3600, error=CacheError,
                       timed_out=f"moving artifacts to or from {remote.repository} took over "
                                 "an hour; check the registry and run again.")

        def transient(proc: CompletedProcess[bytes]) -> str | None:
            return None if proc.returncode == 0 else \
                bakefail.transient(proc.stderr.decode(errors="replace"))

        proc = retried(once, transient, outputs, "moving artifacts")
        if proc.returncode == 0:
            return None
        output = proc.stderr.decode(errors="replace")
        known = bakefail.explain(output, cache=store.root)
        if known is not None:
            raise known
        return bakefail.cause(output)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

"""One manifest and its lock, read and checked once per command.

A command used to load the manifest, find its lock, read it and apply it anew at each step
(the rules, the plan, the image labels, the report), each time slightly differently. The
front end now opens a `ManifestLock` once (`project.opened`): the manifest as written (its
file, what it inherits, the --set overrides; validated), the lock file's entries and digest,
and the lock applied without resolving anything. Every question about pins asks it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping
from pathlib import Path

from imageforge.model import manifest as manifest_mod
from imageforge.model.manifest import Manifest
from imageforge.model.stage import Stage
from imageforge.sources import lockfile, locksettle


@dataclasses.dataclass(frozen=True, kw_only=True)
class ManifestLock:
    # The effective manifest as written: file, inheritance and --set overrides, validated.
    manifest: Manifest
    registry: Mapping[str, Stage]
    # The lock file beside the manifest, its entries (None: there is none) and its sha256.
    path: Path
    lock: lockfile.Lock | None
    digest: str | None

    @functools.cached_property
    def settled(self) -> locksettle.Settled:
        """The lock applied entry by entry, resolving nothing (stale entries stay unpinned)."""
        return locksettle.settle(self.manifest, self.lock, self.registry)

    @property
    def current(self) -> bool:
        """True when a lock exists and every entry the manifest needs is current and used."""
        return self.lock is not None and not self.settled.stale and not self.settled.unused

    def check(self) -> None:
        """Refuse a missing lock, or one with stale or unused entries (`--locked`)."""
        locksettle.check(self.manifest, self.lock, self.path, registry=self.registry,
                       settled=self.settled if self.lock is not None else None)


def open_manifest(path: Path, overrides: tuple[str, ...], registry: Mapping[str, Stage]
                  ) -> ManifestLock:
    """Load and validate the manifest at `path` with `overrides`, and read its lock."""
    manifest = manifest_mod.load(path, overrides, registry=registry)
    lock_path = lockfile.lock_path(path)
    found = lockfile.read(lock_path)
    digest = ("sha256:" + hashlib.sha256(lock_path.read_bytes()).hexdigest()
              if found is not None else None)
    return ManifestLock(manifest=manifest, registry=registry, path=lock_path, lock=found,
                        digest=digest)

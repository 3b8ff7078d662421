"""Resolving a lock's stale entries upstream: registries, git servers, download URLs,
the package index (what `invoke lock` asks; settling itself is locksettle.py)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from imageforge.cmd import run
from imageforge.errors import DockerError, FatalError, LockError, ManifestError
from imageforge.model import extends, lockpin
from imageforge.model.manifest import Manifest
from imageforge.model.sourcetypes import GitSource, Source, UrlSource
from imageforge.model.stage import Stage
from imageforge.sources import extended, gitsource, piplock, tarcheck, upstream
from imageforge.sources.download import download
from imageforge.sources.lockfile import Entry, Lock
from imageforge.sources.locksettle import LocalId, Settled, settle
from imageforge.sources.sources import SourceCache
from imageforge.textsafe import redact

# How long a registry may take to tell the base image's digest before it counts as offline.
BASE_DIGEST_TIMEOUT_S = 30


@dataclasses.dataclass(frozen=True, kw_only=True)
class Upstream:
    """The resolver that asks upstream: registries, git servers, download URLs."""

    cache: SourceCache
    stages: Mapping[str, Stage]
    revisit: bool = False
    upgrade: bool = False
    # With `upgrade`: the stages to move (every one when empty).
    only: Sequence[str] = ()
    endpoints: upstream.Endpoints | None = None

    def renewed(self, manifest: Manifest, names: Sequence[str]) -> list[str]:
        if not self.upgrade:
            return []
        unknown = [n for n in self.only if n not in names]
        if unknown:
            raise ManifestError(f"--stage {unknown[0]}: {manifest.path} defines no such "
                                f"stage; use one of {', '.join(names)}.")
        return list(self.only) or list(names)

    def upgrades(self, manifest: Manifest, registry: Mapping[str, Stage],
                 names: Sequence[str]) -> list[upstream.Upgrade]:
        endpoints = self.endpoints or upstream.Endpoints(locate=self.cache.locate_url)
        return upstream.upgrades(manifest, registry, names, endpoints)

    def source(self, source: Source, old: Entry | None) -> dict[str, Any]:
        if isinstance(source, UrlSource):
            if old and old.pin.get("sha256"):
                return dict(old.pin)
            return {"sha256": _hash_into_cache(source, self.cache)}
        return {"commit": _resolve_git(source, old, self.cache)}

    def base(self, ref: str, old: Entry | None) -> dict[str, Any]:
        return dict(old.pin) if old else {"digest": _base_digest(ref)}

    def extended(self, manifest: Manifest, old: Entry | None) -> dict[str, Any]:
        del old     # an extended image is asked for again every time: its tag may move
        return _inspect_extended(manifest, self.stages)

    def lock_pin(self, pin: lockpin.LockPin, manifest: Manifest,
                 registry: Mapping[str, Stage], old: Entry | None) -> Mapping[str, Any]:
        if old:
            return dict(old.pin)
        return dict(pin.resolve(manifest, registry, lockpin.Upstream(
            locate=self.cache.locate_url, mirrors=self.cache.root / "mirrors")))

    def pip(self, stage: str, origin: Mapping[str, Any], old: Entry | None
            ) -> dict[str, Any]:
        if old:
            return dict(old.pin)
        index = origin.get("index") or \
            (self.endpoints or upstream.Endpoints()).pypi.rstrip("/") + "/simple"
        return {"packages": piplock.resolve(
            stage, origin["requirements"], python=origin["python"],
            platform=origin["platform"], index_url=index)}


def _inspect_extended(manifest: Manifest, stages: Mapping[str, Stage]) -> dict[str, Any]:
    """The extended image as the lock records it: its registry digest (a local image's ID is
    a fact of this machine, kept out of the lock) and the stages it provides, from its labels
    unless the manifest declares them."""
    ref = str(manifest.image["extends"])
    declared = extends.provided(manifest)
    try:
        found = extended.inspect(ref, stages)
    except DockerError:
        if declared is None:
            raise
        # Declared by hand: an image this host cannot see is still buildable on one that can.
        return {"digest": None, "provides": list(declared), "versions": {}}
    extends.check_versions(manifest, found.versions)
    names = declared if declared is not None else found.provides
    return {"digest": None if found.local else found.digest, "provides": list(names),
            "versions": dict(found.versions)}


def resolve(manifest: Manifest, stages: Mapping[str, Stage], cache: SourceCache,
            previous: Lock | None, *, upgrade: bool, only: Sequence[str] = (),
            endpoints: upstream.Endpoints | None = None,
            local_id: LocalId | None = None) -> Settled:
    """What `invoke lock` writes: the previous lock's current entries, checked against
    upstream; its stale ones and those of the stages being upgraded (`only`, or every one,
    when `upgrade`), resolved anew."""
    resolver = Upstream(cache=cache, stages=stages, revisit=True, upgrade=upgrade, only=only,
                        endpoints=endpoints)
    return settle(manifest, previous, stages, resolver, local_id)


def _resolve_git(source: GitSource, old: Entry | None, cache: SourceCache) -> str:
    current = gitsource.resolve_ref(cache.locate_url(source.repo), source.ref)
    if old and old.pin.get("commit") != current:
        raise LockError(
            f"{source.repo} {source.ref} now points to {current}, but the lock says "
            f"{old.pin.get('commit')}; if the move is expected run `invoke lock --upgrade`, "
            "otherwise pin `commit` in the manifest.")
    return current


def _hash_into_cache(source: UrlSource, cache: SourceCache) -> str:
    """Download an unpinned file once to learn its digest, keeping it in the source cache so
    the build that follows does not fetch it again."""
    cache.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache.root) as tmp:
        file = Path(tmp) / source.filename
        digest = download(cache.locate_url(source.url), file, sha256=None)
        # Checked here too, where the refusal can name the upstream URL, not this temp file.
        if tarcheck.is_tarball(source.filename):
            tarcheck.check(file, source=source.name, origin=redact(source.url))
        cache.materialize(dataclasses.replace(source, url=str(file), sha256=digest))
    return digest


def _base_digest(ref: str, *, timeout: float = BASE_DIGEST_TIMEOUT_S) -> str | None:
    """The registry digest of the base image, or None when no registry answers (offline,
    or a local-only image, or not within `timeout` seconds)."""
    if "@sha256:" in ref:
        return ref.split("@", 1)[1]
    try:
        result = run(["docker", "buildx", "imagetools", "inspect", ref, "--format",
                      "{{json .Manifest.Digest}}"], timeout=timeout)
    except (FatalError, OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    digest = json.loads(result.stdout or b"null")
    return digest if isinstance(digest, str) and digest.startswith("sha256:") else None

"""One command's workspace: what it works on, opened once and asked by every step.

The front end builds one `Workspace` per command from its flags and configuration. It holds
the stage registry, the manifest with its lock (`opened`), the artifact store (`store`), the
source cache (`sources`) and the shared cache's repository (`remote`); planning, building,
verifying and the cache commands ask it instead of opening any of them again.

The remote cache is named here but connected only for the commands that talk to it
(`cache.remote.session`): its registry credentials are written to a private docker config
that must be deleted when that command ends, which a value kept for the whole command
cannot promise.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path

from imageforge import cachedir
from imageforge.cache import localimages
from imageforge.cache.artifacts import ArtifactStore
from imageforge.cache.imagestore import ImageStore
from imageforge.model.stage import Stage
from imageforge.sources import locksettle
from imageforge.sources import mirror as mirror_mod
from imageforge.sources.manifestlock import ManifestLock, open_manifest
from imageforge.sources.sources import SourceCache

DEFAULT_MANIFEST = Path("manifests/smddp.toml")
# The docker CLI's engine: where whole-image artifacts are kept unless a builder has its own.
DOCKER_ENGINE = ImageStore()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workspace:
    # Every stage the manifest may name. The front end passes it in (tasks.py: imageforge's
    # stages/ plus a team's stage_dirs): the engine itself never imports a stage.
    registry: Mapping[str, Stage]
    manifest: Path = DEFAULT_MANIFEST
    overrides: tuple[str, ...] = ()
    cache_dir: Path = Path("cache")
    # Refuse a missing or stale lock instead of planning from the manifest alone.
    locked: bool = False
    # Registry repository of the shared artifact cache, e.g. "127.0.0.1:5000/imageforge-cache".
    remote: str | None = None
    # BuildKit layer cache per stage: a directory, or a registry repository.
    layer_cache: str | None = None
    # URL prefix replacements applied to every source before it is fetched (invoke config).
    rewrites: tuple[mirror_mod.Rewrite, ...] = ()
    # A mirror made by `mirror.sync` (directory or URL): the only place sources come from.
    mirror: str | None = None
    # Whole-image artifacts by name in the engine's image store (False: OCI layouts).
    image_store: bool = True
    # cache_trust = "verified": only remote artifacts a rebuild verified (cache/verified.py).
    trust_verified: bool = False

    @property
    def verified_in(self) -> Path | None:
        """Where the records of verified artifacts are, when only those may be used."""
        return self.cache_dir if self.trust_verified else None

    @functools.cached_property
    def opened(self) -> ManifestLock:
        """The manifest and its lock, read and checked once for this command (until
        `reopen`, after the lock was replaced)."""
        return open_manifest(self.manifest, self.overrides, self.registry)

    def reopen(self) -> None:
        """The lock file was written: read it again when next asked."""
        self.__dict__.pop("opened", None)

    # The store and the source cache are views of directories, opened afresh for each step:
    # a store remembers the image store's IDs when it first reads them, and a build in between
    # changes them.
    @property
    def store(self) -> ArtifactStore:
        """The artifact store, whole-image artifacts in the docker CLI's engine."""
        return self.store_for(DOCKER_ENGINE)

    def store_for(self, images: ImageStore | None) -> ArtifactStore:
        """The artifact store with whole-image artifacts in the image store of `images` (None:
        a builder without an image store), unless the workspace keeps OCI layouts only."""
        return ArtifactStore(cachedir.artifacts(self.cache_dir),
                             images if self.image_store else None)

    @property
    def sources(self) -> SourceCache:
        """The source cache, fetching through the configured rewrites and mirror."""
        root = cachedir.sources(self.cache_dir).resolve()
        if not self.rewrites and not self.mirror:
            return SourceCache(root)
        return SourceCache(root, mirror_mod.Locations(self.rewrites, self.mirror,
                                                      token=mirror_mod.token_from_env()))

    def local_ids(self, mode: localimages.Mode) -> locksettle.LocalId:
        """This machine's IDs of local-only base images, from the local cache (not the
        lock)."""
        images = localimages.LocalImages(self.cache_dir)
        return lambda ref: images.id_for(ref, mode)

"""The bakes of one build, as they will run: for each wave of stages (planning.execute.waves),
its Dockerfile, its bake file and the argv that runs it. `build` runs them and `build
--dry-run` prints them, from this one description."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from pathlib import Path

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.buildkit.bake import Invocation, absolute_if_local, builder_args
from imageforge.buildkit.results import BuildOptions
from imageforge.cache.artifacts import ArtifactStore
from imageforge.planning.dockerfile import CA_BUNDLE_SECRET
from imageforge.planning.execute import (
    LayerCache,
    bake_file,
    fresh_cache_mounts,
    image_layer_cache,
    make_run,
    whole_images,
)
from imageforge.planning.labels import image_metadata
from imageforge.planning.plan import Plan


@dataclasses.dataclass(frozen=True, kw_only=True)
class Wave:
    dockerfile: str
    bake: Invocation
    # Stage -> its name in the engine's image store; the other built stages' OCI layouts.
    images: Mapping[str, str]
    artifact_dirs: Mapping[str, Path]
    # The cache-mount token of a --no-cache build (its mounts are dropped afterwards).
    token: str | None


def wave(ws: Workspace, options: BuildOptions, store: ArtifactStore,
         planned: Plan, building: list[str], contexts: Mapping[str, str], workdir: Path, *,
         tag: str | None, sbom_generator: str | None, remote_layers: str | None) -> Wave:
    """The bake that builds `building` from `contexts` in `workdir`, and with a `tag` makes
    the image (pushed with its SBOM by `sbom_generator` under --push). `remote_layers`: the
    remote cache repository that also keeps BuildKit's layer cache of image stages (see
    remote_layer_cache), unless --layer-cache names another."""
    run = make_run(planned, planned.registry, building, contexts, final=tag is not None)
    token = uuid.uuid4().hex[:12] if options.no_cache else None
    images = {n: store.image_ref(n, planned.stage(n).key)
              for n in whole_images(planned, building)} if store.images is not None else {}
    artifact_dirs = {name: workdir / "out" / name for name in building if name not in images}
    layers = LayerCache(location=absolute_if_local(ws.layer_cache),
                        modes={n: planned.registry[n].layer_cache for n in building}) \
        if ws.layer_cache else None
    if layers is None and remote_layers:
        layers = image_layer_cache(planned, building, remote_layers)
    spec = bake_file(run, workdir=workdir, tag=tag,
                     labels=image_metadata(planned, project.current_lock(ws),
                                           options.revision),
                     platform=str(planned.manifest.image["platform"]), push=options.push,
                     artifact_dirs=artifact_dirs, artifact_images=images,
                     layer_cache=layers, sbom_generator=sbom_generator,
                     secrets={CA_BUNDLE_SECRET: str(options.ca_bundle)}
                     if options.ca_bundle else {})
    if options.no_cache:
        for body in spec["target"].values():
            body["no-cache"] = True
    return Wave(dockerfile=fresh_cache_mounts(run.dockerfile, token) if token
                else run.dockerfile,
                bake=Invocation(spec=spec, workdir=workdir, engine=builder_args(options.builder),
                                metadata=True),
                images=images, artifact_dirs=artifact_dirs, token=token)


def remote_layer_cache(ws: Workspace, *, answered: bool = True) -> str | None:
    """The remote cache's repository, where image stages keep BuildKit's layer cache too
    (execute.image_layer_cache); None without a remote cache, when the registry did not
    answer this command (`answered`: a build then runs from the local cache alone), and
    under cache_trust = "verified", which reads only artifacts a rebuild verified."""
    if not ws.remote or not answered or ws.verified_in is not None:
        return None
    return ws.remote

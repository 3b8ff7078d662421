"""`invoke build --dry-run`: what a build would fetch, reuse and run, running nothing."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from imageforge.app import project
from imageforge.buildkit.bake import absolute_if_local
from imageforge.buildkit.results import BuildOptions
from imageforge.cmd import docker_binary
from imageforge.errors import (
    LockError,
)
from imageforge.model.sourcetypes import Source
from imageforge.planning.execute import LayerCache, Run, bake_file, make_run, reused, to_build
from imageforge.planning.labels import default_tag, labels
from imageforge.planning.plan import Plan
from imageforge.sources.sources import SourceCache


def print_dry_run(settings: project.Settings, planned: Plan, options: BuildOptions) -> None:
    cache = project.source_cache(settings)
    building = to_build(planned)
    contexts = {src.name: str(_planned_path(cache, src))
                for name in building for src in planned.stage(name).sources}
    for name in reused(planned, building):
        contexts[name] = f"<{planned.stage(name).status} artifact {planned.stage(name).key[:19]}>"
    run: Run = make_run(planned, planned.registry, building, contexts)
    workdir = settings.cache_dir.resolve() / "build" / planned.target
    layers = LayerCache(location=absolute_if_local(settings.layer_cache),
                        modes={n: planned.registry[n].layer_cache for n in building}) \
        if settings.layer_cache else None
    bake = bake_file(run, workdir=workdir, tag=options.tag or default_tag(planned),
                     labels=labels(planned), platform=str(planned.manifest.image["platform"]),
                     push=options.push,
                     artifact_dirs={n: workdir / "artifacts" / n for n in building},
                     layer_cache=layers)
    print("+ " + shlex.join([docker_binary(), "buildx", "bake", "-f",
                             str(workdir / "bake.json"), "--progress", "rawjson"]))
    print(f"# stages to build: {', '.join(building) or 'none'}")
    print("# bake.json")
    print(json.dumps(bake, indent=2))
    print("# Dockerfile")
    print(run.dockerfile, end="")


def _planned_path(cache: SourceCache, source: Source) -> Path:
    """Where a source's context will live; unlocked sources have no address yet."""
    try:
        return cache.path_for(source)
    except LockError:
        return Path(f"<unlocked: run invoke lock>/{source.name}")

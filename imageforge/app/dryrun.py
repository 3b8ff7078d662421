"""`invoke build --dry-run`: what a build would fetch, reuse and run, running nothing."""

from __future__ import annotations

import json
from pathlib import Path

from imageforge.app import bakes
from imageforge.app.workspace import Workspace
from imageforge.buildkit.results import BuildOptions
from imageforge.buildkit.sbom import SBOM_GENERATOR
from imageforge.cache.artifacts import ArtifactStore
from imageforge.errors import LockError
from imageforge.model.sourcetypes import Source
from imageforge.planning.execute import reused, to_build, waves
from imageforge.planning.labels import default_tag
from imageforge.planning.plan import Plan
from imageforge.sources.sources import SourceCache


def print_dry_run(ws: Workspace, planned: Plan, options: BuildOptions,
                  store: ArtifactStore) -> None:
    """Each bake the build would run (app/bakes.py, as `build` makes them): its argv, its
    bake file and its Dockerfile. Sources not fetched yet show where they will be; a stage an
    earlier bake of this build stores shows as that artifact. Writes nothing."""
    cache = ws.sources
    building = to_build(planned)
    contexts = {src.name: str(_planned_path(cache, src))
                for name in building for src in planned.stage(name).sources}
    for name in reused(planned, building):
        contexts[name] = f"<{planned.stage(name).status} artifact {planned.stage(name).key[:19]}>"
    workdir = ws.cache_dir.resolve() / "build" / planned.target
    tag = options.tag or default_tag(planned)
    parts = waves(planned, building) or [[]]
    print(f"# stages to build: {', '.join(building) or 'none'}")
    for number, part in enumerate(parts):
        last = number == len(parts) - 1
        bake = bakes.wave(ws, options, store, planned, part, contexts,
                          workdir / f"bake-{number}", tag=tag if last else None,
                          sbom_generator=SBOM_GENERATOR if options.push and last else None,
                          remote_layers=bakes.remote_layer_cache(ws))
        print("+ " + bake.bake.command_line())
        print(f"# bake.json ({', '.join(part) or 'the image'})")
        print(json.dumps(bake.bake.spec, indent=2))
        print("# Dockerfile")
        print(bake.dockerfile, end="")
        for name in part:
            contexts[name] = f"<artifact {planned.stage(name).key[:19]} stored by bake {number}>"


def _planned_path(cache: SourceCache, source: Source) -> Path:
    """Where a source's context will live; unlocked sources have no address yet."""
    try:
        return cache.path_for(source)
    except LockError:
        return Path(f"<unlocked: run invoke lock>/{source.name}")

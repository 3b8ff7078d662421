"""Run a plan: build what no cache holds, in BuildKit (bake) runs, and keep the results.

Stages found in the local artifact store or the remote registry reach BuildKit as named
contexts (oci-layout:// or docker-image://); the rest build in one bake run that also
exports each newly built stage (an OCI layout, or a named image in the engine's store),
adopted into the store under its key. An image stage that reads stages built in this run
builds in a later bake, from what the earlier one stored (execute.waves).
Per-key locks make concurrent builds on one cache share work instead of repeating it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from imageforge import cachedir, jsonfile, log
from imageforge.app import bakes, dryrun, project
from imageforge.app.export import exported_stages
from imageforge.app.pushed import registry_image
from imageforge.app.workspace import Workspace
from imageforge.buildkit import bake, cachemounts
from imageforge.buildkit.bake import builder_args
from imageforge.buildkit.buildreport import report_data, write_report
from imageforge.buildkit.progress import BuildProgress
from imageforge.buildkit.results import (
    BuildOptions,
    BuildResult,
    Clock,
    StageResult,
    UpToDate,
    as_noop,
)
from imageforge.buildkit.sbom import ensure_sbom_generator
from imageforge.buildkit.transfer import push_entries
from imageforge.cache import remote as remote_mod
from imageforge.cache.artifacts import ArtifactStore
from imageforge.cache.imagestore import ImageStore
from imageforge.cache.keylock import locked_all
from imageforge.cache.remote import Remote
from imageforge.docker import ensure_ready, local_image
from imageforge.errors import (
    CacheError,
    LockError,
)
from imageforge.jsonfile import read_object
from imageforge.model.imageref import registry_host
from imageforge.planning import localtree
from imageforge.planning.execute import (
    is_external,
    reused,
    to_build,
    waves,
)
from imageforge.planning.labels import default_tag, image_metadata
from imageforge.planning.plan import Plan
from imageforge.sources import extended


def build(ws: Workspace, options: BuildOptions) -> BuildResult | None:
    clock = Clock()
    store = ws.store_for(image_store(options.builder))
    hosts = [remote_mod.check_repository(ws.remote).split("/", 1)[0]] \
        if ws.remote else []
    push_host = registry_host(options.tag) if options.push and options.tag else None
    if push_host:
        hosts.append(push_host)
    with remote_mod.credentials(hosts) as env:
        remote = Remote(repository=ws.remote, env=env,
                        verified_in=ws.verified_in) if ws.remote else None
        return _build(ws, options, store, remote, env, clock)


def _build(ws: Workspace, options: BuildOptions, store: ArtifactStore,
           remote: Remote | None, env: Mapping[str, str], clock: Clock) -> BuildResult | None:
    # A dry run contacts no upstream: a stale pin shows as unlocked in what it prints.
    planned = project.plan(ws, options.target, remote=remote,
                           resolve=not options.dry_run)
    for warning in planned.warnings():
        log.warning(warning)
    if options.expect_key and planned.key != options.expect_key:
        raise LockError(f"--expect-key: {options.target}'s key is {planned.key}, not "
                        f"{options.expect_key}: the manifest, its lock or the --set overrides "
                        "changed since the pipeline was generated; run `invoke ci.generate` "
                        "again.")
    if options.dry_run:
        dryrun.print_dry_run(ws, planned, options, store)
        return None
    # build --output reads every exported stage's artifact: one gone from the image store
    # (or corrupt) is dropped here by verify, so this build makes it again.
    also = [s.name for s in exported_stages(planned)] if options.exports else []
    gone = [name for name in also if planned.stage(name).status == "cached"
            and store.verify(planned.stage(name).key) is None]
    if gone:
        planned = project.with_statuses(planned, store, remote)
    if not to_build(planned, also):
        clock.lap("plan")
        unchanged = None
        if options.push and options.tag:
            unchanged = _pushed(ws, options, options.tag, planned, store, env, clock)
        elif not options.builder and not options.push:
            unchanged = _unchanged(ws, planned, store, options.tag or default_tag(planned),
                                   clock)
        if unchanged is not None:
            return unchanged
    # buildx itself is not asked first (a docker CLI run): a bake without it fails, and
    # bakefail says so (exit 6).
    ensure_ready(options.builder, buildx=bool(options.builder))
    _require_base(options.builder, planned)
    for _ in range(5):
        building = to_build(planned, also)
        using = reused(planned, building)
        keys = [(store.lock_path(planned.stage(n).key), False, n) for n in building]
        keys += [(store.lock_path(planned.stage(n).key), True, n) for n in using
                 if planned.stage(n).status == "cached"]
        with locked_all(keys):
            # Another build may have stored (or pruned) keys while we waited.
            fresh = project.with_statuses(planned, store, remote)
            if to_build(fresh, also) != building or reused(fresh, building) != using:
                planned = fresh
                continue
            contexts = _reuse_contexts(store, remote, fresh, using)
            if contexts is None:
                planned = project.with_statuses(fresh, store, remote)
                continue
            return _execute(ws, options, store, remote, fresh, building, contexts,
                            env, clock)
    raise CacheError("the artifact cache kept changing under this build (other builds or "
                     "prunes running); run it again.")


def _unchanged(ws: Workspace, planned: Plan, store: ArtifactStore, tag: str,
               clock: Clock) -> BuildResult | None:
    """A build with nothing to do: every stage is cached and `tag` already is this plan's
    image, every label imageforge would give it equal (each stage's key, the manifest and
    lock digests, waivers, the imageforge revision). BuildKit is not called at all; None
    when the image is missing or differs in any label (it is then made again, from the
    cached stages), or the target's own entry is corrupt (it is rebuilt)."""
    wanted = image_metadata(planned, project.current_lock(ws))
    image_id, present = local_image(tag)
    if image_id is None or present is None:
        return None
    if any(present.get(label) != value for label, value in wanted.items()):
        return None
    # The daemon answered; a local base image replaced since the lock still stops the build.
    extended.require_same_image(planned.manifest)
    # As a build that reuses it would: the target's entry is re-hashed where it changed, and
    # a corrupt one is discarded and rebuilt, never kept.
    target = planned.stage(planned.target)
    if target.status == "cached" and store.verify(target.key) is None:
        return None
    result = _nothing_built(ws, planned, store, tag, image_id, clock)
    return dataclasses.replace(result, uptodate=_uptodate(ws, planned, store, result))


def _pushed(ws: Workspace, options: BuildOptions, tag: str, planned: Plan,
            store: ArtifactStore, env: Mapping[str, str], clock: Clock) -> BuildResult | None:
    """A --push build with nothing to build whose tag the registry already holds as this
    plan's image, every label equal (app/pushed.py): nothing is loaded, made or pushed. None
    when the registry holds another image, none, or cannot be asked."""
    wanted = image_metadata(planned, project.current_lock(ws), options.revision)
    digest = registry_image(tag, str(planned.manifest.image["platform"]), wanted, env)
    if digest is None:
        return None
    # A local base image replaced since the lock still stops the build, as it would the bake.
    _require_base(options.builder, planned)
    log.note(f"{tag} in the registry is already this build's image ({digest}); nothing "
             "built, loaded or pushed.")
    return _nothing_built(ws, planned, store, tag, digest, clock)


def _nothing_built(ws: Workspace, planned: Plan, store: ArtifactStore, tag: str,
                   image: str, clock: Clock) -> BuildResult:
    for stage in planned.stages:
        if stage.status == "cached":
            store.touch(stage.key)
    results = tuple(StageResult(name=s.name, key=s.key,
                                state="remote" if s.status == "remote" else "cached",
                                seconds=0.0) for s in planned.stages)
    clock.lap("check")
    result = BuildResult(target=planned.target, tag=tag, stages=results, seconds=0.0,
                         report=None, image_digest=image, phases=clock.phases)
    return dataclasses.replace(result, report=write_report(ws.cache_dir, planned, result))


def _require_base(builder: str | None, planned: Plan) -> None:
    """Refuse a local base image replaced since the lock, on the engine that builds. A
    docker-container builder has no image store of its own to compare with."""
    engine = builder_args(builder)
    if engine[0] == "--context" or not builder:
        extended.require_same_image(planned.manifest, engine[1] if builder else None)


def _uptodate(ws: Workspace, planned: Plan, store: ArtifactStore,
              result: BuildResult) -> UpToDate | None:
    """What the same build depends on once everything is up to date (imageforge/uptodate.py),
    for a build on the docker CLI's own engine and the local cache alone; None otherwise."""
    if ws.remote:
        return None
    images = [result.tag]
    if planned.manifest.image.get("base_image_id"):
        images.append(str(planned.manifest.image["base"]))
    entries: list[Path] = []
    files: list[Path] = []
    for stage in planned.stages:
        if is_external(stage):
            continue
        entry = store.get(stage.key)
        if entry is None:
            return None
        entries.append(entry.path)
        if stage.name != planned.target:
            continue
        if entry.image:
            images.append(entry.image)
        else:
            files += sorted((entry.path / "blobs" / "sha256").iterdir())
    return UpToDate(images=tuple(images), entries=tuple(entries), files=tuple(files),
                    report=report_data(planned, as_noop(result)))


def _reuse_contexts(store: ArtifactStore, remote: Remote | None, planned: Plan,
                    using: Sequence[str]) -> dict[str, str] | None:
    """Named contexts for cached stages; None when a local entry turned out corrupt (it is
    discarded, and the caller plans again)."""
    contexts: dict[str, str] = {}
    for name in using:
        stage = planned.stage(name)
        if stage.status == "remote":
            assert remote is not None
            contexts[name] = remote.context(name, stage.key)
            continue
        entry = store.verify(stage.key)
        if entry is None:
            return None
        contexts[name] = entry.context
    return contexts


def _execute(ws: Workspace, options: BuildOptions, store: ArtifactStore,
             remote: Remote | None, planned: Plan, building: list[str],
             contexts: dict[str, str], env: Mapping[str, str], clock: Clock) -> BuildResult:
    started = time.time()
    clock.lap("plan")
    sources = [src for name in building for src in planned.stage(name).sources]
    contexts.update({name: str(path) for name, path in
                     ws.sources.materialize_all(sources).items()})
    for name in building:
        for context, (path, digest) in planned.stage(name).local_dirs.items():
            contexts[context] = str(localtree.snapshot(Path(path), digest,
                                                     cachedir.local_trees(ws.cache_dir)))
    clock.lap("fetch")
    scratch = store.scratch()
    tag = options.tag or default_tag(planned)
    progress = BuildProgress([s.name for s in planned.stages], options.progress)
    for name in contexts:
        if name in progress.stages:
            progress.preset(name, "remote" if planned.stage(name).status == "remote"
                            else "cached")
    metadata: dict[str, Any] = {}
    try:
        with progress:
            # No stage to build (only the image to make again): one bake of the image.
            parts = waves(planned, building) or [[]]
            remote_layers = bakes.remote_layer_cache(
                ws, answered=remote is not None and not remote.unreachable)
            for number, wave in enumerate(parts):
                later = {n for part in parts[number + 1:] for n in part}
                last = number == len(parts) - 1
                metadata = _bake_wave(ws, options, store, planned, wave, contexts, env,
                                      clock, progress, scratch / f"bake-{number}",
                                      tag=tag if last else None, later=later,
                                      remote_layers=remote_layers)
                # The next bakes read what this one stored, as every later build will.
                for name in wave:
                    entry = store.get(planned.stage(name).key)
                    if entry is None:
                        raise CacheError(f"the artifact of {name} was not stored; build "
                                         "again.")
                    contexts[name] = entry.context
        for name in contexts:
            if name in progress.stages and planned.stage(name).status == "cached":
                store.touch(planned.stage(name).key)
        _save_last_build(ws, planned, building)
        clock.lap("store")
        if remote is not None:
            push_entries(store, remote, [planned.stage(n).key for n in building])
            clock.lap("push")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    # A stage this run had to build is "built" even when BuildKit's own layer cache served
    # its steps; the others came from the artifact cache.
    results = tuple(
        StageResult(name=s.name, key=s.key,
                    state="built" if s.name in building else progress.stages[s.name].state,
                    seconds=round(progress.stages[s.name].seconds, 2),
                    steps_run=progress.stages[s.name].steps[0],
                    steps=progress.stages[s.name].steps[1])
        for s in planned.stages)
    result = BuildResult(target=planned.target, tag=tag, stages=results,
                         seconds=round(time.time() - started, 2), report=None,
                         image_digest=metadata.get("image", {}).get("containerimage.digest"))
    clock.lap("report")
    result = dataclasses.replace(result, phases=clock.phases)
    report = write_report(ws.cache_dir, planned, result)
    uptodate = None if options.builder or options.push else \
        _uptodate(ws, planned, store, result)
    return dataclasses.replace(result, report=report, uptodate=uptodate)


def _bake_wave(ws: Workspace, options: BuildOptions, store: ArtifactStore,
               planned: Plan, building: list[str], contexts: Mapping[str, str],
               env: Mapping[str, str], clock: Clock, progress: BuildProgress, workdir: Path,
               *, tag: str | None, later: set[str], remote_layers: str | None
               ) -> dict[str, Any]:
    """One bake: build `building` from `contexts`, store their artifacts and, with a `tag`,
    make the image. Returns BuildKit's metadata of the bake."""
    generator = ensure_sbom_generator() if options.push and tag is not None else None
    bake_wave = bakes.wave(ws, options, store, planned, building, contexts, workdir,
                           tag=tag, sbom_generator=generator,
                           remote_layers=remote_layers)
    images, artifact_dirs, token = bake_wave.images, bake_wave.artifact_dirs, bake_wave.token
    (workdir / "context").mkdir(parents=True)
    (workdir / "Dockerfile").write_text(bake_wave.dockerfile)
    argv = bake_wave.bake.write()
    clock.lap("render")
    try:
        bake.run_bake(argv, progress, env, cache=store.root,
                      push=tag if options.push else None, outputs=list(artifact_dirs.values()),
                      stages=[n for n in progress.stages if n not in later])
    finally:
        if token:
            cachemounts.drop(token, list(bake_wave.bake.engine))
    clock.lap("bake")
    clock.phases["export"] = round(progress.export_seconds, 3)
    metadata = read_object(bake_wave.bake.metadata_file) or {}
    _keep_artifacts(store, planned, building, artifact_dirs, progress)
    _keep_images(store, planned, images, metadata, progress)
    clock.lap("store")
    return metadata


def image_store(builder: str | None) -> ImageStore | None:
    """Where full-image artifacts live: the engine's image store, for the engine's own
    builder; a builder of another driver (docker-container, remote) has none."""
    if not builder:
        return ImageStore()
    return ImageStore(builder) if builder_args(builder)[0] == "--context" else None


def _keep_artifacts(store: ArtifactStore, planned: Plan, building: list[str],
                    artifact_dirs: Mapping[str, Path], progress: BuildProgress) -> None:
    for name in building:
        if name not in artifact_dirs:
            continue
        stage = planned.stage(name)
        store.add(key=stage.key, stage=name, inputs=stage.inputs, layout=artifact_dirs[name],
                  build_seconds=progress.stages[name].seconds)


def _keep_images(store: ArtifactStore, planned: Plan, images: Mapping[str, str],
                 metadata: Mapping[str, Any], progress: BuildProgress) -> None:
    """Record the full-image artifacts BuildKit named in the engine's image store."""
    if store.images is None or not images:
        return
    found = store.images.sizes(list(images.values()))
    for name, ref in images.items():
        digest = metadata.get(f"artifact-{name}", {}).get("containerimage.digest")
        image_id, size = found.get(ref, ("", 0))
        if not digest or image_id != digest:
            raise CacheError(f"BuildKit did not store the artifact of {name} as {ref} "
                             f"(image {image_id or 'missing'}, build said {digest}); build "
                             "again.")
        stage = planned.stage(name)
        store.add_image(key=stage.key, stage=name, inputs=stage.inputs, ref=ref,
                        digest=digest, size=size, build_seconds=progress.stages[name].seconds)


def _save_last_build(ws: Workspace, planned: Plan, building: list[str]) -> None:
    """What each stage was last built from, for `invoke explain`."""
    last = cachedir.last_builds(ws.cache_dir)
    last.mkdir(parents=True, exist_ok=True)
    for name in building:
        stage = planned.stage(name)
        record = {"key": stage.key, "inputs": dict(stage.inputs),
                  "deps": {d: planned.stage(d).key for d in stage.deps},
                  "recipe": stage.recipe}
        jsonfile.write_text(last / f"{name}.json", json.dumps(record, indent=2, sort_keys=True))

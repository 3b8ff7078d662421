"""Run a plan: build what no cache holds, in one BuildKit (bake) run, and keep the results.

Stages found in the local artifact store or the remote registry reach BuildKit as named
contexts (oci-layout:// or docker-image://); the rest build in one bake run that also
exports each newly built stage as an OCI layout, adopted into the store under its key.
Per-key locks make concurrent builds on one cache share work instead of repeating it.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from imageforge import log
from imageforge.buildkit import bakefail
from imageforge.buildkit.docker import LABEL_PREFIX, ensure_ready
from imageforge.buildkit.progress import BuildProgress, Mode, read_statuses
from imageforge.cache import remote as remote_mod
from imageforge.cache.artifacts import ArtifactStore
from imageforge.cache.keylock import locked_all
from imageforge.cache.remote import Remote
from imageforge.cmd import docker, docker_binary, popen, run
from imageforge.errors import (
    BuildError,
    CacheError,
    DockerError,
    FatalError,
    Interrupted,
    LockError,
)
from imageforge.jsonfile import read_object
from imageforge.model import extends
from imageforge.planning import localtree, project, rules
from imageforge.planning.dockerfile import CA_BUNDLE_SECRET
from imageforge.planning.execute import LayerCache, Run, bake_file, make_run, reused, to_build
from imageforge.planning.plan import Plan
from imageforge.sources.sources import Source, SourceCache


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildOptions:
    target: str
    tag: str | None = None
    push: bool = False
    builder: str | None = None
    progress: Mode = "auto"
    dry_run: bool = False
    # The CA bundle of a TLS-intercepting proxy, for build steps that download (a secret).
    ca_bundle: Path | None = None
    # The target's key a generated CI job was made for: any other key is refused unbuilt.
    expect_key: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageResult:
    name: str
    key: str
    state: str
    seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildResult:
    target: str
    tag: str
    stages: tuple[StageResult, ...]
    seconds: float
    report: Path | None
    image_digest: str | None = None

    @property
    def rebuilt(self) -> list[str]:
        return [s.name for s in self.stages if s.state == "built"]


def default_tag(planned: Plan) -> str:
    name = planned.manifest.image.get("name") or planned.target
    return f"imageforge/{name}:{planned.target}-{planned.key[7:19]}"


def project_revision() -> str:
    """The git revision of the imageforge checkout that renders the recipes."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = run(["git", "-C", str(root), "rev-parse", "HEAD"], text=True, timeout=10)
    except (FatalError, subprocess.TimeoutExpired):     # no git, or a hung file system
        return "unknown"
    return head.stdout.strip() if head.returncode == 0 else "unknown"


def image_metadata(settings: project.Settings, planned: Plan) -> tuple[dict[str, str], int | None]:
    """The labels of the final image and its SOURCE_DATE_EPOCH (from the lock)."""
    values = labels(planned)
    values[f"{LABEL_PREFIX}.revision"] = project_revision()
    values["org.opencontainers.image.revision"] = values[f"{LABEL_PREFIX}.revision"]
    current = project.current_lock(settings)
    epoch = None
    if current is not None:
        found, digest = current
        values[f"{LABEL_PREFIX}.lock-digest"] = digest
        epoch = found.source_date_epoch
    if epoch is not None:
        values["org.opencontainers.image.created"] = datetime.fromtimestamp(
            epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return values, epoch


def labels(planned: Plan) -> dict[str, str]:
    """OCI labels: what the image is made of. Never secrets: labels are public."""
    values = {
        "org.opencontainers.image.title": planned.target,
        f"{LABEL_PREFIX}.target": planned.target,
        f"{LABEL_PREFIX}.manifest": planned.manifest.path.name,
        f"{LABEL_PREFIX}.manifest-digest": planned.manifest.digest(),
        f"{LABEL_PREFIX}.base": str(planned.manifest.image["base"]),
    }
    for stage in planned.stages:
        values[f"{LABEL_PREFIX}.key.{stage.name}"] = stage.key
        if stage.inputs.get("version"):
            values[f"{LABEL_PREFIX}.version.{stage.name}"] = str(stage.inputs["version"])
    return values | rules.labels(planned.manifest, registry=planned.registry)


def build(settings: project.Settings, options: BuildOptions) -> BuildResult | None:
    store = project.artifact_store(settings)
    hosts = [remote_mod.check_repository(settings.remote).split("/", 1)[0]] \
        if settings.remote else []
    push_host = remote_mod.registry_host(options.tag) if options.push and options.tag else None
    if push_host:
        hosts.append(push_host)
    with remote_mod.credentials(hosts) as env:
        remote = Remote(repository=settings.remote, env=env) if settings.remote else None
        return _build(settings, options, store, remote, env)


def _build(settings: project.Settings, options: BuildOptions, store: ArtifactStore,
           remote: Remote | None, env: Mapping[str, str]) -> BuildResult | None:
    # A dry run contacts no upstream: a stale pin shows as unlocked in what it prints.
    planned = project.plan(settings, options.target, remote=remote,
                           resolve=not options.dry_run)
    for warning in planned.warnings():
        log.warning(warning)
    if options.expect_key and planned.key != options.expect_key:
        raise LockError(f"--expect-key: {options.target}'s key is {planned.key}, not "
                        f"{options.expect_key}: the manifest, its lock or the --set overrides "
                        "changed since the pipeline was generated; run `invoke ci.generate` "
                        "again.")
    if options.dry_run:
        _print_dry_run(settings, planned, options)
        return None
    if not options.builder and not options.push and not to_build(planned):
        unchanged = _unchanged(settings, planned, store, options.tag or default_tag(planned))
        if unchanged is not None:
            return unchanged
    ensure_ready(options.builder)
    engine = builder_args(options.builder)
    if engine[0] == "--context" or not options.builder:
        # A docker-container builder has no image store of its own to compare with.
        extends.require_same_image(planned.manifest, engine[1] if options.builder else None)
    for _ in range(5):
        building = to_build(planned)
        using = reused(planned, building)
        keys = [(store.lock_path(planned.stage(n).key), False, n) for n in building]
        keys += [(store.lock_path(planned.stage(n).key), True, n) for n in using
                 if planned.stage(n).status == "cached"]
        with locked_all(keys):
            # Another build may have stored (or pruned) keys while we waited.
            fresh = project.with_statuses(planned, store, remote)
            if to_build(fresh) != building or reused(fresh, building) != using:
                planned = fresh
                continue
            contexts = _reuse_contexts(store, remote, fresh, using)
            if contexts is None:
                planned = project.with_statuses(fresh, store, remote)
                continue
            return _execute(settings, options, store, remote, fresh, building, contexts,
                            env)
    raise CacheError("the artifact cache kept changing under this build (other builds or "
                     "prunes running); run it again.")


def _unchanged(settings: project.Settings, planned: Plan, store: ArtifactStore, tag: str
               ) -> BuildResult | None:
    """A build with nothing to do: every stage is cached and `tag` already is this plan's
    image, every label imageforge would give it equal (each stage's key, the manifest and
    lock digests, waivers, the imageforge revision). BuildKit is not called at all; None
    when the image is missing or differs in any label (it is then made again, from the
    cached stages), or the target's own entry is corrupt (it is rebuilt)."""
    wanted, _ = image_metadata(settings, planned)
    found = docker("image", "inspect", "--format", "{{.Id}} {{json .Config.Labels}}", tag,
                   timeout=30)
    if found.returncode != 0:
        return None
    image_id, _, raw = found.stdout.decode().strip().partition(" ")
    present = json.loads(raw or "null") or {}
    if any(present.get(label) != value for label, value in wanted.items()):
        return None
    # The daemon answered; a local base image replaced since the lock still stops the build.
    extends.require_same_image(planned.manifest)
    # As a build that reuses it would: the target's entry is re-hashed where it changed, and
    # a corrupt one is discarded and rebuilt, never kept.
    target = planned.stage(planned.target)
    if target.status == "cached" and store.verify(target.key) is None:
        return None
    for stage in planned.stages:
        if stage.status == "cached":
            store.touch(stage.key)
    results = tuple(StageResult(name=s.name, key=s.key,
                                state="remote" if s.status == "remote" else "cached",
                                seconds=0.0) for s in planned.stages)
    result = BuildResult(target=planned.target, tag=tag, stages=results, seconds=0.0,
                         report=None, image_digest=image_id)
    return dataclasses.replace(result, report=write_report(settings.cache_dir, planned, result))


def _reuse_contexts(store: ArtifactStore, remote: Remote | None, planned: Plan,
                    using: Sequence[str]) -> dict[str, str] | None:
    """Named contexts for cached stages; None when a local entry turned out corrupt (it is
    discarded, and the caller plans again)."""
    contexts: dict[str, str] = {}
    for name in using:
        stage = planned.stage(name)
        if stage.status == "remote":
            assert remote is not None
            contexts[name] = f"docker-image://{remote.ref(name, stage.key)}"
            continue
        entry = store.verify(stage.key)
        if entry is None:
            return None
        contexts[name] = entry.context
    return contexts


def _execute(settings: project.Settings, options: BuildOptions, store: ArtifactStore,
             remote: Remote | None, planned: Plan, building: list[str],
             contexts: dict[str, str], env: Mapping[str, str]) -> BuildResult:
    started = time.time()
    sources = [src for name in building for src in planned.stage(name).sources]
    contexts.update({name: str(path) for name, path in
                     project.source_cache(settings).materialize_all(sources).items()})
    for name in building:
        for context, (path, digest) in planned.stage(name).local_dirs.items():
            contexts[context] = str(localtree.snapshot(Path(path), digest,
                                                     settings.cache_dir / "sources" / "local"))
    scratch = store.scratch()
    try:
        run = make_run(planned, planned.registry, building, contexts)
        artifact_dirs = {name: scratch / name for name in building}
        tag = options.tag or default_tag(planned)
        workdir = scratch / "build"
        (workdir / "context").mkdir(parents=True)
        (workdir / "Dockerfile").write_text(run.dockerfile)
        image_labels, epoch = image_metadata(settings, planned)
        generator = ensure_sbom_generator() if options.push else None
        layers = LayerCache(location=_absolute_if_local(settings.layer_cache),
                            modes={n: planned.registry[n].layer_cache for n in building}) \
            if settings.layer_cache else None
        bake = bake_file(run, workdir=workdir, tag=tag, labels=image_labels,
                         platform=str(planned.manifest.image["platform"]), push=options.push,
                         artifact_dirs=artifact_dirs, source_date_epoch=epoch,
                         layer_cache=layers, sbom_generator=generator,
                         secrets=_secrets(options))
        (workdir / "bake.json").write_text(json.dumps(bake, indent=2))
        progress = BuildProgress([s.name for s in planned.stages], options.progress)
        for name in contexts:
            if name in progress.stages:
                progress.preset(name, "remote" if planned.stage(name).status == "remote"
                                else "cached")
        argv = [docker_binary(), *builder_args(options.builder), "bake", "-f",
                str(workdir / "bake.json"), "--progress", "rawjson", "--metadata-file",
                str(workdir / "metadata.json")]
        _run_bake(argv, progress, env, cache=store.root,
                  push=tag if options.push else None, outputs=list(artifact_dirs.values()))
        metadata = read_object(workdir / "metadata.json") or {}
        _keep_artifacts(store, planned, building, artifact_dirs, progress)
        for name in contexts:
            if name in progress.stages and planned.stage(name).status == "cached":
                store.touch(planned.stage(name).key)
        if remote is not None:
            push_entries(store, remote, [planned.stage(n).key for n in building])
        _save_last_build(settings, planned, building)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    # A stage this run had to build is "built" even when BuildKit's own layer cache served
    # its steps; the others came from the artifact cache.
    results = tuple(
        StageResult(name=s.name, key=s.key,
                    state="built" if s.name in building else progress.stages[s.name].state,
                    seconds=round(progress.stages[s.name].seconds, 2))
        for s in planned.stages)
    result = BuildResult(target=planned.target, tag=tag, stages=results,
                         seconds=round(time.time() - started, 2), report=None,
                         image_digest=metadata.get("image", {}).get("containerimage.digest"))
    report = write_report(settings.cache_dir, planned, result)
    return dataclasses.replace(result, report=report)


def _secrets(options: BuildOptions) -> dict[str, str]:
    return {CA_BUNDLE_SECRET: str(options.ca_bundle)} if options.ca_bundle else {}


SBOM_GENERATOR = "imageforge/sbom-scanner:1"


def ensure_sbom_generator() -> str:
    """The SBOM generator image BuildKit runs for pushed images: ours (sbom/, offline: it
    lists Debian packages and Python distributions as SPDX), built locally when absent."""
    if docker("image", "inspect", SBOM_GENERATOR).returncode != 0:
        context = Path(__file__).resolve().parents[2] / "sbom"
        result = docker("buildx", "build", "--load", "--tag", SBOM_GENERATOR, str(context),
                        timeout=600)
        if result.returncode != 0:
            last = result.stderr.decode(errors="replace").strip().splitlines()[-1:]
            raise BuildError(f"could not build the SBOM generator image {SBOM_GENERATOR}: "
                             f"{' '.join(last)}")
    return SBOM_GENERATOR


def builder_args(builder: str | None) -> list[str]:
    """`buildx` with the builder chosen: a Docker engine's own builder is reached through its
    docker context (buildx refuses `--builder` for those), any other with --builder."""
    if not builder:
        return ["buildx"]
    if docker("context", "inspect", builder).returncode == 0:
        return ["--context", builder, "buildx"]
    return ["buildx", "--builder", builder]


def _absolute_if_local(location: str) -> str:
    path = Path(location)
    return str(path.resolve()) if path.exists() or location.startswith((".", "/")) or \
        "/" not in location else location


BAKE_ATTEMPTS = 3


def _run_bake(argv: list[str], progress: BuildProgress, env: Mapping[str, str], *,
              cache: Path, push: str | None, outputs: Sequence[Path] = ()) -> None:
    """Run the bake, showing its progress. A bake that lost only containerd's blob-lock race
    runs again (its half-written `outputs` removed first); any other failure raises."""
    other: list[str] = []
    with progress:
        for attempt in range(1, BAKE_ATTEMPTS + 1):
            other.clear()
            code = _bake_once(argv, progress, env, other)
            if code == 0:
                progress.succeeded()
                return
            failed_stage = any(s.state == "failed" for s in progress.stages.values())
            if failed_stage or attempt == BAKE_ATTEMPTS or not bakefail.contended("\n".join(other)):
                break
            log.warning(f"BuildKit lost a race for a blob lock in containerd while exporting "
                        f"(attempt {attempt} of {BAKE_ATTEMPTS}); running the bake again, "
                        "every step is cached.")
            for output in outputs:
                shutil.rmtree(output, ignore_errors=True)
    failed = [s for s in progress.stages.values() if s.state == "failed"]
    # A stopped daemon, a full disk or a failing registry is not the recipe's fault.
    known = bakefail.explain("\n".join([*other, *(s.error or "" for s in failed)]),
                             cache=cache, push=push)
    if known is not None:
        raise known
    if failed:
        stage = failed[0]
        tail = "\n".join(f"    {line}" for line in list(stage.log)[-15:])
        raise BuildError(f"stage {stage.name} failed: {stage.error}\n{tail}")
    detail = "\n".join(f"    {line}" for line in other[-10:]) or "    (no output)"
    raise BuildError(f"docker buildx bake failed (exit {code}):\n{detail}")


def _bake_once(argv: list[str], progress: BuildProgress, env: Mapping[str, str],
               other: list[str]) -> int:
    with popen(argv, env=env, error=DockerError) as proc:
        assert proc.stderr is not None
        try:
            for status in read_statuses(proc.stderr, other):
                progress.feed(status)
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait(timeout=30)
            raise Interrupted("build interrupted; BuildKit stopped, nothing was stored or "
                              "tagged.") from None
        return proc.wait()


def _keep_artifacts(store: ArtifactStore, planned: Plan, building: list[str],
                    artifact_dirs: Mapping[str, Path], progress: BuildProgress) -> None:
    for name in building:
        stage = planned.stage(name)
        store.add(key=stage.key, stage=name, inputs=stage.inputs, layout=artifact_dirs[name],
                  build_seconds=progress.stages[name].seconds)


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
                          "contexts": {"artifact": f"docker-image://{remote.ref(stage, key)}"},
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


def _bake_quietly(store: ArtifactStore, bake: dict[str, Any], remote: Remote,
                  outputs: Sequence[Path] = ()) -> str | None:
    """Run a bake that moves artifacts; None when it worked, else BuildKit's reason. Like a
    build's bake, one that lost only containerd's blob-lock race runs again."""
    scratch = store.scratch()
    try:
        (scratch / "bake.json").write_text(json.dumps(bake))
        for attempt in range(1, BAKE_ATTEMPTS + 1):
            proc = run([docker_binary(), "buildx", "bake", "-f", str(scratch / "bake.json"),
                        "--progress", "quiet"], env=remote.env, timeout=3600, error=CacheError,
                       timed_out=f"moving artifacts to or from {remote.repository} took over "
                                 "an hour; check the registry and run again.")
            if proc.returncode == 0:
                return None
            output = proc.stderr.decode(errors="replace")
            if attempt == BAKE_ATTEMPTS or not bakefail.contended(output):
                break
            log.warning(f"BuildKit lost a race for a blob lock in containerd moving artifacts "
                        f"(attempt {attempt} of {BAKE_ATTEMPTS}); running it again.")
            for path in outputs:
                shutil.rmtree(path, ignore_errors=True)
        known = bakefail.explain(output, cache=store.root)
        if known is not None:
            raise known
        return bakefail.cause(output)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _save_last_build(settings: project.Settings, planned: Plan, building: list[str]) -> None:
    """What each stage was last built from, for `invoke explain`."""
    last = settings.cache_dir / "artifacts" / "last"
    last.mkdir(parents=True, exist_ok=True)
    for name in building:
        stage = planned.stage(name)
        record = {"key": stage.key, "inputs": dict(stage.inputs),
                  "deps": {d: planned.stage(d).key for d in stage.deps},
                  "recipe": stage.recipe}
        tmp = last / f".{name}.json.tmp"
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True))
        tmp.replace(last / f"{name}.json")


def _print_dry_run(settings: project.Settings, planned: Plan, options: BuildOptions) -> None:
    cache = project.source_cache(settings)
    building = to_build(planned)
    contexts = {src.name: str(_planned_path(cache, src))
                for name in building for src in planned.stage(name).sources}
    for name in reused(planned, building):
        contexts[name] = f"<{planned.stage(name).status} artifact {planned.stage(name).key[:19]}>"
    run: Run = make_run(planned, planned.registry, building, contexts)
    workdir = settings.cache_dir.resolve() / "build" / planned.target
    layers = LayerCache(location=_absolute_if_local(settings.layer_cache),
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


def write_report(cache_dir: Path, planned: Plan, result: BuildResult) -> Path:
    """cache/reports/<timestamp>-<target>.json: what was built, how, and how long it took."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    report = {
        "target": result.target,
        "manifest": project.manifest_label(planned.manifest.path),
        "manifest_digest": planned.manifest.digest(),
        "tag": result.tag,
        "image_digest": result.image_digest,
        "seconds": result.seconds,
        "stages": [dataclasses.asdict(s) for s in result.stages],
    }
    reports = cache_dir / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    path = reports / f"{stamp}-{result.target}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(path)
    return path


def markdown_summary(result: BuildResult) -> str:
    """The build as a Markdown table, e.g. for a CI job summary ($GITHUB_STEP_SUMMARY)."""
    rebuilt = ", ".join(result.rebuilt) or "nothing (every stage came from the cache)"
    lines = [f"### imageforge build: {result.target}", "",
             f"Image `{result.tag}`" + (f" `{result.image_digest}`" if result.image_digest else ""),
             f"in {result.seconds:.1f} s; rebuilt: {rebuilt}.", "",
             "| stage | result | seconds | key |", "|---|---|---:|---|"]
    lines += [f"| {s.name} | {s.state} | {s.seconds:.1f} | `{s.key[7:19]}` |"
              for s in result.stages]
    return "\n".join(lines) + "\n"


def summary(result: BuildResult) -> str:
    lines = [f"{'stage':<18} {'result':<8} {'seconds':>8}"]
    lines += [f"{s.name:<18} {s.state:<8} {s.seconds:>8.1f}" for s in result.stages]
    lines.append(f"image {result.tag}  ({result.seconds:.1f}s)")
    rebuilt = result.rebuilt
    lines.append(f"rebuilt: {', '.join(rebuilt)}" if rebuilt
                 else "nothing rebuilt: every stage came from the artifact cache")
    return "\n".join(lines)

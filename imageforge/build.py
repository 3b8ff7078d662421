"""Run a plan with BuildKit: fetch sources on the host, hand them over as named build
contexts, build every needed stage in one `docker buildx build`, report per stage."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from imageforge import project
from imageforge.cmd import docker_binary
from imageforge.docker import ensure_ready
from imageforge.errors import BuildError, Interrupted, LockError
from imageforge.plan import Plan
from imageforge.progress import BuildProgress, Mode, read_statuses
from imageforge.sources import Source, SourceCache

LABEL_PREFIX = "io.imageforge"


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildOptions:
    target: str
    tag: str | None = None
    push: bool = False
    builder: str | None = None
    progress: Mode = "auto"
    dry_run: bool = False


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

    @property
    def rebuilt(self) -> list[str]:
        return [s.name for s in self.stages if s.state == "built"]


def default_tag(planned: Plan) -> str:
    name = planned.manifest.image.get("name") or planned.target
    return f"imageforge/{name}:{planned.target}-{planned.key[7:19]}"


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
    return values


def buildx_argv(planned: Plan, options: BuildOptions, *, workdir: Path,
                contexts: Mapping[str, Path], tag: str) -> list[str]:
    argv = [docker_binary(), "buildx", "build"]
    if options.builder:
        argv += ["--builder", options.builder]
    argv += ["--file", str(workdir / "Dockerfile"), "--target", planned.target,
             "--progress", "rawjson", "--tag", tag,
             "--metadata-file", str(workdir / "metadata.json"),
             "--platform", str(planned.manifest.image["platform"])]
    for name, path in sorted(contexts.items()):
        argv += ["--build-context", f"{name}={path}"]
    for key, value in sorted(labels(planned).items()):
        argv += ["--label", f"{key}={value}"]
    argv.append("--push" if options.push else "--load")
    argv.append(str(workdir / "context"))
    return argv


def build(settings: project.Settings, options: BuildOptions) -> BuildResult | None:
    planned = project.plan(settings, options.target)
    workdir = (settings.cache_dir / "build" / options.target).resolve()
    dockerfile = project.dockerfile(planned)
    tag = options.tag or default_tag(planned)
    cache = project.source_cache(settings)
    if options.dry_run:
        contexts = {src.name: _planned_path(cache, src) for src in planned.sources()}
        print("+ " + shlex.join(buildx_argv(planned, options, workdir=workdir,
                                            contexts=contexts, tag=tag)))
        print(dockerfile, end="")
        return None
    ensure_ready(options.builder)
    contexts = cache.materialize_all(planned.sources())
    (workdir / "context").mkdir(parents=True, exist_ok=True)
    (workdir / "Dockerfile").write_text(dockerfile)
    argv = buildx_argv(planned, options, workdir=workdir, contexts=contexts, tag=tag)
    started = time.time()
    progress = BuildProgress([s.name for s in planned.stages], options.progress)
    _run_buildx(argv, progress)
    results = tuple(
        StageResult(name=s.name, key=s.key, state=progress.stages[s.name].state,
                    seconds=round(progress.stages[s.name].seconds, 2))
        for s in planned.stages)
    result = BuildResult(target=planned.target, tag=tag, stages=results,
                         seconds=round(time.time() - started, 2), report=None)
    report = write_report(settings.cache_dir, planned, result, workdir)
    return dataclasses.replace(result, report=report)


def _planned_path(cache: SourceCache, source: Source) -> Path:
    """Where a source's context will live; unlocked sources have no address yet."""
    try:
        return cache.path_for(source)
    except LockError:
        return Path(f"<unlocked: run invoke lock>/{source.name}")


def _run_buildx(argv: list[str], progress: BuildProgress) -> None:
    other: list[str] = []
    with progress, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE) as proc:
        assert proc.stderr is not None
        try:
            for status in read_statuses(proc.stderr, other):
                progress.feed(status)
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait(timeout=30)
            raise Interrupted("build interrupted; BuildKit stopped, nothing was tagged.") from None
        code = proc.wait()
    if code == 0:
        return
    failed = [s for s in progress.stages.values() if s.state == "failed"]
    if failed:
        stage = failed[0]
        tail = "\n".join(f"    {line}" for line in list(stage.log)[-15:])
        raise BuildError(f"stage {stage.name} failed: {stage.error}\n{tail}")
    detail = "\n".join(f"    {line}" for line in other[-10:]) or "    (no output)"
    raise BuildError(f"docker buildx build failed (exit {code}):\n{detail}")


def write_report(cache_dir: Path, planned: Plan, result: BuildResult, workdir: Path) -> Path:
    """cache/reports/<timestamp>-<target>.json: what was built, how, and how long it took."""
    metadata: dict[str, Any] = {}
    meta_path = workdir / "metadata.json"
    if meta_path.exists():
        metadata = json.loads(meta_path.read_text() or "{}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    report = {
        "target": result.target,
        "manifest": project.manifest_label(planned.manifest.path),
        "manifest_digest": planned.manifest.digest(),
        "tag": result.tag,
        "image_digest": metadata.get("containerimage.digest"),
        "image_config_digest": metadata.get("containerimage.config.digest"),
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


def summary(result: BuildResult) -> str:
    lines = [f"{'stage':<14} {'result':<8} {'seconds':>8}"]
    lines += [f"{s.name:<14} {s.state:<8} {s.seconds:>8.1f}" for s in result.stages]
    rebuilt = result.rebuilt
    lines.append(f"image {result.tag}  ({result.seconds:.1f}s)")
    lines.append(f"rebuilt: {', '.join(rebuilt)}" if rebuilt
                 else "nothing rebuilt: BuildKit had every stage cached")
    return "\n".join(lines)

"""One `docker buildx bake`: its description (Invocation: the bake file and the argv that runs
it, made once for build, verify, the registry transfer and the dry run), the run with its
progress shown, and the one retry policy: a bake that failed only in a way BuildKit gets past
on a second attempt (`bakefail.transient`) runs again."""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from imageforge import log
from imageforge.buildkit import bakefail
from imageforge.buildkit.progress import BuildProgress, read_statuses
from imageforge.cmd import docker, docker_binary, popen
from imageforge.errors import (
    BuildError,
    DockerError,
    Interrupted,
)

BAKE_ATTEMPTS = 3
T = TypeVar("T")
# Every bake runs with these. buildx would otherwise run seven git commands per target to
# put the remote URL and commit of the repository around the bake's context into the image's
# provenance. That context is imageforge's scratch directory in the cache, so the repository
# is whatever checkout holds the cache: a private address in an image that may be pushed
# anywhere, and a commit that says nothing of the build (the recipes' revision is labelled:
# io.imageforge.revision).
BAKE_ENV: Mapping[str, str] = {"BUILDX_GIT_INFO": "0"}


def builder_args(builder: str | None) -> list[str]:
    """`buildx` with the builder chosen: a Docker engine's own builder is reached through its
    docker context (buildx refuses `--builder` for those), any other with --builder."""
    if not builder:
        return ["buildx"]
    if docker("context", "inspect", builder).returncode == 0:
        return ["--context", builder, "buildx"]
    return ["buildx", "--builder", builder]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Invocation:
    """A bake as it runs: the bake file's content, the directory it is written to, the
    engine arguments (builder_args, or a docker context) and the progress mode; with
    `metadata`, BuildKit writes what it made to metadata.json there."""

    spec: Mapping[str, Any]
    workdir: Path
    engine: Sequence[str] = ("buildx",)
    progress: str = "rawjson"
    metadata: bool = False

    @property
    def file(self) -> Path:
        return self.workdir / "bake.json"

    @property
    def metadata_file(self) -> Path:
        return self.workdir / "metadata.json"

    def argv(self) -> list[str]:
        return [docker_binary(), *self.engine, "bake", "-f", str(self.file), "--progress",
                self.progress, *(["--metadata-file", str(self.metadata_file)]
                                 if self.metadata else [])]

    def command_line(self) -> str:
        """The bake as a shell runs it, BAKE_ENV included (the dry run prints it)."""
        return shlex.join([*(f"{k}={v}" for k, v in BAKE_ENV.items()), *self.argv()])

    def write(self) -> list[str]:
        """Write the bake file; the argv that runs it."""
        self.file.write_text(json.dumps(self.spec, indent=2))
        return self.argv()


def retried(once: Callable[[], T], transient: Callable[[T], str | None],
            outputs: Sequence[Path], doing: str) -> T:
    """`once()` again while it fails in a way another attempt gets past (`transient` gives the
    reason; None for a success or any other failure), at most BAKE_ATTEMPTS times, its
    half-written `outputs` removed in between; the last attempt's result."""
    for attempt in range(1, BAKE_ATTEMPTS):
        result = once()
        why = transient(result)
        if why is None:
            return result
        log.warning(f"{why} {doing} (attempt {attempt} of {BAKE_ATTEMPTS}); running it again, "
                    "every finished step is cached.")
        for output in outputs:
            shutil.rmtree(output, ignore_errors=True)
    return once()


def run_bake(argv: list[str], progress: BuildProgress, env: Mapping[str, str], *,
              cache: Path, push: str | None, outputs: Sequence[Path] = (),
              stages: Collection[str] | None = None) -> None:
    """Run the bake, showing its progress (the caller holds `progress` open, across every
    bake of one build); `stages` are the ones this bake builds (all when None). A bake that
    failed only in a way another attempt gets past runs again (its half-written `outputs`
    removed first); any other failure raises."""
    other: list[str] = []

    def once() -> int:
        other.clear()
        progress.forget_errors()
        return _bake_once(argv, progress, env, other)

    def transient(code: int) -> str | None:
        if code == 0:
            return None
        # BuildKit attaches a lost cache record to the step that read it, so a stage can fail
        # for a reason another attempt gets past.
        failed = [s.error or "" for s in progress.stages.values() if s.state == "failed"]
        return bakefail.transient("\n".join(other), failed)

    code = retried(once, transient, outputs, "in the bake")
    if code == 0:
        progress.succeeded(stages)
        return
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
    with popen(argv, env={**env, **BAKE_ENV}, error=DockerError) as proc:
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


def absolute_if_local(location: str) -> str:
    """A layer cache location as BuildKit needs it: a local directory made absolute, a
    registry repository left as it is."""
    path = Path(location)
    return str(path.resolve()) if path.exists() or location.startswith((".", "/")) or \
        "/" not in location else location

"""Running `docker buildx bake` with its progress shown, and running it again after the
failures BuildKit gets past on a second attempt (`bakefail.transient`)."""

from __future__ import annotations

import shutil
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from imageforge import log
from imageforge.buildkit import bakefail
from imageforge.buildkit.progress import BuildProgress, read_statuses
from imageforge.cmd import popen
from imageforge.errors import (
    BuildError,
    DockerError,
    Interrupted,
)

BAKE_ATTEMPTS = 3


def run_bake(argv: list[str], progress: BuildProgress, env: Mapping[str, str], *,
              cache: Path, push: str | None, outputs: Sequence[Path] = (),
              stages: Collection[str] | None = None) -> None:
    """Run the bake, showing its progress (the caller holds `progress` open, across every
    bake of one build); `stages` are the ones this bake builds (all when None). A bake that
    failed only in a way another attempt gets past runs again (its half-written `outputs`
    removed first); any other failure raises."""
    other: list[str] = []
    for attempt in range(1, BAKE_ATTEMPTS + 1):
        other.clear()
        code = _bake_once(argv, progress, env, other)
        if code == 0:
            progress.succeeded(stages)
            return
        failed_stage = any(s.state == "failed" for s in progress.stages.values())
        why = None if failed_stage else bakefail.transient("\n".join(other))
        if why is None or attempt == BAKE_ATTEMPTS:
            break
        log.warning(f"{why} (attempt {attempt} of {BAKE_ATTEMPTS}); running the bake again, "
                    "every finished step is cached.")
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


def absolute_if_local(location: str) -> str:
    """A layer cache location as BuildKit needs it: a local directory made absolute, a
    registry repository left as it is."""
    path = Path(location)
    return str(path.resolve()) if path.exists() or location.startswith((".", "/")) or \
        "/" not in location else location

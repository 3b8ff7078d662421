"""`invoke test-image`: every stage's smoke checks, run inside the built image.

All checks of an image run in ONE container (one start, not one per check): a generated bash
script runs each check in its own bash under a time limit, between marker lines that carry
its exit code and duration. Checks that need a GPU or an EFA device run only with
`hardware=True` (on a real instance); otherwise they are skipped with the reason
"needs hardware", never counted as passed.
"""

from __future__ import annotations

import dataclasses
import itertools
import shlex
import subprocess
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from imageforge.cmd import docker, docker_binary, run
from imageforge.docker import ensure_ready, image_digest
from imageforge.errors import DockerError, ImageCheckError
from imageforge.model.manifest import manifest_label
from imageforge.model.stage import Check, Context, Needs, Stage
from imageforge.planning.plan import Plan

Result = Literal["ok", "fail", "skipped"]
NEEDS_HARDWARE = "needs hardware"
# Seconds one check may run: a hung check fails on its own instead of hanging the run.
CHECK_TIMEOUT = 300

# Runs one check: `run_check INDEX SCRIPT`. Output goes between "<marker> begin INDEX" and
# "<marker> end INDEX EXIT_CODE NANOSECONDS"; the newline before "end" keeps the marker at the
# start of a line when the check's output does not end with one. stdin is /dev/null so no
# check can read the rest of this script (it arrives on the container's stdin).
RUNNER = r"""run_check() {
    local start rc
    printf '%s begin %s\n' "$marker" "$1"
    start=$(date +%s%N)
    timeout -k 5 "$limit" bash -c "$2" </dev/null 2>&1
    rc=$?
    printf '\n%s end %s %s %s\n' "$marker" "$1" "$rc" "$(( $(date +%s%N) - start ))"
}
"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannedCheck:
    stage: str
    check: Check


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckResult:
    stage: str
    name: str
    needs: Needs
    result: Result
    seconds: float
    output: str
    exit_code: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckRun:
    """One `test-image` run of one image."""

    image: str
    digest: str
    target: str
    manifest: str
    hardware: bool
    started: str
    seconds: float
    results: tuple[CheckResult, ...]

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.result == "fail"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """What the script reported for one check; exit_code None: it began but never ended."""

    exit_code: int | None
    seconds: float
    output: str


def image_checks(planned: Plan) -> list[PlannedCheck]:
    """Every check of the plan's stages, in build order, each stage's environment first."""
    found = []
    for planned_stage in planned.stages:
        stage = planned.registry[planned_stage.name]
        env = environment_check(stage, planned.context)
        checks = [*([env] if env else []), *stage.checks(planned.context)]
        found += [PlannedCheck(stage=stage.name, check=c) for c in checks]
    return found


def environment_check(stage: Stage, ctx: Context) -> Check | None:
    """The variables a stage declares, as the image config sets them: the container starts
    with exactly that environment. Path entries need only be present, in any position."""
    plain, paths = stage.env(ctx), stage.env_paths(ctx)
    if not plain and not paths:
        return None
    lines = ["fail=0"]
    lines += [_equals(var, value) for var, value in sorted(plain.items())]
    lines += [_contains(var, entry) for var, entries in sorted(paths.items())
              for entry in entries]
    lines.append('[ "$fail" = 0 ] && echo "as declared"')
    return Check(name="environment: " + ", ".join(sorted({*plain, *paths})),
                 script="\n".join(lines))


def _equals(var: str, value: str) -> str:
    want = shlex.quote(value)
    return (f'[ "${{{var}-}}" = {want} ] || '
            f'{{ printf "%s=%s, want %s\\n" {var} "${{{var}-(unset)}}" {want}; fail=1; }}')


def _contains(var: str, entry: str) -> str:
    found = shlex.quote(entry)
    return (f'case ":${{{var}-}}:" in *:{found}:*) ;; *) '
            f'printf "%s lacks %s: %s\\n" {var} {found} "${{{var}-(unset)}}"; fail=1;; esac')


def script(checks: Sequence[Check], *, marker: str, timeout: int = CHECK_TIMEOUT) -> str:
    """The bash script that runs `checks` in order inside the image."""
    lines = [f"marker={shlex.quote(marker)} limit={timeout}", RUNNER]
    lines += [f"run_check {i} {shlex.quote(c.script)}" for i, c in enumerate(checks)]
    return "\n".join(lines) + "\n"


def parse(stdout: str, *, marker: str) -> dict[int, Outcome]:
    """Each check's outcome by index, from the script's output."""
    outcomes: dict[int, Outcome] = {}
    current: int | None = None
    lines: list[str] = []
    for line in stdout.split("\n"):
        words = line.split()
        if words[:1] == [marker] and len(words) >= 3:
            if words[1] == "begin":
                current, lines = int(words[2]), []
            elif words[1] == "end" and len(words) == 5 and current == int(words[2]):
                outcomes[current] = Outcome(exit_code=int(words[3]),
                                            seconds=round(int(words[4]) / 1e9, 3),
                                            output="\n".join(lines).strip())
                current = None
            continue
        lines.append(line)
    if current is not None:
        outcomes[current] = Outcome(exit_code=None, seconds=0.0, output="\n".join(lines).strip())
    return outcomes


def hardware_args(dev: Path = Path("/dev")) -> list[str]:
    """`docker run` flags that hand this host's GPUs and EFA devices to the container."""
    args = ["--gpus", "all"] if (dev / "nvidiactl").exists() else []
    efa = sorted((dev / "infiniband").glob("uverbs*"))
    args += [f"--device={path}" for path in efa]
    # libfabric's EFA provider pins registered memory; Docker's default limit is 8 MiB.
    return [*args, "--ulimit", "memlock=-1:-1"] if efa else args


def run_checks(image: str, checks: Sequence[PlannedCheck], *,
               hardware: bool = False) -> list[CheckResult]:
    """Run `checks` in one container of `image`; hardware checks only when `hardware`."""
    runs = [hardware or c.check.needs == "none" for c in checks]
    outcomes, trouble = _run_script(image, [c.check for c, r in zip(checks, runs, strict=True)
                                            if r], hardware=hardware)
    position = itertools.count()
    return [result_of(c, outcomes.get(next(position)), trouble) if r else
            CheckResult(stage=c.stage, name=c.check.name, needs=c.check.needs,
                        result="skipped", seconds=0.0, output=NEEDS_HARDWARE)
            for c, r in zip(checks, runs, strict=True)]


def result_of(planned: PlannedCheck, outcome: Outcome | None, trouble: str) -> CheckResult:
    """A check's result; one that never finished failed, with what stopped the container."""
    check = planned.check
    if outcome is None or outcome.exit_code is None:
        output = "\n".join(filter(None, [outcome.output if outcome else "",
                                         f"check did not finish: {trouble}"]))
        return CheckResult(stage=planned.stage, name=check.name, needs=check.needs,
                           result="fail", seconds=0.0, output=output)
    output = outcome.output
    if outcome.exit_code in (124, 137):
        output += f"\n(exit {outcome.exit_code}: stopped after the {CHECK_TIMEOUT}s limit)"
    return CheckResult(stage=planned.stage, name=check.name, needs=check.needs,
                       result="ok" if outcome.exit_code == 0 else "fail",
                       seconds=outcome.seconds, output=output.strip(),
                       exit_code=outcome.exit_code)


def _run_script(image: str, checks: Sequence[Check], *,
                hardware: bool) -> tuple[dict[int, Outcome], str]:
    """Outcomes by index, and how the container ended (for checks that did not finish)."""
    if not checks:
        return {}, ""
    marker = f"@@imageforge-{uuid.uuid4().hex}"
    name = f"imageforge-test-{uuid.uuid4().hex[:12]}"
    argv = [docker_binary(), "run", "--rm", "-i", "--name", name, "--network", "none",
            *(hardware_args() if hardware else []), "--entrypoint", "bash", image, "-s"]
    limit = CHECK_TIMEOUT * len(checks) + 60
    try:
        proc = run(argv, input=script(checks, marker=marker).encode(), timeout=limit)
    except subprocess.TimeoutExpired:
        docker("rm", "-f", name)
        raise ImageCheckError(f"the checks in {image} did not finish within {limit}s; "
                              "the container was removed.") from None
    stdout = proc.stdout.decode(errors="replace")
    stderr = proc.stderr.decode(errors="replace").strip()
    if proc.returncode != 0 and marker not in stdout:
        raise DockerError(f"docker run {image} failed (exit {proc.returncode}): "
                          f"{stderr.splitlines()[-1] if stderr else 'no output'}")
    trouble = f"the container exited with {proc.returncode}" + (f": {stderr}" if stderr else "")
    return parse(stdout, marker=marker), trouble


def run_image_tests(planned: Plan, image: str, *, hardware: bool = False) -> CheckRun:
    """Every check of `planned` in the local image `image`."""
    ensure_ready()
    digest = image_digest(image)
    started = datetime.now(UTC)
    clock = time.monotonic()
    results = run_checks(image, image_checks(planned), hardware=hardware)
    return CheckRun(image=image, digest=digest, target=planned.target,
                    manifest=manifest_label(planned.manifest.path), hardware=hardware,
                    started=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    seconds=round(time.monotonic() - clock, 2), results=tuple(results))


def require_passed(run: CheckRun) -> None:
    """Raise naming every failed check and its last line of output."""
    if not run.failed:
        return
    named = "; ".join(f"{r.stage}: {r.name} ({_last_line(r.output)})" for r in run.failed)
    raise ImageCheckError(f"{len(run.failed)} of {len(run.results)} checks failed in "
                          f"{run.image}: {named}.")


def _last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"

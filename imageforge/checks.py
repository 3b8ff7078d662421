"""`invoke test-image`: each stage's smoke checks, run inside the built image."""

from __future__ import annotations

import dataclasses

from imageforge.cmd import docker
from imageforge.errors import ImageCheckError
from imageforge.plan import Plan
from stages import STAGES


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckResult:
    stage: str
    name: str
    ok: bool
    output: str


def run_checks(planned: Plan, image: str) -> list[CheckResult]:
    results = []
    for stage in planned.stages:
        for check in STAGES[stage.name].checks(planned.context):
            proc = docker("run", "--rm", "--entrypoint", "bash", image, "-c", check.script,
                          timeout=300)
            output = (proc.stdout + proc.stderr).decode(errors="replace").strip()
            results.append(CheckResult(stage=stage.name, name=check.name,
                                       ok=proc.returncode == 0, output=output))
    return results


def require_passed(results: list[CheckResult], image: str) -> None:
    failed = [r for r in results if not r.ok]
    if failed:
        first = failed[0]
        last = first.output.splitlines()[-5:]
        raise ImageCheckError(
            f"{len(failed)} smoke check(s) failed in {image}; first: {first.stage}: "
            f"{first.name}: " + " | ".join(last))

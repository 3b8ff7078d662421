"""Every stage a build run's Dockerfile reads is in it or handed to BuildKit as a context,
whatever subset of the plan is rebuilt. A stage that copies a dependency's dependency
(torchvision copies nccl, which only pytorch depends on) once reached BuildKit as a bare name,
which it looked up on Docker Hub: a CI job building torchvision alone failed that way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.planning.execute import is_external, make_run, reused
from imageforge.planning.plan import Plan
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"^FROM\s+(\S+)|--from=(\S+)", re.MULTILINE)
DEFINED = re.compile(r"^FROM\s+\S+\s+AS\s+(\S+)", re.MULTILINE)


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    settings = Workspace(registry=STAGES, manifest=ROOT / "manifests/sample.toml",
                                cache_dir=tmp_path_factory.mktemp("cache"))
    return project.plan(settings, "smddp")


def unresolved(plan: Plan, building: list[str]) -> set[str]:
    using = reused(plan, building)
    run = make_run(plan, plan.registry, building, {n: f"oci-layout:///x/{n}" for n in using})
    defined = set(DEFINED.findall(run.dockerfile))
    names = {s.name for s in plan.stages}
    read = {a or b for a, b in NAMED.findall(run.dockerfile)} & names
    return read - defined - set(run.contexts)


def test_torchvision_alone_gets_the_nccl_it_copies(plan: Plan) -> None:
    assert "nccl" not in plan.stage("torchvision").deps
    assert "nccl" in reused(plan, ["torchvision"])
    assert unresolved(plan, ["torchvision"]) == set()


def test_any_single_stage_rebuilt_reads_only_what_the_run_provides(plan: Plan) -> None:
    for stage in plan.stages:
        if not is_external(stage):
            assert unresolved(plan, [stage.name]) == set(), stage.name


def test_a_rebuilt_stage_and_its_dependents_read_only_what_the_run_provides(
        plan: Plan) -> None:
    order = [s.name for s in plan.stages if not is_external(s)]
    for index, name in enumerate(order):
        dependents = [name] + [n for n in order[index + 1:]
                               if set(plan.stage(n).deps) & {name}]
        assert unresolved(plan, dependents) == set(), dependents

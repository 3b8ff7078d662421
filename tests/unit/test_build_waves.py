"""An image stage is built in a bake of its own, after the stages it reads, so its gathering
steps read stored artifacts in a cold build just as in a build that changes only its pin;
and each stage's report says how many of its BuildKit steps ran."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

from imageforge.buildkit.buildreport import markdown_summary, summary
from imageforge.buildkit.progress import BuildProgress, read_statuses
from imageforge.buildkit.results import BuildResult, StageResult
from imageforge.planning.execute import FINAL, bake_file, make_run, waves
from imageforge.planning.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def test_a_cold_build_bakes_the_image_stage_after_everything_it_reads(sample_plan: Plan) -> None:
    building = [s.name for s in sample_plan.stages if s.name != "base"]
    parts = waves(sample_plan, building)
    assert parts == [[n for n in building if n != "smddp"], ["smddp"]]


def test_only_what_is_built_splits_the_bakes(sample_plan: Plan) -> None:
    # A pin of the image stage alone: one bake, everything else is read from the store.
    assert waves(sample_plan, ["smddp"]) == [["smddp"]]
    # Non-image stages that read each other share a bake: BuildKit runs them side by side.
    assert waves(sample_plan, ["python", "pytorch", "torchvision"]) == [
        ["python", "pytorch", "torchvision"]]
    assert waves(sample_plan, ["boost", "smddp"]) == [["boost"], ["smddp"]]
    assert waves(sample_plan, []) == []


def test_a_stage_target_built_now_gets_its_image_from_the_stored_artifact(
        sample_plan: Plan) -> None:
    # nccl is not an image: its image is its artifact, made by a last bake that reads what
    # the first stored, as a build that finds nccl cached makes it.
    nccl = dataclasses.replace(sample_plan, target="nccl")
    assert waves(nccl, ["efa", "nccl"]) == [["efa", "nccl"], []]
    assert waves(nccl, []) == []
    # An image stage's artifact is the whole image: the bake that builds it also tags it.
    assert waves(sample_plan, ["smddp"])[-1] == ["smddp"]


def test_an_early_bake_makes_no_image(sample_plan: Plan, tmp_path: Path) -> None:
    building = ["efa", "nccl"]
    early = make_run(sample_plan, sample_plan.registry, building, {}, final=False)
    assert f"AS {FINAL}" not in early.dockerfile
    assert "AS smddp" not in early.dockerfile
    spec = bake_file(early, workdir=tmp_path, tag=None, labels={"a": "b"},
                     platform="linux/amd64", push=False,
                     artifact_dirs={"nccl": tmp_path / "nccl", "efa": tmp_path / "efa"})
    assert sorted(spec["target"]) == ["artifact-efa", "artifact-nccl"]
    assert spec["group"]["default"]["targets"] == ["artifact-efa", "artifact-nccl"]

    last = make_run(sample_plan, sample_plan.registry, ["smddp"], {}, final=True)
    assert f"FROM smddp AS {FINAL}" in last.dockerfile
    spec = bake_file(last, workdir=tmp_path, tag="t:1", labels={"a": "b"},
                     platform="linux/amd64", push=False,
                     artifact_dirs={"smddp": tmp_path / "smddp"})
    assert spec["target"]["image"]["tags"] == ["t:1"]


def replay(stages: list[str]) -> BuildProgress:
    """The rawjson of a real bake: smddp's pin changed after a cold build, and BuildKit
    served every gathering step of the stage from its layer cache."""
    progress = BuildProgress(stages, "plain", io.StringIO())
    with progress, (DATA / "rawjson-image-stage.json").open("rb") as stream:
        for status in read_statuses(stream, []):
            progress.feed(status)
    return progress


def test_steps_run_count_each_step_once_across_bake_targets() -> None:
    progress = replay(["efa", "smddp"])
    progress.succeeded()
    # Eleven steps, reported by two bake targets (the artifact and the image); only the pip
    # install of the new wheel ran.
    assert progress.stages["smddp"].steps == (1, 11)
    assert progress.stages["smddp"].state == "built"
    # efa is a context here: BuildKit ran no step of it.
    assert progress.stages["efa"].steps == (0, 0)


def states(progress: BuildProgress) -> dict[str, str]:
    return {name: stage.state for name, stage in progress.stages.items()}


def test_a_bake_settles_only_its_own_stages() -> None:
    progress = replay(["efa", "smddp", "later"])
    progress.succeeded(["efa", "smddp"])
    assert states(progress) == {"efa": "cached", "smddp": "built", "later": "waiting"}
    progress.succeeded()
    assert states(progress)["later"] == "cached"


def test_summaries_show_the_steps_that_ran() -> None:
    result = BuildResult(target="smddp", tag="t:1", seconds=3.0, report=None, image_digest=None,
                         stages=(StageResult(name="efa", key="sha256:" + "a" * 64,
                                             state="cached", seconds=0.0),
                                 StageResult(name="smddp", key="sha256:" + "b" * 64,
                                             state="built", seconds=1.1, steps_run=1,
                                             steps=11)))
    lines = summary(result).splitlines()
    assert lines[0].split() == ["stage", "result", "seconds", "steps", "run"]
    assert lines[1].split() == ["efa", "cached", "0.0", "-"]
    assert lines[2].split() == ["smddp", "built", "1.1", "1", "of", "11"]
    assert "| smddp | built | 1.1 | 1 of 11 | `bbbbbbbbbbbb` |" in markdown_summary(result)

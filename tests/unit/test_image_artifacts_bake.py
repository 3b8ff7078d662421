"""Which artifacts a build names in the engine's image store, the bake outputs that do it,
and where a build's time goes (Clock, BuildKit's export share)."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import pytest

from imageforge.app.bakes import remote_layer_cache
from imageforge.app.workspace import Workspace
from imageforge.buildkit.progress import BuildProgress
from imageforge.buildkit.results import BuildResult, Clock, StageResult, as_noop
from imageforge.cache.artifacts import ArtifactStore
from imageforge.cache.remote import Remote, warn_unavailable
from imageforge.planning.execute import bake_file, image_layer_cache, make_run, whole_images
from imageforge.planning.plan import Plan

ROOT = Path(__file__).resolve().parents[2]


def test_whole_images_are_those_built_from_and_the_image(sample_plan: Plan) -> None:
    building = [s.name for s in sample_plan.stages if s.name != "base"]
    # efa and python are built FROM by others; smddp is the image.
    assert sorted(whole_images(sample_plan, building)) == ["efa", "python", "smddp"]
    assert whole_images(sample_plan, ["nccl", "boost"]) == []


def test_each_store_names_its_artifacts_apart(tmp_path: Path) -> None:
    one, two = ArtifactStore(tmp_path / "a"), ArtifactStore(tmp_path / "b")
    key = "sha256:" + "c" * 64
    assert one.image_ref("efa", key) == f"imageforge-artifact/{one.namespace}/efa:{'c' * 64}"
    assert one.namespace != two.namespace
    assert ArtifactStore(tmp_path / "a" / ".." / "a").namespace == one.namespace


def test_image_artifacts_go_to_the_image_store_and_the_others_to_layouts(
        sample_plan: Plan, tmp_path: Path) -> None:
    building = ["efa", "nccl", "smddp"]
    run = make_run(sample_plan, sample_plan.registry, building, {})
    named = {n: f"imageforge-artifact/x/{n}:1" for n in whole_images(sample_plan, building)}
    bake = bake_file(run, workdir=tmp_path, tag="t", labels={}, platform="linux/amd64",
                     push=False, artifact_dirs={"nccl": tmp_path / "nccl"},
                     artifact_images=named)
    targets = bake["target"]
    # Kept in this engine only: written uncompressed (no seconds per GB of gzip).
    assert targets["artifact-efa"]["output"] == [
        f"type=image,name={named['efa']},compression=uncompressed"]
    assert targets["artifact-efa"]["target"] == "efa"
    assert targets["artifact-efa"]["attest"] == ["type=provenance,disabled=true"]
    assert targets["artifact-smddp"]["output"] == [
        f"type=image,name={named['smddp']},compression=uncompressed"]
    # nccl's exports clamped their file times in a step of their own (artifact.exports_block).
    assert targets["artifact-nccl"]["output"] == [
        f"type=oci,dest={tmp_path / 'nccl'},tar=false,compression=uncompressed"]
    assert "attest" not in targets["artifact-nccl"]
    assert targets["image"]["output"] == ["type=docker,compression=uncompressed"]
    pushed = bake_file(run, workdir=tmp_path, tag="t", labels={}, platform="linux/amd64",
                       push=True, artifact_dirs={"nccl": tmp_path / "nccl"},
                       artifact_images=named)
    assert pushed["target"]["image"]["output"] == ["type=registry"]
    assert bake["group"]["default"]["targets"] == ["image", "artifact-efa", "artifact-nccl",
                                                   "artifact-smddp"]


def test_a_clock_adds_each_lap_to_its_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    now = iter([10.0, 10.5, 12.0, 12.25, 13.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(now))
    clock = Clock()
    clock.lap("sample_plan")
    clock.lap("bake")
    clock.lap("sample_plan")
    clock.lap("store")
    assert clock.phases == {"sample_plan": 0.75, "bake": 1.5, "store": 0.75}


def status(digest: str, name: str, started: str | None, completed: str | None
           ) -> dict[str, object]:
    vertex: dict[str, object] = {"digest": digest, "name": name}
    if started:
        vertex["started"] = f"2026-12-02T10:00:{started}Z"
    if completed:
        vertex["completed"] = f"2026-12-02T10:00:{completed}Z"
    return {"vertexes": [vertex]}


def test_export_time_is_the_wall_time_any_export_ran(tmp_path: Path) -> None:
    with (tmp_path / "out").open("w") as out:
        progress = BuildProgress(["efa"], "plain", out=out)
        progress.feed(status("a", "[image] exporting to image", "01.000", None))
        progress.feed(status("a", "[image] exporting to image", None, "04.000"))
        # Overlapping the first: counted once.
        progress.feed(status("b", "[artifact-efa] exporting to image", "03.000", "05.000"))
        # Later, apart.
        progress.feed(status("c", "exporting layers", "08.000", "08.500"))
        # Not started yet, or a build step: not export.
        progress.feed(status("d", "exporting cache", None, None))
        progress.feed(status("e", "[efa 1/2] RUN make", "00.000", "09.000"))
        assert progress.export_seconds == pytest.approx(4.5)
        assert progress.stages["efa"].seconds == pytest.approx(9.0)


def test_the_noop_of_a_build_is_every_stage_cached_in_no_time() -> None:
    result = BuildResult(target="smddp", tag="t", seconds=12.0, report=Path("r"),
                         image_digest="sha256:1", phases={"bake": 10.0},
                         stages=(StageResult(name="efa", key="k1", state="built", seconds=3.0),
                                 StageResult(name="nccl", key="k2", state="cached",
                                             seconds=0.0)))
    noop = as_noop(result)
    assert [(s.name, s.key, s.state, s.seconds) for s in noop.stages] == [
        ("efa", "k1", "cached", 0.0), ("nccl", "k2", "cached", 0.0)]
    assert (noop.seconds, noop.report, noop.phases, noop.image_digest) == (0.0, None, {},
                                                                           "sha256:1")
    assert noop.rebuilt == []


def test_image_stages_keep_their_layer_cache_beside_their_artifacts(
        sample_plan: Plan, tmp_path: Path) -> None:
    """With a remote cache, a bake that builds an image stage reads and writes BuildKit's
    cache of that stage's own steps in the stage's repository there: uncompressed (the
    artifact's blobs), and never failing the build. Other stages get none."""
    remote = "registry.example:5000/team/cache"
    building = ["nccl", "smddp"]
    layers = image_layer_cache(sample_plan, building, remote)
    assert layers is not None
    run = make_run(sample_plan, sample_plan.registry, building, {})
    bake = bake_file(run, workdir=tmp_path, tag="t", labels={}, platform="linux/amd64",
                     push=False, artifact_dirs={"nccl": tmp_path / "nccl"},
                     artifact_images={"smddp": "imageforge-artifact/x/smddp:1"},
                     layer_cache=layers)
    targets = bake["target"]
    ref = f"{remote}/smddp:{layers.tags['smddp']}"
    assert re.fullmatch(r"buildcache-[0-9a-f]{16}", layers.tags["smddp"])
    assert targets["layer-cache-smddp"]["cache-to"] == [
        f"type=registry,ref={ref},mode=min,compression=uncompressed,ignore-error=true"]
    assert targets["layer-cache-smddp"]["target"] == "smddp"
    assert targets["layer-cache-smddp"]["output"] == ["type=cacheonly"]
    assert "layer-cache-nccl" not in targets
    for name in ("image", "artifact-smddp", "artifact-nccl", "layer-cache-smddp"):
        assert targets[name]["cache-from"] == [f"type=registry,ref={ref}"]
    # A bake of builder stages alone has nothing to cache there.
    assert image_layer_cache(sample_plan, ["nccl", "boost"], remote) is None


def test_an_image_layer_cache_is_tagged_by_what_it_gathers_not_its_own_pin(
        sample_plan: Plan) -> None:
    """A new SMDDP wheel finds the cache the cold build wrote; a boost bump (another
    gathering) writes one of its own instead of replacing it."""
    def tag(plan: Plan) -> str:
        layers = image_layer_cache(plan, ["smddp"], "registry.example:5000/cache")
        assert layers is not None
        return layers.tags["smddp"]

    def with_key(plan: Plan, stage: str, key: str) -> Plan:
        return dataclasses.replace(plan, stages=tuple(
            dataclasses.replace(s, key=key) if s.name == stage else s for s in plan.stages))

    assert tag(with_key(sample_plan, "smddp", "sha256:" + "1" * 64)) == tag(sample_plan)
    assert tag(with_key(sample_plan, "boost", "sha256:" + "2" * 64)) != tag(sample_plan)
    assert tag(with_key(sample_plan, "efa", "sha256:" + "3" * 64)) != tag(sample_plan)


def test_the_remote_keeps_layers_only_while_it_answers_and_trust_allows(tmp_path: Path) -> None:
    ws = Workspace(registry={}, cache_dir=tmp_path, remote="registry.example:5000/cache")
    assert remote_layer_cache(dataclasses.replace(ws, remote=None)) is None
    assert remote_layer_cache(ws) == "registry.example:5000/cache"
    # cache_trust = "verified" reads only artifacts a rebuild verified.
    assert remote_layer_cache(dataclasses.replace(ws, trust_verified=True)) is None
    # Once the registry did not answer, the build asks it nothing more.
    remote = Remote(repository="registry.example:5000/cache")
    warn_unavailable(remote, "connection refused")
    assert remote_layer_cache(ws, answered=not remote.unreachable) is None

"""The plan's smaller promises (imageforge/planning/plan.py, imageforge/model/stage.py): the JSON
shape of a plan, statuses by key, which inputs a key covers, what a stage without a table gets,
which targets a manifest defines, and the file name a URL is saved under."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from imageforge.errors import LockError, ManifestError
from imageforge.model import extends
from imageforge.model.inputs import defined_targets, stage_inputs
from imageforge.model.manifest import load
from imageforge.model.stage import Field, Stage, filename_of, git_fields, keyed_inputs, url_fields
from imageforge.planning.plan import make_plan, stage_key
from stages import STAGES
from tests.unit.conftest import ROOT

SMDDP = ROOT / "manifests/smddp.toml"
EFA_NCCL = ROOT / "manifests/efa-nccl.toml"


def test_plan_json_lists_every_stage_with_deps_key_status_and_inputs() -> None:
    manifest = load(EFA_NCCL, registry=STAGES)
    plan = make_plan(manifest, "efa-nccl", STAGES)
    data = plan.to_json("manifests/efa-nccl.toml")
    assert list(data) == ["target", "manifest", "stages"]
    assert data["target"] == "efa-nccl"
    assert data["manifest"] == "manifests/efa-nccl.toml"
    assert [s["name"] for s in data["stages"]] == [s.name for s in plan.stages]
    for shown, stage in zip(data["stages"], plan.stages, strict=True):
        assert shown == {"name": stage.name, "deps": list(stage.deps), "key": stage.key,
                         "status": "build", "inputs": dict(stage.inputs)}
    assert plan.key == plan.stage("efa-nccl").key
    assert plan.sources() == [src for s in plan.stages for src in s.sources]


def test_statuses_are_given_by_key() -> None:
    manifest = load(EFA_NCCL, registry=STAGES)
    keys = {s.name: s.key for s in make_plan(manifest, "efa-nccl", STAGES).stages}
    plan = make_plan(manifest, "efa-nccl", STAGES,
                     statuses={keys["efa"]: "cached", keys["nccl"]: "remote"})
    assert plan.stage("efa").status == "cached"
    assert plan.stage("nccl").status == "remote"
    assert {s.status for s in plan.stages if s.name not in ("efa", "nccl")} == {"build"}


def test_a_stage_without_a_table_gets_its_defaults_or_names_what_is_missing() -> None:
    manifest = load(EFA_NCCL, registry=STAGES)
    missing = [n for n, s in STAGES.items()
               if not manifest.has_stage(n) and any(f.required for f in s.fields.values())]
    assert missing
    name = missing[0]
    required = [k for k, f in STAGES[name].fields.items() if f.required]
    with pytest.raises(ManifestError) as info:
        stage_inputs(manifest, STAGES[name], "efa-nccl")
    assert str(info.value) == (
        f"{manifest.path}: target 'efa-nccl' needs stage {name!r}, which has no "
        f"[stages.{name}] table; add one with at least: {', '.join(required)}.")
    optional = next(n for n, s in STAGES.items() if not manifest.has_stage(n)
                    and not any(f.required for f in s.fields.values()) and n != "python")
    assert stage_inputs(manifest, STAGES[optional], "x") == {
        k: f.default for k, f in STAGES[optional].fields.items()}


def test_python_defaults_to_the_images_python_and_auto_must_be_locked() -> None:
    manifest = load(SMDDP, registry=STAGES)
    if manifest.has_stage("python"):
        stages = {k: v for k, v in manifest.stages.items() if k != "python"}
        manifest = dataclasses.replace(manifest, stages=stages)
    assert stage_inputs(manifest, STAGES["python"], "smddp")["version"] == \
        manifest.image["python"]
    auto = load(SMDDP, ["stages.nccl.version=auto"], registry=STAGES)
    with pytest.raises(LockError) as info:
        stage_inputs(auto, STAGES["nccl"], "smddp")
    assert str(info.value) == (f'{auto.path}: stages.nccl.version = "auto" must be resolved '
                               "first; run `invoke lock`.")


def test_defined_targets_are_images_whose_stages_all_have_what_they_need() -> None:
    efa_nccl = load(EFA_NCCL, registry=STAGES)
    targets = defined_targets(efa_nccl, STAGES)
    assert "efa-nccl" in targets
    assert "smddp" not in targets
    assert all(STAGES[t].image for t in targets)
    smddp = defined_targets(load(SMDDP, registry=STAGES), STAGES)
    assert "smddp" in smddp


def test_keyed_inputs_drop_unkeyed_fields_and_locations_a_pin_covers() -> None:
    stage = Stage(name="x", doc="x", deps=(), recipe=lambda _ctx: "", fields={
        **url_fields(url="https://h/x-{version}.tgz", what="X"),
        "quiet": Field(kind="bool", default=False, keyed=False, help="less output"),
    })
    inputs = {"version": "1", "url": "https://h/x-1.tgz", "sha256": "a" * 64, "policy": "~=1",
              "quiet": True, "extra": 3}
    assert keyed_inputs(stage, inputs) == {"version": "1", "sha256": "a" * 64, "extra": 3}
    unpinned = {**inputs, "sha256": None}
    assert keyed_inputs(stage, unpinned) == {"version": "1", "url": "https://h/x-1.tgz",
                                             "sha256": None, "extra": 3}
    git = Stage(name="g", doc="g", deps=(), recipe=lambda _ctx: "",
                fields=git_fields(repo="https://h/g.git", ref="v{version}", what="G"))
    assert keyed_inputs(git, {"version": "1", "repo": "r", "ref": "v1", "commit": "c" * 40}) \
        == {"version": "1", "commit": "c" * 40}
    assert keyed_inputs(git, {"version": "1", "repo": "r", "ref": "v1", "commit": None}) \
        == {"version": "1", "repo": "r", "ref": "v1", "commit": None}


def test_url_and_git_fields_have_the_lockable_shape() -> None:
    """Called here, not at import: stage modules build their fields once, when imported."""
    policy = Field(kind="specifier", keyed=False,
                   help="versions `invoke lock --upgrade` may move to, e.g. ~=1.14 (none: keep)")
    assert url_fields(url="https://h/x", what="X") == {
        "version": Field(kind="version", required=True, help="X version"),
        "url": Field(kind="url", default="https://h/x", required=False, locates="sha256",
                     help="download URL; `{version}` is substituted"),
        "sha256": Field(kind="sha256", locked=True, help="sha256 of the file (lock)"),
        "policy": policy,
    }
    no_url = url_fields(url="", what="X")
    assert no_url["url"].default is None
    assert no_url["url"].required
    assert git_fields(repo="https://h/g.git", ref="v{version}", what="G") == {
        "version": Field(kind="version", required=True, help="G version to build"),
        "repo": Field(kind="repo", default="https://h/g.git", locates="commit",
                      help="git URL (or mirror path) of G"),
        "ref": Field(kind="ref", default="v{version}", locates="commit",
                     help="tag or branch; `{version}` is substituted"),
        "commit": Field(kind="commit", locked=True, help="commit SHA the ref resolved to (lock)"),
        "policy": policy,
    }


@pytest.mark.parametrize(("url", "name"), [
    ("https://h/a/b/file-1.0.tar.gz", "file-1.0.tar.gz"),
    ("https://h/a/file.tgz?sig=x#frag", "file.tgz"),
    ("https://h/a/file.tgz#frag", "file.tgz"),
    ("https://sf.net/projects/p/files/p-1.0.tar.gz/download", "p-1.0.tar.gz"),
    ("https://h/a/dir/", "dir"),
    ("download", "download"),
    ("/srv/mirror/x.bin", "x.bin"),
])
def test_filename_of_a_url(url: str, name: str) -> None:
    assert filename_of(url) == name


def test_the_key_covers_the_local_base_image_id_only_when_there_is_one() -> None:
    manifest = load(EFA_NCCL, registry=STAGES)
    args = {"name": "s", "recipe": "r", "inputs": {}, "dep_keys": {"b": "k2", "a": "k1"}}
    plain = stage_key(manifest=manifest, **args)  # type: ignore[arg-type]
    with_none = dataclasses.replace(manifest, image={**manifest.image, "base_image_id": None})
    assert stage_key(manifest=with_none, **args) == plain  # type: ignore[arg-type]
    with_id = dataclasses.replace(manifest, image={**manifest.image, "base_image_id": "sha256:1"})
    assert stage_key(manifest=with_id, **args) != plain  # type: ignore[arg-type]
    reordered = {**args, "dep_keys": {"a": "k1", "b": "k2"}}
    assert stage_key(manifest=manifest, **reordered) == plain  # type: ignore[arg-type]


def test_a_provided_target_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "on-efa.toml"
    path.write_text(SMDDP.read_text().replace(
        'base = "nvidia/cuda:11.3.1-cudnn8-devel-ubuntu20.04"',
        'extends = "registry.example/efa:1"\nprovides = ["efa", "python"]'))
    manifest = load(path, registry=STAGES)
    registry = extends.registry(STAGES, manifest)
    with pytest.raises(ManifestError) as info:
        make_plan(manifest, "efa", registry)
    assert str(info.value) == (f"{path}: --target efa: image.extends = 'registry.example/efa:1' "
                               "already has it; build a stage it lacks, or use that image as "
                               "it is.")


def test_a_plan_names_its_target_when_a_stage_it_needs_has_no_table() -> None:
    manifest = load(EFA_NCCL, registry=STAGES)
    with pytest.raises(ManifestError) as info:
        make_plan(manifest, "smddp", STAGES)
    assert str(info.value) == (
        f"{manifest.path}: target 'smddp' needs stage 'boost', which has no [stages.boost] "
        "table; add one with at least: version.")


def test_every_missing_required_key_is_named() -> None:
    manifest = load(EFA_NCCL, registry=STAGES)
    with pytest.raises(ManifestError) as info:
        stage_inputs(manifest, STAGES["smddp"], "smddp")
    assert str(info.value) == (
        f"{manifest.path}: target 'smddp' needs stage 'smddp', which has no [stages.smddp] "
        "table; add one with at least: version, url.")


def test_stages_outside_the_graph_are_read_from_their_table_else_their_defaults() -> None:
    manifest = load(EFA_NCCL, registry=STAGES)
    plan = make_plan(manifest, "efa", STAGES)
    assert [s.name for s in plan.stages] == ["base", "efa"]
    assert plan.context.of("nccl") == dict(manifest.stages["nccl"])
    assert plan.context.of("nccl-tests") == dict(manifest.stages["nccl-tests"])
    assert plan.context.of("boost") == {k: f.default for k, f in STAGES["boost"].fields.items()}


def test_the_key_is_sha256_of_the_canonical_ascii_json_of_its_document() -> None:
    """Keys name artifacts in every cache: the document and its canonical form must not
    drift (non-ASCII text escaped, keys sorted, no spaces)."""
    manifest = load(EFA_NCCL, registry=STAGES)
    image = {**manifest.image, "base": "ubuntu:22.04", "base_digest": "sha256:d",
             "base_image_id": "sha256:i", "platform": "linux/arm64"}
    key = stage_key(name="s", recipe="RUN echo caf\u00e9", inputs={"v": "\u00e9"},
                    manifest=dataclasses.replace(manifest, image=image),
                    dep_keys={"b": "k2", "a": "k1"})
    canonical = ('{"base":{"digest":"sha256:d","id":"sha256:i","ref":"ubuntu:22.04"},'
                 '"deps":{"a":"k1","b":"k2"},"inputs":{"v":"\\u00e9"},'
                 '"platform":"linux/arm64","recipe":"RUN echo caf\\u00e9","stage":"s"}')
    assert key == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    other = {**image, "base_digest": "sha256:e"}
    assert stage_key(name="s", recipe="RUN echo caf\u00e9", inputs={"v": "\u00e9"},
                     manifest=dataclasses.replace(manifest, image=other),
                     dep_keys={"b": "k2", "a": "k1"}) != key

"""The training-contract stages without Docker: the user's code stage and its key, extending
a prebuilt image, the CA bundle option, the SSH key warning."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from imageforge.app import options, project
from imageforge.app.options import code_overrides
from imageforge.errors import ManifestError, UsageError
from imageforge.model import extends
from imageforge.model.manifest import load
from imageforge.planning import localtree
from imageforge.planning.execute import Run, bake_file
from imageforge.planning.plan import Plan, make_plan
from imageforge.sources import cabundle, lockfile, locksettle
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
SMDDP = ROOT / "manifests" / "smddp.toml"
EXAMPLE = ROOT / "examples" / "train"


@pytest.fixture
def code(tmp_path: Path) -> Path:
    path = tmp_path / "code"
    shutil.copytree(EXAMPLE, path)
    (path / "lib").mkdir()
    (path / "lib" / "helpers.py").write_text("X = 1\n")
    return path


def with_code(code: Path, *more: str) -> tuple[str, ...]:
    return (f"stages.code.dir={code}", "stages.code.program=train.py", *more)


def planned(overrides: tuple[str, ...], target: str = "code", manifest: Path = SMDDP) -> Plan:
    loaded = project.prepare(load(manifest, overrides, registry=STAGES), STAGES)
    return make_plan(loaded, target, extends.registry(STAGES, loaded))


# ---------------------------------------------------------------- the code and its digest

def test_digest_is_the_content_not_the_place(code: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    shutil.copytree(code, other)
    (other / "__pycache__").mkdir()
    (other / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"noise")
    assert localtree.tree_digest(code) == localtree.tree_digest(other)
    first = localtree.tree_digest(code)
    (code / "lib" / "helpers.py").write_text("X = 2\n")
    second = localtree.tree_digest(code)
    (code / "lib" / "helpers.py").chmod(0o755)
    third = localtree.tree_digest(code)
    (code / "lib" / "helpers.py").rename(code / "lib" / "other.py")
    assert len({first, second, third, localtree.tree_digest(code)}) == 4


def test_a_symlink_in_the_code_is_refused_naming_it(code: Path) -> None:
    (code / "data").symlink_to("/etc")
    with pytest.raises(ManifestError, match=r"data is a symlink"):
        localtree.tree_digest(code)


def test_missing_dir_or_program_names_the_key(tmp_path: Path, code: Path) -> None:
    with pytest.raises(ManifestError, match=r"stages\.code\.dir: .* is not a directory"):
        planned(with_code(tmp_path / "nowhere"))
    with pytest.raises(ManifestError, match=r"stages\.code\.program: nope\.py is not a file"):
        planned((f"stages.code.dir={code}", "stages.code.program=nope.py"))
    with pytest.raises(ManifestError, match=r"stages\.code\.program"):
        load(SMDDP, (f"stages.code.dir={code}", "stages.code.program=../etc/passwd"),
             registry=STAGES)


def test_a_relative_dir_is_relative_to_the_manifest(tmp_path: Path, code: Path) -> None:
    manifest = tmp_path / "m.toml"
    manifest.write_text(SMDDP.read_text() + '\n[stages.code]\ndir = "code"\n'
                        'program = "train.py"\n')
    applied = project.prepare(load(manifest, (), registry=STAGES), STAGES)
    assert applied.stages["code"]["dir"] == str(code.resolve())
    assert applied.stages["code"]["digest"] == localtree.tree_digest(code)


def test_snapshot_is_content_addressed_and_refuses_a_changed_tree(code: Path,
                                                                  tmp_path: Path) -> None:
    digest = localtree.tree_digest(code)
    copy = localtree.snapshot(code, digest, tmp_path / "snapshots")
    assert copy.name == digest.removeprefix("sha256:")
    assert localtree.tree_digest(copy) == digest
    (code / "train.py").write_text("changed\n")
    with pytest.raises(ManifestError, match="changed while this build was starting"):
        localtree.snapshot(code, "sha256:" + "0" * 64, tmp_path / "snapshots")
    assert [p.name for p in (tmp_path / "snapshots").iterdir()] == [copy.name]


# ---------------------------------------------------------------- the code stage

def test_code_stage_is_its_files_and_two_variables_on_smddp(code: Path) -> None:
    plan = planned(with_code(code))
    assert plan.stage("code").recipe == (
        "FROM smddp AS code\n"
        "ARG SOURCE_DATE_EPOCH\n"
        'ENV SAGEMAKER_PROGRAM="train.py" \\\n'
        '    SAGEMAKER_SUBMIT_DIRECTORY="/opt/ml/code"\n'
        "COPY --from=src-code . /opt/ml/code/\n")
    assert plan.stage("code").deps == ("smddp",)
    assert plan.stage("code").local_dirs == {
        "src-code": (str(code.resolve()), localtree.tree_digest(code))}


def test_a_code_change_moves_the_code_key_only(code: Path, tmp_path: Path) -> None:
    before = {s.name: s.key for s in planned(with_code(code)).stages}
    moved = tmp_path / "moved"
    shutil.copytree(code, moved)
    assert {s.name: s.key for s in planned(with_code(moved)).stages} == before
    (moved / "train.py").write_text("print('other')\n")
    after = {s.name: s.key for s in planned(with_code(moved)).stages}
    assert [n for n in before if before[n] != after[n]] == ["code"]
    other_program = {s.name: s.key for s in planned(
        (f"stages.code.dir={moved}", "stages.code.program=lib/helpers.py")).stages}
    assert [n for n in after if after[n] != other_program[n]] == ["code"]


def test_the_code_table_never_makes_the_lock_stale(code: Path) -> None:
    plain = load(SMDDP, (), registry=STAGES)
    assert load(SMDDP, with_code(code), registry=STAGES).digest() == plain.digest()
    assert load(SMDDP, ("stages.nccl.version=2.12.12",), registry=STAGES).digest() != \
        plain.digest()


def test_code_flags_go_together_and_make_code_the_target(code: Path) -> None:
    assert code_overrides(None, None, "smddp", STAGES) == ([], "smddp")
    overrides, target = code_overrides(str(code), "train.py", "smddp", STAGES)
    assert target == "code"
    assert overrides == list(with_code(code.resolve()))
    with pytest.raises(UsageError, match="--code and --program go together"):
        code_overrides(str(code), None, "smddp", STAGES)


# ---------------------------------------------------------------- extends

EXTENDED = """\
[image]
extends = "registry.example/pytorch-training:1.10.2"
cuda_arch = ["7.0", "8.0"]
python = "3.8"
{provides}
[stages.smddp]
version = "1.4.0"
url = "https://example.com/smdistributed_dataparallel-1.4.0-cp38-cp38-linux_x86_64.whl"
"""
PYTORCH_IMAGE = ["efa", "nccl", "aws-ofi-nccl", "python", "pytorch", "torchvision", "boost",
                 "sagemaker-training"]


def always(image_id: str) -> locksettle.LocalId:
    """A locksettle.LocalId that finds `image_id` whatever the base."""
    return lambda _ref: image_id


def extended(tmp_path: Path, provides: list[str] | None) -> Path:
    line = "" if provides is None else f"provides = {provides!r}".replace("'", '"')
    path = tmp_path / "extended.toml"
    path.write_text(EXTENDED.format(provides=line))
    return path


def test_only_what_the_image_lacks_is_planned_on_top_of_it(tmp_path: Path, code: Path) -> None:
    plan = planned(with_code(code), manifest=extended(tmp_path, PYTORCH_IMAGE))
    assert [s.name for s in plan.stages] == ["base", "smddp", "code"]
    assert plan.stage("base").recipe == \
        "FROM registry.example/pytorch-training:1.10.2 AS base\n"
    smddp = plan.stage("smddp").recipe
    assert smddp.startswith("FROM base AS smddp\n")
    assert "COPY --from=" not in smddp
    assert plan.to_json("m")["extends"] == {
        "ref": "registry.example/pytorch-training:1.10.2", "provides": PYTORCH_IMAGE}


def test_what_the_image_lacks_is_built_and_gathered(tmp_path: Path) -> None:
    manifest = tmp_path / "on-efa.toml"
    manifest.write_text(SMDDP.read_text().replace(
        'base = "nvidia/cuda:11.3.1-cudnn8-devel-ubuntu20.04"',
        'extends = "registry.example/efa:1"\nprovides = ["efa", "python"]'))
    plan = planned((), target="smddp", manifest=manifest)
    names = [s.name for s in plan.stages]
    assert "efa" not in names
    assert "python" not in names
    assert "pytorch" in names
    assert "COPY --from=pytorch /out/ /" in plan.stage("smddp").recipe
    assert plan.stage("pytorch").recipe.startswith("FROM base AS pytorch\n")


def test_without_a_lock_or_declaration_the_labels_must_be_read_first(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="run `invoke lock`"):
        planned((), target="smddp", manifest=extended(tmp_path, None))


def test_bad_extends_tables_are_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"image\.provides names 'nccl2'"):
        planned((), target="smddp", manifest=extended(tmp_path, ["nccl2"]))
    both = tmp_path / "both.toml"
    both.write_text(EXTENDED.format(provides='base = "x/y:1"'))
    with pytest.raises(ManifestError, match=r"image\.extends \(line 2\): set image\.base or "
                                            r"image\.extends, not both"):
        load(both, (), registry=STAGES)
    with pytest.raises(ManifestError, match=r"image\.provides=efa .*: only an image that extends"):
        load(SMDDP, ("image.provides=efa",), registry=STAGES)
    neither = tmp_path / "neither.toml"
    neither.write_text(EXTENDED.replace('extends = "registry.example/pytorch-training:1.10.2"',
                                        "").format(provides=""))
    with pytest.raises(ManifestError, match="missing required key 'base'"):
        load(neither, (), registry=STAGES)


def test_a_manifest_pinning_another_version_of_a_provided_stage_is_refused(
        tmp_path: Path) -> None:
    loaded = load(extended(tmp_path, None), ("stages.nccl.version=2.12.12",), registry=STAGES)
    with pytest.raises(ManifestError, match=r"stages\.nccl\.version = '2\.12\.12', but "
                                            r"image\.extends .* already has nccl 2\.10\.3"):
        extends.check_versions(loaded, {"nccl": "2.10.3"})


@pytest.mark.parametrize("local", [True, False])
def test_the_locked_image_pins_the_key(tmp_path: Path, local: bool) -> None:
    raw = load(extended(tmp_path, None), (), registry=STAGES)
    digest = "sha256:" + "ab" * 32
    # A local image's ID is a fact of this machine: the lock has no digest for it, the
    # local cache has its ID.
    pinned: dict[str, Any] = {"digest": None if local else digest, "provides": PYTORCH_IMAGE,
                              "versions": {}}
    locked = lockfile.Lock(entries={lockfile.EXTENDS: lockfile.Entry(
        origin={"ref": raw.image["extends"]}, pin=pinned)})

    def keys(image_id: str) -> tuple[str, str]:
        applied = locksettle.settle(raw, locked, STAGES, local_id=lambda _ref: image_id).manifest
        plan = make_plan(applied, "smddp", extends.registry(STAGES, applied))
        return plan.stage("base").recipe, plan.stage("smddp").key

    base, key = keys(digest)
    # A registry digest goes into FROM; a local image ID cannot (BuildKit would ask a
    # registry for it), so it pins the key only and is checked before building.
    assert (f"@{digest}" in base) is not local
    assert (keys("sha256:" + "cd" * 32)[1] != key) is local


# ---------------------------------------------------------------- CA bundle, warnings

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_ca_bundle_choices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = tmp_path / "proxy.pem"
    bundle.write_text(PEM)
    assert cabundle.resolve(str(bundle)) == bundle.resolve()
    assert cabundle.resolve("none") is None
    (tmp_path / "key.txt").write_text("not a certificate")
    with pytest.raises(ManifestError, match=r"--ca-bundle .*key\.txt: not a PEM CA bundle"):
        cabundle.resolve(str(tmp_path / "key.txt"))
    with pytest.raises(ManifestError, match=r"--ca-bundle .*missing\.pem: cannot read it"):
        cabundle.resolve(str(tmp_path / "missing.pem"))
    # Given by a setting, not the flag: the error names the setting.
    with pytest.raises(ManifestError, match=r"^imageforge\.ca_bundle \(invoke\.yaml or "
                                            r"INVOKE_IMAGEFORGE_CA_BUNDLE\) .*missing\.pem"):
        options.ca_bundle(options.Config(discover=lambda _dirs: STAGES,
                                     environ={"INVOKE_IMAGEFORGE_CA_BUNDLE":
                                              str(tmp_path / "missing.pem")}), None)
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    assert cabundle.resolve(None) == bundle.resolve()
    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    system = next((p for p in cabundle.SYSTEM_BUNDLES if p.is_file()), None)
    assert cabundle.resolve(None) == system


def test_the_ca_bundle_is_a_secret_and_never_a_build_arg_or_label(tmp_path: Path) -> None:
    run = Run(dockerfile="", contexts={}, artifact_targets={})
    bake = bake_file(run, workdir=tmp_path, tag="t", labels={}, platform="linux/amd64",
                     push=True, artifact_dirs={},
                     secrets={"ca-bundle": "/etc/proxy.pem"})
    image = bake["target"]["image"]
    assert image["secret"] == ["id=ca-bundle,src=/etc/proxy.pem"]
    assert "/etc/proxy.pem" not in str(image["args"]) + str(image["labels"])


def test_the_toolkit_step_renders_the_same_with_or_without_a_bundle() -> None:
    recipe = planned((), target="sagemaker-training").stage("sagemaker-training").recipe
    assert "--mount=type=secret,id=ca-bundle,required=false" in recipe
    assert "PIP_CERT=/run/secrets/ca-bundle" in recipe
    assert "\nsagemaker-training==5.1.4\nsagemaker-pytorch-training==3.0.0\n" in recipe
    assert os.sep + "etc" + os.sep + "ssl" not in recipe.split("PIP_CERT")[0]


def test_a_baked_ssh_key_is_warned_about() -> None:
    assert planned((), target="smddp").warnings() == []
    warned = planned(("stages.smddp.ssh_build_time_key=true",), target="smddp").warnings()
    assert len(warned) == 1
    assert "every copy of the image" in warned[0]


def test_a_stage_the_extended_image_has_is_no_target(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"--target pytorch: image\.extends = .* already "
                                            r"has it"):
        planned((), target="pytorch", manifest=extended(tmp_path, PYTORCH_IMAGE))


def test_a_local_base_image_is_pinned_by_its_id(tmp_path: Path) -> None:
    """A base only this machine has (like the sample's) has no registry digest: its image ID
    pins the keys, so stages built on an older image of the same tag are not reused. The ID
    comes from the local cache, never from the committed lock."""
    raw = load(SMDDP, (), registry=STAGES)
    ids = ["sha256:" + "1" * 64, "sha256:" + "2" * 64]
    locked = lockfile.Lock(entries={lockfile.BASE: lockfile.Entry(origin={"ref": raw.image["base"]},
                                                      pin={"digest": None})})
    path = tmp_path / "m.lock.json"
    lockfile.write(path, locked, raw)
    assert "sha256:1" not in path.read_text()
    keys = []
    for image_id in ids:
        applied = locksettle.settle(raw, lockfile.read(path), STAGES, local_id=always(image_id))
        plan = make_plan(applied.manifest, "boost", STAGES)
        assert "@sha256" not in plan.stage("base").recipe
        keys.append({s.name: s.key for s in plan.stages})
    assert all(keys[0][name] != keys[1][name] for name in keys[0])

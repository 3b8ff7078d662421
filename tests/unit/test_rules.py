"""Rules every command enforces, and the waivers that accept a known violation by its id."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.errors import CompatibilityError, LockError, ManifestError
from imageforge.model.manifest import Manifest, load
from imageforge.planning import rules
from imageforge.planning.labels import labels
from sample.serve import ServerHandle
from stages import STAGES
from stages.ncclpin import SUBMODULE, NcclPin
from tests.rulesdata import pins_of
from tests.unit.conftest import ROOT, sample_manifest

MANIFESTS = ROOT / "manifests"
# Two violations at once: torchvision-pytorch and plugin-disable-tests.
TWO_VIOLATIONS = ("stages.torchvision.version=0.9.1",
                  "stages.aws-ofi-nccl.configure_flags=--disable-tests")


def invoke(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_IMAGEFORGE_CACHE_DIR": str(cache)}
    env.pop("INVOKE_IMAGEFORGE_MANIFEST", None)
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, check=False, timeout=120)


def sets(*overrides: str) -> list[str]:
    return [arg for override in overrides for arg in ("--set", override)]


def smddp(*overrides: str) -> Manifest:
    return load(MANIFESTS / "smddp.toml", overrides, registry=STAGES)


def pin(version: str = "2.10.3") -> NcclPin:
    return NcclPin(version=version, commit="c" * 40,
                   evidence={"method": "submodule", "path": SUBMODULE, "pin": "c" * 40})


def settings(manifest: Path, *overrides: str) -> Workspace:
    return Workspace(registry=STAGES, manifest=manifest, overrides=overrides,
                            cache_dir=manifest.parent / "cache")


@pytest.mark.parametrize("command", [["plan"], ["render"], ["fetch"], ["build", "--dry-run"],
                                     ["build", "--dry-run", "--locked"], ["explain"],
                                     ["check"]])
def test_every_command_refuses_every_violation_at_once_with_exit_3(
        command: list[str], tmp_path: Path) -> None:
    result = invoke(*command, "--target", "smddp", *sets(*TWO_VIOLATIONS), cache=tmp_path) \
        if command != ["check"] else invoke("check", *sets(*TWO_VIOLATIONS), cache=tmp_path)

    assert result.returncode == 3, result.stderr
    assert "[torchvision-pytorch] stages.torchvision.version" in result.stderr
    assert "[plugin-disable-tests] stages.aws-ofi-nccl.configure_flags" in result.stderr
    assert "[waive]" in result.stderr
    assert "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir()), "refused before anything was fetched or written"


def test_lock_refuses_before_any_download(sample_server: ServerHandle, tmp_path: Path) -> None:
    manifest = sample_manifest(tmp_path / "m", sample_server.url)

    with pytest.raises(CompatibilityError) as refused:
        project.write_lock(settings(manifest, *TWO_VIOLATIONS), upgrade=False)

    assert {"torchvision-pytorch", "plugin-disable-tests"} <= set(
        line.split("]")[0].strip(" [") for line in str(refused.value).splitlines()
        if line.startswith("  ["))
    assert not (manifest.parent / "cache").exists()
    assert not manifest.with_name("sample.lock.json").exists()


def test_lock_computes_pytorchs_nccl_pin_then_refuses_another_nccl(
        sample_server: ServerHandle, tmp_path: Path) -> None:
    manifest = sample_manifest(tmp_path / "m", sample_server.url)
    other = "stages.nccl.version=2.11.4"

    with pytest.raises(CompatibilityError, match=r"\[nccl-pytorch-pin\] stages\.nccl\.version: "
                                                 r"stages\.nccl\.version 2\.11\.4 differs from "
                                                 r"NCCL 2\.10\.3"):
        project.write_lock(settings(manifest, other), upgrade=False)
    assert not manifest.with_name("sample.lock.json").exists()

    waived = settings(manifest, other, "waive.nccl-pytorch-pin=testing the next NCCL")
    path, _ = project.write_lock(waived, upgrade=False)
    assert path.exists()


def test_a_waiver_accepts_its_rule_only_and_says_so() -> None:
    loaded = smddp(*TWO_VIOLATIONS, "waive.torchvision-pytorch=the seed pins it")

    with pytest.raises(CompatibilityError) as refused:
        rules.enforce(loaded, None, registry=STAGES)
    assert "plugin-disable-tests" in str(refused.value)
    assert "[torchvision-pytorch]" not in str(refused.value)

    verdict = rules.enforce(smddp(TWO_VIOLATIONS[0], "waive.torchvision-pytorch=the seed pins it"),
                            None, registry=STAGES)
    assert [a.violation.rule for a in verdict.accepted] == ["torchvision-pytorch"]
    assert verdict.lines()[0].startswith("waived [torchvision-pytorch] "
                                         "stages.torchvision.version: torchvision 0.9.1")
    assert verdict.lines()[0].endswith("Accepted because: the seed pins it")


def test_differs_from_pytorch_is_the_old_spelling_of_the_nccl_waiver() -> None:
    loaded = smddp("stages.nccl.version=2.18.6", "waive.nccl-pytorch-pin=unused",
                   "stages.nccl.differs_from_pytorch=fixes a hang")
    # The [waive] table wins over the old key when both are given.
    assert rules.waivers(loaded, registry=STAGES)["nccl-pytorch-pin"] == "unused"
    old = load(MANIFESTS / "efa-nccl.toml", ["stages.nccl.differs_from_pytorch=fixes a hang"],
               registry=STAGES)
    assert "nccl-pytorch-pin" not in old.waivers
    verdict = rules.enforce(old, pins_of(pin()), registry=STAGES)
    assert [(a.violation.rule, a.reason) for a in verdict.accepted] == [
        ("nccl-pytorch-pin", "fixes a hang")]


def test_nccl_pin_waiver_needs_the_pin_to_be_judged() -> None:
    loaded = smddp()  # NCCL 2.10.3, waived in the manifest
    assert rules.enforce(loaded, None, registry=STAGES).unused == ()
    assert rules.enforce(loaded, pins_of(pin("2.10.3")), registry=STAGES).unused == (
        "nccl-pytorch-pin",)
    accepted = rules.enforce(loaded, pins_of(pin("2.11.4")), registry=STAGES).accepted
    assert accepted[0].violation.rule == "nccl-pytorch-pin"
    unwaived = load(MANIFESTS / "efa-nccl.toml", (), registry=STAGES)  # NCCL 2.7.8
    with pytest.raises(CompatibilityError, match="nccl-pytorch-pin"):
        rules.enforce(unwaived, pins_of(pin()), registry=STAGES)


def test_unknown_rule_id_and_missing_reason_are_manifest_errors() -> None:
    with pytest.raises(ManifestError, match=r"waive\.torchvision-pytorh: no compatibility rule "
                                            r"has that id; did you mean 'torchvision-pytorch'"):
        rules.enforce(smddp("waive.torchvision-pytorh=x"), None, registry=STAGES)
    with pytest.raises(ManifestError, match="a waiver needs its reason"):
        smddp("waive.torchvision-pytorch=")
    with pytest.raises(ManifestError, match="is not a rule id"):
        smddp("waive.Torchvision=x")


def test_waivers_leave_the_lock_current() -> None:
    assert smddp("waive.torchvision-pytorch=x").digest() == smddp().digest()


def test_labels_carry_the_waivers_in_force() -> None:
    labels = rules.labels(smddp(TWO_VIOLATIONS[0], "waive.torchvision-pytorch=the seed pins it",
                                "waive.smddp-cuda=left over"), registry=STAGES)
    assert labels["io.imageforge.waiver.torchvision-pytorch"] == "the seed pins it"
    assert labels["io.imageforge.waiver.nccl-pytorch-pin"].startswith("seed 002 replaces")
    assert "io.imageforge.waiver.smddp-cuda" not in labels  # it accepts nothing


def test_check_and_plan_show_accepted_waivers(tmp_path: Path) -> None:
    waive = sets(TWO_VIOLATIONS[0], "waive.torchvision-pytorch=the seed pins it")
    check = invoke("check", *waive, cache=tmp_path)
    plan = invoke("plan", *waive, cache=tmp_path)
    as_json = invoke("plan", "--json", *waive, cache=tmp_path)

    for result in (check, plan):
        assert result.returncode == 0, result.stderr
        assert "waived [torchvision-pytorch]" in result.stdout
    assert '"rule": "torchvision-pytorch"' in as_json.stdout
    assert '"reason": "the seed pins it"' in as_json.stdout


def test_image_labels_show_the_waiver(tmp_path: Path) -> None:
    planned = project.plan(Workspace(registry=STAGES, manifest=MANIFESTS / "smddp.toml",
                                            cache_dir=tmp_path), "smddp")

    values = labels(planned)

    assert values["io.imageforge.waiver.nccl-pytorch-pin"].startswith("seed 002 replaces")


LIMITS: list[tuple[str, tuple[str, ...], str | None]] = [
    # aws-ofi-nccl 1.12.1-aws works with NCCL 2.17.1 and newer.
    ("pt25-cu124", ("stages.nccl.version=2.17.1",), None),
    ("pt25-cu124", ("stages.nccl.version=2.17.0",), "plugin-nccl"),
    # --disable-tests exists from aws-ofi-nccl 1.4.0.
    ("efa-nccl", ("stages.aws-ofi-nccl.version=1.4.0",
                  "stages.aws-ofi-nccl.configure_flags=--disable-tests"), None),
    ("efa-nccl", ("stages.aws-ofi-nccl.version=1.3.9",
                  "stages.aws-ofi-nccl.configure_flags=--disable-tests"), "plugin-disable-tests"),
    # sm_86 (8.6) needs CUDA 11.1.
    ("efa-nccl", ("image.cuda_arch=8.6",), None),
    ("efa-nccl", ("image.cuda_arch=8.6", "image.cuda=11.0",
                  "image.base=nvidia/cuda:11.0.3-cudnn8-devel-ubuntu18.04"), "cuda-arch"),
    # CUDA 12.0 dropped sm_37: 11.8 is the last CUDA with it.
    ("efa-nccl", ("image.cuda_arch=3.7", "image.cuda=11.8",
                  "image.base=nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04"), None),
    ("efa-nccl", ("image.cuda_arch=3.7", "image.cuda=12.0",
                  "image.base=nvidia/cuda:12.0.1-cudnn8-devel-ubuntu22.04"), "cuda-arch"),
    # From EFA 1.38 the installer bundles the plugin.
    ("pt25-cu124", ("stages.efa.version=1.37.0",), None),
    ("pt25-cu124", ("stages.efa.version=1.38.0",), "efa-bundled-plugin"),
]


@pytest.mark.parametrize(("name", "overrides", "rule"), LIMITS,
                         ids=[" ".join(o) for _, o, _ in LIMITS])
def test_rules_at_their_exact_limit(name: str, overrides: tuple[str, ...],
                                    rule: str | None) -> None:
    loaded = load(MANIFESTS / f"{name}.toml", overrides, registry=STAGES)
    refused, _ = rules.evaluate(loaded, None, registry=STAGES)
    assert [v.rule for v in refused] == ([rule] if rule else [])


def test_a_hand_pinned_commit_of_another_version_is_refused_naming_both_shas(
        sample_server: ServerHandle, sample_pins: dict[str, Any], tmp_path: Path) -> None:
    tags = sample_pins["repos"]["vision"]["tags"]
    # The sample pins v0.11.3's commit; claim it is 0.12.0 (for PyTorch 1.10: a waiver).
    manifest = sample_manifest(tmp_path / "m", sample_server.url)
    lying = settings(manifest, "stages.torchvision.version=0.12.0",
                     "waive.torchvision-pytorch=testing the commit check")

    with pytest.raises(LockError) as refused:
        project.write_lock(lying, upgrade=False)

    message = str(refused.value)
    assert refused.value.return_code == 8
    assert all(part in message for part in ("v0.12.0", tags["v0.11.3"], tags["v0.12.0"]))
    assert not manifest.with_name("sample.lock.json").exists()

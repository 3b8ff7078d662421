"""The rules beside the stages (stages/smddp_rules.py, stages/torchvision_rules.py,
stages/aws_ofi_nccl_rules.py) judged in-process on the project's manifests: SMDDP after
PyTorch 2.5, the torchvision and torchaudio wheels beside a torch wheel, and the aws-ofi-nccl
plugin taken from an EFA installer."""

from __future__ import annotations

import dataclasses
import tomllib

from packaging.version import Version

from imageforge.model import compat
from imageforge.model.manifest import Manifest, load
from stages import STAGES, aws_ofi_nccl_rules, torchvision_rules
from tests.rulesdata import cited, data_file
from tests.unit.conftest import ROOT


def _load(name: str, *overrides: str) -> Manifest:
    return load(ROOT / "manifests" / f"{name}.toml", list(overrides), registry=STAGES)


def _found(manifest: Manifest, rule: str) -> list[compat.Violation]:
    return [v for v in compat.check(manifest, registry=STAGES) if v.rule == rule]


def _without(manifest: Manifest, stage: str) -> Manifest:
    return dataclasses.replace(manifest, stages={k: v for k, v in manifest.stages.items()
                                                 if k != stage})


# ---- smddp-no-pytorch-2-6 -------------------------------------------------------------------


def test_smddp_beside_pytorch_2_6_is_refused_naming_the_last_pytorch_it_was_built_for() -> None:
    found = _found(_load("pt25-cu124", "stages.pytorch.version=2.6.0"), "smddp-no-pytorch-2-6")
    entry = cited("smddp-no-pytorch-2-6")
    assert found == [compat.Violation(
        "smddp-no-pytorch-2-6", "stages.smddp",
        "SMDDP's last release is for PyTorch 2.5, but stages.pytorch.version is 2.6.0.",
        str(entry["source"]), str(entry["fix"]).format(last="2.5"))]
    assert "use PyTorch 2.5.x with SMDDP" in found[0].fix


def test_smddp_up_to_pytorch_2_5_or_without_smddp_or_a_numeric_pytorch_is_not_judged() -> None:
    assert _found(_load("pt25-cu124"), "smddp-no-pytorch-2-6") == []
    assert _found(_load("pt25-cu124", "stages.pytorch.version=2.5.9"),
                  "smddp-no-pytorch-2-6") == []
    newer = _load("pt25-cu124", "stages.pytorch.version=2.6.0")
    assert _found(_without(newer, "smddp"), "smddp-no-pytorch-2-6") == []
    assert _found(_load("pt25-cu124", "stages.pytorch.version=nightly"),
                  "smddp-no-pytorch-2-6") == []


# ---- torchvision and torchaudio beside a torch wheel ----------------------------------------


def test_the_last_torchaudio_is_read_from_the_data_file() -> None:
    # Parsed from the file's text here: the cached last_torchaudio() may predate this test.
    raw = tomllib.loads(data_file("torchvision").read_text(encoding="utf-8"))
    assert torchvision_rules._parse_audio(raw) == Version(raw["torchaudio"]["last"])
    assert torchvision_rules._parse_audio({"torchaudio": {"last": "2.11"}}) == Version("2.11")


def test_only_an_exact_pin_names_a_companion_version() -> None:
    assert torchvision_rules._pinned("torchvision==0.29.1") == ("torchvision", "0.29.1")
    assert torchvision_rules._pinned("TorchVision>=0.20") is None
    assert torchvision_rules._pinned("torchvision") is None
    assert torchvision_rules._pinned("not a requirement ==") is None


def test_unpinned_and_other_packages_are_passed_over_and_later_pins_still_judged() -> None:
    manifest = _load("real-pytorch",
                     "stages.pytorch.packages=torchvision>=0.1,numpy==1.26.4,torchaudio==2.10.0")
    found = _found(manifest, "torch-wheel-companions")
    assert [(v.key, v.message, v.fix) for v in found] == [(
        "stages.pytorch.packages",
        "torchaudio==2.10.0 is not paired with torch 2.14.1 (stages.pytorch.version).",
        "torchaudio 2.10.0 is made for PyTorch 2.10, and torchaudio has no release for "
        "PyTorch 2.14 (its last is 2.11); drop it")]
    assert _found(_load("real-pytorch", "stages.pytorch.packages=numpy==1.26.4"),
                  "torch-wheel-companions") == []


def test_companions_are_judged_only_beside_a_torch_wheel_with_a_numeric_version() -> None:
    source = _load("real-pytorch", "stages.pytorch.provider=source",
                   "stages.pytorch.packages=torchvision==0.1.0")
    assert _found(source, "torch-wheel-companions") == []
    nightly = _load("real-pytorch", "stages.pytorch.version=nightly",
                    "stages.pytorch.packages=torchvision==0.1.0")
    assert _found(nightly, "torch-wheel-companions") == []
    assert len(_found(_load("real-pytorch", "stages.pytorch.packages=torchvision==0.1.0"),
                      "torch-wheel-companions")) == 1


def test_a_torchvision_for_a_torch_the_table_does_not_know_names_only_its_own_pytorch() -> None:
    manifest = _load("real-pytorch", "stages.pytorch.version=2.99.0")
    [found] = _found(manifest, "torch-wheel-companions")
    assert found.message == ("torchvision==0.29.1 is not paired with torch 2.99.0 "
                             "(stages.pytorch.version).")
    assert found.fix == "torchvision 0.29.1 is built for PyTorch 2.14"
    table = torchvision_rules.built_for()
    assert torchvision_rules._vision_wheel(table, "0.29.1", Version("2.99.0")) == (
        "torchvision 0.29.1 is built for PyTorch 2.14")


def test_a_torchvision_the_table_does_not_know_names_the_release_for_the_torch() -> None:
    [found] = _found(_load("real-pytorch", "stages.pytorch.packages=torchvision==0.99.0"),
                     "torch-wheel-companions")
    assert found.fix == "torchvision 0.99.0 is not the release for PyTorch 2.14 (0.29.x is)"
    table = torchvision_rules.built_for()
    assert torchvision_rules._vision_wheel(table, "0.99.0", Version("3.0")) is None
    assert torchvision_rules._vision_wheel(table, "0.29.0", Version("2.14.1")) is None


def test_a_companion_version_without_a_number_is_judged_as_version_0() -> None:
    table = torchvision_rules.built_for()
    assert torchvision_rules._vision_wheel(table, "main", Version("2.14.1")) == (
        "torchvision main is not the release for PyTorch 2.14 (0.29.x is)")
    last = Version("2.11")
    assert torchvision_rules._audio_wheel(last, "main", Version("2.10.1")) == (
        "torchaudio main is made for PyTorch 0.0; use torchaudio 2.10.x")


def test_torchaudio_has_releases_up_to_the_last_patch_of_its_last_minor() -> None:
    last = Version("2.11")
    assert torchvision_rules._audio_wheel(last, "2.10.0", Version("2.11.999999")) == (
        "torchaudio 2.10.0 is made for PyTorch 2.10; use torchaudio 2.11.x")
    assert torchvision_rules._audio_wheel(last, "2.10.0", Version("2.11.1000000")) == (
        "torchaudio 2.10.0 is made for PyTorch 2.10, and torchaudio has no release for "
        "PyTorch 2.11 (its last is 2.11); drop it")
    assert torchvision_rules._audio_wheel(last, "2.11.0", Version("2.11.999999")) is None


# ---- plugin-from-efa ------------------------------------------------------------------------


def test_the_plugin_from_efa_is_not_judged_without_an_efa_version_or_efa_rules() -> None:
    manifest = _load("pt25-cu124", "stages.aws-ofi-nccl.provider=efa",
                     "stages.efa.version=1.22.0")
    (rule,) = [r for r in compat.rules(STAGES) if r.id == "plugin-from-efa"]
    assert len(aws_ofi_nccl_rules._plugin_from_efa(manifest, rule, STAGES)) == 1
    no_efa_rules = {k: v for k, v in STAGES.items() if k != "efa"}
    assert aws_ofi_nccl_rules._plugin_from_efa(manifest, rule, no_efa_rules) == []
    assert aws_ofi_nccl_rules._plugin_from_efa(_without(manifest, "efa"), rule, STAGES) == []

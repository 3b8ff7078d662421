"""Compatibility rules where a stage, a table row or a value is missing (stages/*_rules.py):
a rule that cannot judge says nothing rather than guess or fail, and two rules never report one
installer twice."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from packaging.version import Version

from imageforge.model import compat
from imageforge.model.manifest import Manifest, load
from imageforge.model.stage import Stage
from stages import STAGES
from tests.rulesdata import changed, cited
from tests.unit.conftest import ROOT


def manifest(name: str, *overrides: str) -> Manifest:
    return load(ROOT / "manifests" / f"{name}.toml", overrides, registry=STAGES)


def without(loaded: Manifest, *stages: str) -> Manifest:
    return dataclasses.replace(loaded, stages={k: v for k, v in loaded.stages.items()
                                               if k not in stages})


def without_image_cuda(loaded: Manifest) -> Manifest:
    return dataclasses.replace(loaded, image={k: v for k, v in loaded.image.items()
                                              if k != "cuda"})


def violation(rule: str, key: str, message: str, **fix: str) -> compat.Violation:
    found = cited(rule)
    return compat.Violation(rule, key, message, found["source"], found["fix"].format(**fix))


def rules_with(tmp_path: Path, stage: str, old: str, new: str) -> Mapping[str, Stage]:
    """The registry with `stage`'s data file with `old` (which must be there) replaced by
    `new`."""
    return changed(tmp_path, stage, old, new)


def test_without_image_cuda_the_cuda_is_read_from_the_nvidia_cuda_base_tag() -> None:
    loaded = without_image_cuda(manifest("smddp"))
    assert compat.image_cuda(loaded) == Version("11.3")
    other = dataclasses.replace(loaded, image={
        **loaded.image, "base": "registry.example.com/nvidia/cuda:12.4.1-devel-ubuntu22.04"})
    assert compat.image_cuda(other) == Version("12.4")
    plain = dataclasses.replace(loaded, image={**loaded.image, "base": "ubuntu:22.04"})
    assert compat.image_cuda(plain) is None
    assert compat.check(plain, registry=STAGES) == []


def test_without_image_cuda_the_arch_rule_judges_the_base_tags_cuda() -> None:
    loaded = without_image_cuda(manifest("smddp", 'image.cuda_arch=["7.0", "9.0"]'))
    assert compat.check(loaded, registry=STAGES) == [violation(
        "cuda-arch", "image.cuda_arch",
        "sm_90 (9.0) in image.cuda_arch needs CUDA 11.8 or newer, but the image's CUDA is 11.3.",
        action="remove 9.0 from image.cuda_arch, or use CUDA 11.8 or newer")]


def test_an_image_without_the_efa_installer_has_no_libfabric_to_judge() -> None:
    # aws-ofi-nccl 1.12.1-aws with --enable-platform-aws, and no [stages.efa] at all.
    assert compat.check(without(manifest("pt25-cu124"), "efa"), registry=STAGES) == []


def test_an_installer_that_bundles_the_plugin_is_fine_when_the_image_builds_none() -> None:
    loaded = manifest("pt25-cu124", "stages.efa.version=1.38.0")
    assert [v.rule for v in compat.check(loaded, registry=STAGES)] == ["efa-bundled-plugin"]
    assert compat.check(without(loaded, "aws-ofi-nccl"), registry=STAGES) == []


def test_a_libfabric_below_the_plugins_own_floor_is_reported_once(tmp_path: Path) -> None:
    # aws-ofi-nccl 1.12.1-aws needs libfabric 1.11.0, and 1.18.0 with --enable-platform-aws.
    registry = rules_with(tmp_path, "efa", "[efa.libfabric]\n",
                          '[efa.libfabric]\n"0.97" = "1.10.9"\n"0.98" = "1.11.0"\n')
    below = manifest("pt25-cu124", "stages.efa.version=0.97.0")
    assert [v.rule for v in compat.check(below, registry=registry)] == ["plugin-libfabric"]
    at_floor = manifest("pt25-cu124", "stages.efa.version=0.98.0")
    assert compat.check(at_floor, registry=registry) == [violation(
        "plugin-platform-aws", "stages.efa.version",
        "aws-ofi-nccl 1.12.1-aws with --enable-platform-aws needs libfabric >= 1.18.0, but EFA "
        "installer 0.98.0 bundles libfabric 1.11.0.",
        action="use an EFA installer that bundles libfabric >= 1.18.0 (e.g. EFA 1.25.x), or "
               "build without --enable-platform-aws")]


def test_torchvision_and_pytorch_the_table_does_not_know_are_not_judged() -> None:
    loaded = manifest("efa-nccl")
    stages = {**loaded.stages, "pytorch": {"version": "1.6.0"}, "torchvision": {"version": "0.7.0"}}
    assert compat.check(dataclasses.replace(loaded, stages=stages), registry=STAGES) == []


def test_a_pytorch_newer_than_the_table_is_judged_by_the_torchvision_release() -> None:
    loaded = manifest("efa-nccl")
    stages = {**loaded.stages, "pytorch": {"version": "2.15.0"},
              "torchvision": {"version": "0.29.0"}}
    assert compat.check(dataclasses.replace(loaded, stages=stages), registry=STAGES) == [violation(
        "torchvision-pytorch", "stages.torchvision.version",
        "torchvision 0.29.0 is built for PyTorch 2.14, but stages.pytorch.version is 2.15.0.",
        action="use the torchvision release for PyTorch 2.15, or PyTorch 2.14 with torchvision "
               "0.29.0")]


def test_pytorch_without_torchvision_or_smddp_is_not_judged_against_them() -> None:
    assert compat.check(without(manifest("smddp"), "torchvision", "smddp"), registry=STAGES) == []


def test_smddp_without_pytorch_is_not_judged_against_pytorch() -> None:
    assert compat.check(without(manifest("smddp"), "pytorch", "torchvision"), registry=STAGES) == []


def test_an_smddp_release_the_table_does_not_know_has_no_cuda_to_match() -> None:
    found = compat.check(manifest("smddp", "image.cuda=11.7", "stages.smddp.version=1.4.1"),
                         registry=STAGES)
    assert [v.rule for v in found] == ["base-cuda"]


def test_an_smddp_version_without_a_number_is_not_looked_up_in_the_table(tmp_path: Path) -> None:
    # A table row spelled like the number-less version must not match it either.
    registry = rules_with(tmp_path, "smddp", "[[known_good]]\n",
                          '[[known_good]]\npytorch = "1.10.2"\ncuda = "9.9"\npython = "3.8"\n'
                          'efa = "1.14.1"\nnccl = "2.10.3"\nsmddp = "None"\n\n[[known_good]]\n')
    loaded = manifest("smddp", "stages.smddp.version=None")
    assert [v.rule for v in compat.check(loaded, registry=registry)] == ["smddp-wheel"]
    assert [v.rule for v in compat.check(loaded, registry=STAGES)] == ["smddp-wheel"]

"""How compatibility findings name where PyTorch's NCCL pin was read
(imageforge/model/compat.py), and what the rules beside the stages (stages/*_rules.py) read
of their data and report."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imageforge.model import compat
from imageforge.model.manifest import load
from stages import STAGES, aws_ofi_nccl_rules, base_rules, efa_rules, smddp_rules, torchvision_rules
from stages.ncclpin import NcclPin
from tests.rulesdata import changed, cited, data_file, nccl_pin_rule, pin_origin
from tests.unit.conftest import ROOT

COMMIT = "1a2b3c4d5e6f7a8b9c0d1a2b3c4d5e6f7a8b9c0d"


def test_pin_origin_names_the_submodule_or_the_pin_file() -> None:
    submodule = NcclPin(version="2.10.3", commit=COMMIT,
                        evidence={"method": "submodule", "path": "third_party/nccl/nccl"})
    assert pin_origin(submodule) == "submodule third_party/nccl/nccl at 1a2b3c4d5e6f"
    pin_file = NcclPin(version="2.21.5", commit=COMMIT,
                       evidence={"method": "pin-file", "path": ".ci/docker/ci_commit_pins/nccl",
                                 "pin": "v2.21.5-1"})
    assert pin_origin(pin_file) == ".ci/docker/ci_commit_pins/nccl: v2.21.5-1"


def test_the_nccl_pin_violation_names_pytorch_with_or_without_its_version() -> None:
    manifest = load(ROOT / "manifests/smddp.toml", ["stages.nccl.version=2.18.6"],
                    registry=STAGES)
    pin = NcclPin(version="2.10.3", commit=COMMIT,
                  evidence={"method": "submodule", "path": "third_party/nccl/nccl"})
    (found,) = nccl_pin_rule(manifest, pin)
    torch = manifest.stages["pytorch"]["version"]
    assert found.message.endswith(
        f"stages.nccl.version 2.18.6 differs from NCCL 2.10.3, which PyTorch {torch} pins "
        "(submodule third_party/nccl/nccl at 1a2b3c4d5e6f).")
    without = dataclasses.replace(manifest, stages={k: v for k, v in manifest.stages.items()
                                                    if k != "pytorch"})
    (found,) = nccl_pin_rule(without, pin)
    assert "which PyTorch pins (submodule" in found.message
    assert nccl_pin_rule(manifest, None) == []
    same = load(ROOT / "manifests/smddp.toml", ["stages.nccl.version=2.10.3"], registry=STAGES)
    assert nccl_pin_rule(same, pin) == []


def _raw(stage: str) -> dict[str, Any]:
    return tomllib.loads(data_file(stage).read_text())


def test_each_rules_data_file_parses_to_every_value_it_holds() -> None:
    # Each module's parser is called on the file's text itself: the cached accessors
    # (facts(), archs(), ...) may have parsed it before this test ran.
    aliases = {}
    for path in (data_file(s) for s in ("nccl", "base", "efa", "aws-ofi-nccl", "torchvision",
                                        "smddp")):
        raw = tomllib.loads(path.read_text())
        parsed = compat._parse(raw).rules
        assert {rid: (r.id, r.source, r.fix, r.alias) for rid, r in parsed.items()} == {
            rid: (rid, r["source"], r["fix"], r.get("alias")) for rid, r in raw["rules"].items()}
        aliases.update({rid: r.alias for rid, r in parsed.items() if r.alias})
    assert aliases == {"nccl-pytorch-pin": "stages.nccl.differs_from_pytorch"}
    plugin, efa = _raw("aws-ofi-nccl")["aws-ofi-nccl"], _raw("efa")
    data = aws_ofi_nccl_rules._parse(_raw("aws-ofi-nccl"))
    installers = efa_rules.installers()
    assert data.with_nccl_unneeded_from == Version(plugin["with_nccl_unneeded_from"])
    assert installers.bundles_plugin_from == Version(efa["efa"]["bundles_plugin_from"])
    assert data.flag_since == {k: Version(v) for k, v in plugin["flag_since"].items()}
    assert len(data.flag_since) > 1
    assert installers.libfabric == {k: Version(v) for k, v in efa["efa"]["libfabric"].items()}
    assert torchvision_rules._parse(_raw("torchvision")) == {
        str(k): str(v) for k, v in _raw("torchvision")["torchvision"].items()}
    cuda_arch = base_rules._parse(_raw("base"))
    assert cuda_arch == {
        arch: base_rules.ArchSupport(since=Version(s["since"]),
                                     until=Version(s["until"]) if "until" in s else None)
        for arch, s in _raw("base")["cuda_arch"].items()}
    assert any(s.until is not None for s in cuda_arch.values())
    assert any(s.until is None for s in cuda_arch.values())
    assert smddp_rules._parse(_raw("smddp")) == {
        row["smddp"]: smddp_rules.Shipped(pytorch=row["pytorch"], cuda=row["cuda"])
        for row in _raw("smddp")["known_good"]}
    floors = [(installers.libfabric_min, efa["aws-ofi-nccl"]["libfabric_min"]),
              (data.platform_aws_libfabric_min, plugin["platform_aws_libfabric_min"]),
              (data.nccl_min, plugin["nccl_min"])]
    for parsed_floors, rows in floors:
        assert [(str(f.over), f.minimum) for f in parsed_floors] == [
            (str(SpecifierSet(row["plugin"])), Version(row["minimum"])) for row in rows]
        assert len(rows) > 1


def test_the_installer_suggested_is_the_oldest_that_bundles_enough_libfabric() -> None:
    data = efa_rules.installers()
    assert efa_rules.installer_with(data, Version("1.11")) == "EFA 1.11.2"
    assert efa_rules.installer_with(data, Version("1.16")) == "EFA 1.20.x"
    assert efa_rules.installer_with(data, Version("99")) == "a newer installer"
    by_version = dataclasses.replace(data, libfabric={"1.10": Version("1.6"),
                                                      "1.9": Version("1.5")})
    assert efa_rules.installer_with(by_version, Version("1.5")) == "EFA 1.9.x"


def _only(found: list[compat.Violation], rule: str) -> compat.Violation:
    (violation,) = [v for v in found if v.rule == rule]
    return violation


def _fix(rule: str, **values: str) -> str:
    return str(cited(rule)["fix"]).format(**values)


def test_a_cuda_arch_violation_names_the_key_and_the_action() -> None:
    (rule,) = [r for r in compat.rules(STAGES) if r.id == "cuda-arch"]
    archs = base_rules.archs()
    unknown = base_rules._arch_problem(rule, archs, Version("12.4"), "image.cuda_arch", "9.9")
    assert unknown == [compat.Violation(
        "cuda-arch", "image.cuda_arch", "9.9 in image.cuda_arch is not a CUDA compute capability.",
        compat.citation(rule).source, _fix("cuda-arch",
                                           action=f"use one of {', '.join(archs)}"))]
    newer = base_rules._arch_problem(rule, archs, Version("11.0"),
                                     "stages.pytorch.extra_cuda_arch", "8.6")
    assert [(v.key, v.fix) for v in newer] == [(
        "stages.pytorch.extra_cuda_arch",
        "remove 8.6 from stages.pytorch.extra_cuda_arch, or use CUDA 11.1 or newer")]
    dropped = base_rules._arch_problem(rule, archs, Version("12.0"), "image.cuda_arch", "3.7")
    assert [(v.key, v.fix) for v in dropped] == [(
        "image.cuda_arch", "remove 3.7 from image.cuda_arch, or use a CUDA older than 12.0")]


def test_the_plugin_libfabric_violation_names_the_efa_version_and_the_fix(
        tmp_path: Path) -> None:
    registry = changed(tmp_path, "efa", "[efa.libfabric]\n", '[efa.libfabric]\n"0.97" = "1.10.9"\n')
    loaded = load(ROOT / "manifests/efa-nccl.toml",
                  ["stages.nccl.version=2.17.1", "stages.aws-ofi-nccl.configure_flags=[]",
                   "stages.aws-ofi-nccl.version=1.1.0", "stages.efa.version=0.97.0"],
                  registry=STAGES)
    found = _only(compat.check(loaded, registry=registry), "plugin-libfabric")
    assert found.key == "stages.efa.version"
    assert found.message.startswith("EFA installer 0.97.0 bundles libfabric 1.10.9, but ")
    assert found.fix == _fix("plugin-libfabric", minimum="1.11.0", installer="EFA 1.11.2",
                             libfabric="1.10.9")


def test_the_nccl_pin_violation_names_the_key_and_both_versions() -> None:
    manifest = load(ROOT / "manifests/smddp.toml", ["stages.nccl.version=2.18.6"],
                    registry=STAGES)
    pin = NcclPin(version="2.10.3", commit=COMMIT, evidence={"method": "submodule", "path": "p"})
    (found,) = nccl_pin_rule(manifest, pin)
    assert (found.rule, found.key) == ("nccl-pytorch-pin", "stages.nccl.version")
    assert found.fix == _fix("nccl-pytorch-pin", pinned="2.10.3", version="2.18.6")


def test_plugin_flags_are_named_without_their_values() -> None:
    loaded = load(ROOT / "manifests/efa-nccl.toml",
                  ["stages.aws-ofi-nccl.configure_flags=--with-cuda=/usr/local/cuda=x,-g"],
                  registry=STAGES)
    assert aws_ofi_nccl_rules._plugin_flags(loaded) == {"--with-cuda", "-g"}
    without = dataclasses.replace(loaded, stages={k: v for k, v in loaded.stages.items()
                                                  if k != "aws-ofi-nccl"})
    assert aws_ofi_nccl_rules._plugin_flags(without) == set()


@pytest.mark.parametrize(("name", "overrides", "rule", "key", "fix"), [
    ("pt25-cu124", ("stages.nccl.version=2.17.0",), "plugin-nccl", "stages.nccl.version",
     "use NCCL 2.17.1 or newer, or an aws-ofi-nccl release older than the one that raised the "
     "floor"),
    ("efa-nccl", ("stages.aws-ofi-nccl.version=1.3.9",
                  "stages.aws-ofi-nccl.configure_flags=--disable-tests"),
     "plugin-disable-tests", "stages.aws-ofi-nccl.configure_flags",
     "drop --disable-tests from stages.aws-ofi-nccl.configure_flags, or use aws-ofi-nccl "
     "1.4.0 or newer"),
    ("pt25-cu124", ("stages.efa.version=1.38.0",), "efa-bundled-plugin", "stages.aws-ofi-nccl",
     'set stages.aws-ofi-nccl.provider = "efa" to use the installer\'s plugin, or '
     "stages.aws-ofi-nccl.build_despite_bundled = true to build aws-ofi-nccl 1.12.1-aws anyway"),
    ("pt25-cu124", ("stages.aws-ofi-nccl.provider=efa",), "plugin-from-efa",
     "stages.aws-ofi-nccl.provider",
     'use EFA installer 1.38 or newer, or set stages.aws-ofi-nccl.provider = "source" to build '
     "aws-ofi-nccl 1.12.1-aws"),
    ("efa-nccl", ("stages.aws-ofi-nccl.version=1.5.9",
                  "stages.aws-ofi-nccl.configure_flags=--enable-platform-aws"),
     "plugin-platform-aws", "stages.aws-ofi-nccl.configure_flags",
     "drop --enable-platform-aws from stages.aws-ofi-nccl.configure_flags, or use aws-ofi-nccl "
     "1.6.0 or newer"),
    ("pt25-cu124", ("stages.efa.version=1.22.0",), "plugin-platform-aws", "stages.efa.version",
     "use an EFA installer that bundles libfabric >= 1.18.0 (e.g. EFA 1.25.x), or build "
     "without --enable-platform-aws"),
    ("smddp", ("stages.torchvision.version=0.10.0",), "torchvision-pytorch",
     "stages.torchvision.version", "use torchvision 0.11.x with PyTorch 1.10"),
])
def test_each_violation_names_the_key_to_change_and_the_fix(
        name: str, overrides: tuple[str, ...], rule: str, key: str, fix: str) -> None:
    found = _only(compat.check(load(ROOT / "manifests" / f"{name}.toml", overrides,
                                    registry=STAGES), registry=STAGES), rule)
    assert (found.key, found.fix) == (key, fix)
    assert found.source == cited(rule)["source"]


def _violation(rule: str, key: str, message: str, **fix: str) -> compat.Violation:
    """The whole finding a rule should report: its source and fix come from its data file."""
    source = str(cited(rule)["source"])
    return compat.Violation(rule, key, message, source, _fix(rule, **fix))


def _check(name: str, *overrides: str) -> list[compat.Violation]:
    return compat.check(load(ROOT / "manifests" / f"{name}.toml", overrides, registry=STAGES),
                        registry=STAGES)


def test_an_image_cuda_that_is_neither_the_base_nor_smddps_names_image_cuda_twice() -> None:
    assert _check("smddp", "image.cuda=11.7") == [
        _violation("base-cuda", "image.cuda",
                   "image.base nvidia/cuda:11.3.1-cudnn8-devel-ubuntu20.04 is CUDA 11.3, but "
                   "image.cuda is 11.7.", base="11.3", cuda="11.7"),
        _violation("smddp-cuda", "image.cuda",
                   "SMDDP 1.4.0 was shipped for CUDA 11.3, but the image's CUDA is 11.7.",
                   wanted="11.3", cuda="11.7"),
    ]


def test_a_ptx_arch_outside_the_lists_names_every_listed_arch_once() -> None:
    assert _check("smddp", "stages.pytorch.ptx_arch=8.6",
                  'stages.pytorch.extra_cuda_arch=["3.7", "7.0"]') == [
        _violation("ptx-arch", "stages.pytorch.ptx_arch",
                   "stages.pytorch.ptx_arch 8.6 is not in the arch list (7.0, 8.0, 3.7), so no "
                   "PTX would be embedded.", archs="7.0, 8.0, 3.7", arch="8.6")]


def test_a_ptx_arch_with_no_arch_listed_says_none() -> None:
    assert _check("smddp", "image.cuda_arch=[]", "stages.pytorch.extra_cuda_arch=[]") == [
        _violation("ptx-arch", "stages.pytorch.ptx_arch",
                   "stages.pytorch.ptx_arch 7.0 is not in the arch list (none), so no PTX would "
                   "be embedded.", archs="none", arch="7.0")]


def test_arch_lists_and_the_ptx_arch_may_say_plus_ptx() -> None:
    assert _check("smddp", 'image.cuda_arch=["7.0+PTX", "8.0"]') == []
    assert _check("smddp", 'stages.pytorch.ptx_arch=8.0+PTX') == []
    assert _check("smddp", 'image.cuda_arch=["7.0", "9.0+PTX"]',
                  "stages.pytorch.ptx_arch=9.0+PTX") == [
        _violation("cuda-arch", "image.cuda_arch",
                   "sm_90 (9.0) in image.cuda_arch needs CUDA 11.8 or newer, but the image's "
                   "CUDA is 11.3.", action="remove 9.0 from image.cuda_arch, or use CUDA 11.8 "
                                       "or newer")]


def test_a_wheel_for_another_python_names_the_wheel_and_every_python_it_is_for() -> None:
    wheel = "smdistributed_dataparallel-1.4.0-cp38-cp38-linux_x86_64.whl"
    assert _check("smddp", "image.python=3.9") == [
        _violation("smddp-python", "image.python",
                   f"the SMDDP wheel {wheel} is for Python 3.8, but image.python is 3.9.",
                   python="3.9", tag="39", wheel_python="3.8")]
    both = "smdistributed_dataparallel-1.4.0-cp39.cp38-cp39.cp38-linux_x86_64.whl"
    url = f"stages.smddp.url=https://smdataparallel.s3.amazonaws.com/binary/pytorch/1.10.2/{both}"
    assert _check("smddp", url, "image.python=3.10") == [
        _violation("smddp-python", "image.python",
                   f"the SMDDP wheel {both} is for Python 3.8, 3.9, but image.python is 3.10.",
                   python="3.10", tag="310", wheel_python="3.8")]
    assert _check("smddp", url, "image.python=3.9") == []


def test_a_wheel_for_any_python_fits_every_image() -> None:
    url = ("stages.smddp.url=https://smdataparallel.s3.amazonaws.com/binary/pytorch/1.10.2/"
           "smdistributed_dataparallel-1.4.0-py3-none-any.whl")
    assert _check("smddp", url) == []


def test_a_wheel_for_another_pytorch_names_both_versions() -> None:
    found = _only(_check("smddp", "stages.pytorch.version=1.12.1"), "smddp-pytorch")
    assert found == _violation(
        "smddp-pytorch", "stages.pytorch.version",
        "the SMDDP wheel is built for PyTorch 1.10.2 (its URL's /pytorch/1.10.2/ segment), but "
        "stages.pytorch.version is 1.12.1.", wanted="1.10.2", pytorch="1.12.1")


def test_a_url_that_is_no_wheel_or_another_versions_wheel_names_stages_smddp_url() -> None:
    assert _check("smddp", "stages.smddp.url=https://example.com/smddp-1.4.0.tar.gz") == [
        _violation("smddp-wheel", "stages.smddp.url",
                   "stages.smddp.url names 'smddp-1.4.0.tar.gz', which is not a wheel.",
                   version="1.4.0")]
    other = ("stages.smddp.url=https://smdataparallel.s3.amazonaws.com/binary/pytorch/1.10.2/"
             "cu113/2021-12-01/smdistributed_dataparallel-1.3.0-cp38-cp38-linux_x86_64.whl")
    assert _check("smddp", other) == [
        _violation("smddp-wheel", "stages.smddp.url",
                   "stages.smddp.url is the wheel of SMDDP 1.3.0, but stages.smddp.version is "
                   "1.4.0.", version="1.4.0")]


def test_the_installer_the_data_knows_is_reported_with_its_own_version() -> None:
    assert efa_rules.known_efa("1.36.0") == efa_rules.EfaInstaller(
        version="1.36.0", libfabric=Version("1.22"), bundles_plugin=False)
    assert efa_rules.known_efa("1.38.1") == efa_rules.EfaInstaller(
        version="1.38.1", libfabric=Version("1.22"), bundles_plugin=True)

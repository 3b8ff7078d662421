from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from imageforge.errors import ManifestError
from imageforge.model.compat import (
    check,
    format_violations,
    notes,
    rule_ids,
)
from imageforge.model.manifest import Manifest, load
from stages import STAGES
from stages.efa_rules import known_efa
from stages.ncclpin import SUBMODULE, NcclPin
from tests.rulesdata import changed, data_file, nccl_pin_rule

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
# The tables the shipped combinations are built from (beside the stages they constrain).
DATA = {"torchvision": tomllib.loads(data_file("torchvision").read_text())["torchvision"],
        "known_good": tomllib.loads(data_file("smddp").read_text())["known_good"]}
SMDDP_MIRROR_WHEEL = ("file:///mirror/smdistributed_dataparallel-{version}-cp311-cp311-"
                      "linux_x86_64.whl")


def manifest(name: str, *overrides: str) -> Manifest:
    return load(MANIFESTS / f"{name}.toml", overrides, registry=STAGES)


def with_stage_values(loaded: Manifest, stage: str, **values: Any) -> Manifest:
    """For keys the stage fields do not declare yet (they cannot be set through a manifest)."""
    stages = {**loaded.stages, stage: {**loaded.stages[stage], **values}}
    return dataclasses.replace(loaded, stages=stages)


@pytest.mark.parametrize("name", ["smddp", "pt25-cu124", "efa-nccl"])
def test_shipped_manifests_pass(name: str) -> None:
    assert check(manifest(name), registry=STAGES) == []


def known_good_manifest(row: dict[str, str]) -> Manifest:
    """Seed 002's manifest moved to one row of the combinations AWS shipped."""
    pytorch, cuda, python = row["pytorch"], row["cuda"], row["python"]
    vision = {pt: tv for tv, pt in DATA["torchvision"].items()}[pytorch.rsplit(".", 1)[0]]
    cp = "cp" + python.replace(".", "")
    abi = cp + "m" if python in ("3.6", "3.7") else cp
    url = (f"https://smdataparallel.s3.amazonaws.com/binary/pytorch/{pytorch}/cu"
           f"{cuda.replace('.', '')}/2022-01-01/smdistributed_dataparallel-{{version}}-{cp}-"
           f"{abi}-linux_x86_64.whl")
    overrides = [
        f"image.base=nvidia/cuda:{cuda}.0-cudnn8-devel-ubuntu20.04", f"image.cuda={cuda}",
        f"image.python={python}", "stages.pytorch.extra_cuda_arch=[]",
        f"stages.pytorch.version={pytorch}", f"stages.torchvision.version={vision}.0",
        f"stages.efa.version={row['efa']}", f"stages.nccl.version={row['nccl']}",
        f"stages.smddp.version={row['smddp']}", f"stages.smddp.url={url}",
    ]
    if "aws_ofi_nccl" in row:
        overrides.append(f"stages.aws-ofi-nccl.version={row['aws_ofi_nccl']}")
    loaded = manifest("smddp", *overrides)
    if "aws_ofi_nccl" in row:
        return loaded
    stages = {k: v for k, v in loaded.stages.items() if k != "aws-ofi-nccl"}
    return dataclasses.replace(loaded, stages=stages)


@pytest.mark.parametrize("row", DATA["known_good"], ids=lambda row: f"pt{row['pytorch']}")
def test_every_shipped_combination_passes(row: dict[str, str]) -> None:
    assert check(known_good_manifest(row), registry=STAGES) == []


CASES: dict[str, tuple[str, tuple[str, ...], list[tuple[str, str]]]] = {
    "seed 002 torchvision": ("smddp", ("stages.torchvision.version=0.9.1",), [
        ("torchvision-pytorch", "torchvision 0.9.1 is built for PyTorch 1.8, but "
                                "stages.pytorch.version is 1.10.2"),
        ("torchvision-pytorch", "use torchvision 0.11.x with PyTorch 1.10"),
    ]),
    "torchvision newer than pytorch": ("pt25-cu124", ("stages.torchvision.version=0.21.0",), [
        ("torchvision-pytorch", "built for PyTorch 2.6"),
    ]),
    "torchvision the table does not know": ("smddp", ("stages.torchvision.version=0.7.0",), [
        ("torchvision-pytorch", "is not the release for PyTorch 1.10.2 (0.11.x is)"),
    ]),
    "wheel for another python": ("smddp", ("image.python=3.9",), [
        ("smddp-python", "is for Python 3.8, but image.python is 3.9"),
        ("smddp-python", 'or set image.python = "3.8"'),
    ]),
    "wheel for another pytorch": ("smddp", ("stages.pytorch.version=1.12.1",), [
        ("smddp-pytorch", "built for PyTorch 1.10.2 (its URL's /pytorch/1.10.2/ segment)"),
        ("torchvision-pytorch", "use torchvision 0.13.x with PyTorch 1.12"),
    ]),
    "mirrored wheel falls back to the shipped table": ("pt25-cu124", (
        f"stages.smddp.url={SMDDP_MIRROR_WHEEL}", "stages.pytorch.version=2.4.0",
        "stages.torchvision.version=0.19.0"), [
        ("smddp-pytorch", "built for PyTorch 2.5.1 (SMDDP 2.6.0 shipped with it)"),
    ]),
    "url is not a wheel": ("smddp", ("stages.smddp.url=https://example.com/smddp-1.4.0.tar.gz",), [
        ("smddp-wheel", "names 'smddp-1.4.0.tar.gz', which is not a wheel"),
    ]),
    "wheel of another smddp version": ("smddp", (
        "stages.smddp.url=https://smdataparallel.s3.amazonaws.com/binary/pytorch/1.10.2/cu113/"
        "2021-12-01/smdistributed_dataparallel-1.3.0-cp38-cp38-linux_x86_64.whl",), [
        ("smddp-wheel", "is the wheel of SMDDP 1.3.0, but stages.smddp.version is 1.4.0"),
    ]),
    "image cuda differs from base and smddp": ("smddp", ("image.cuda=11.7",), [
        ("base-cuda", "is CUDA 11.3, but image.cuda is 11.7"),
        ("smddp-cuda", "SMDDP 1.4.0 was shipped for CUDA 11.3, but the image's CUDA is 11.7"),
    ]),
    "base image of another cuda": ("smddp", (
        "image.base=nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04",), [
        ("base-cuda", 'set image.cuda = "11.8", or use an nvidia/cuda:11.3.x base image'),
    ]),
    "arch newer than cuda": ("smddp", ("image.cuda_arch=7.0,9.0",), [
        ("cuda-arch", "sm_90 (9.0) in image.cuda_arch needs CUDA 11.8 or newer, but the "
                      "image's CUDA is 11.3"),
    ]),
    "arch dropped by cuda 12": ("pt25-cu124", ("image.cuda_arch=3.7,9.0",), [
        ("cuda-arch", "CUDA 12.0 dropped sm_37 (3.7)"),
    ]),
    "arch dropped by cuda 11": ("smddp", ("stages.pytorch.extra_cuda_arch=3.0,3.7",), [
        ("cuda-arch", "CUDA 11.0 dropped sm_30 (3.0), but stages.pytorch.extra_cuda_arch lists "
                      "it for CUDA 11.3"),
    ]),
    "not an arch": ("smddp", ("stages.pytorch.extra_cuda_arch=8.1",), [
        ("cuda-arch", "8.1 in stages.pytorch.extra_cuda_arch is not a CUDA compute capability"),
    ]),
    "ptx arch not listed": ("smddp", ("stages.pytorch.ptx_arch=8.6",), [
        ("ptx-arch", "8.6 is not in the arch list (7.0, 8.0, 3.7, 5.0)"),
    ]),
    # Without platform-aws the plugin takes any libfabric >= 1.11 (its configure check); with
    # it, 1.8-1.12 need 1.18, which EFA 1.22's libfabric 1.17 is not.
    "installer libfabric too old for platform-aws": ("pt25-cu124", ("stages.efa.version=1.22.0",), [
        ("plugin-platform-aws", "aws-ofi-nccl 1.12.1-aws with --enable-platform-aws needs "
                                "libfabric >= 1.18.0, but EFA installer 1.22.0 bundles "
                                "libfabric 1.17"),
        ("plugin-platform-aws", "(e.g. EFA 1.25.x)"),
    ]),
    "platform-aws needs a newer libfabric": ("pt25-cu124", (
        "stages.aws-ofi-nccl.version=1.13.2-aws", "stages.efa.version=1.32.0"), [
        ("plugin-platform-aws", "with --enable-platform-aws needs libfabric >= 1.22.0, but EFA "
                                "installer 1.32.0 bundles libfabric 1.21"),
    ]),
    "platform-aws before 1.6.0": ("efa-nccl", (
        "stages.aws-ofi-nccl.configure_flags=--enable-platform-aws",), [
        ("plugin-platform-aws", "aws-ofi-nccl 1.1.1 has no --enable-platform-aws; the option "
                                "exists from 1.6.0"),
    ]),
    "disable-tests before 1.4.0": ("smddp", (
        "stages.aws-ofi-nccl.configure_flags=--disable-tests",), [
        ("plugin-disable-tests", "1.1.3-aws has no --disable-tests"),
    ]),
    "nccl below the plugin's floor": ("pt25-cu124", ("stages.nccl.version=2.16.2",), [
        ("plugin-nccl", "aws-ofi-nccl 1.12.1-aws works with NCCL 2.17.1 and newer, but "
                        "stages.nccl.version is 2.16.2"),
    ]),
    "installer bundles the plugin": ("pt25-cu124", ("stages.efa.version=1.38.0",), [
        ("efa-bundled-plugin", "EFA installer 1.38.0 already installs aws-ofi-nccl at "
                               "/opt/amazon/ofi-nccl"),
        ("efa-bundled-plugin", "stages.aws-ofi-nccl.build_despite_bundled = true"),
        ("efa-bundled-plugin", 'set stages.aws-ofi-nccl.provider = "efa"'),
    ]),
    "the installer's plugin, from an installer that ships none": (
        "pt25-cu124", ("stages.aws-ofi-nccl.provider=efa",), [
            ("plugin-from-efa", "EFA installer 1.36.0 ships no aws-ofi-nccl (installers do "
                                "from 1.38)"),
            ("plugin-from-efa", 'stages.aws-ofi-nccl.provider = "source"'),
        ]),
    "the installer's plugin from an installer that ships it": (
        "pt25-cu124", ("stages.efa.version=1.38.0", "stages.aws-ofi-nccl.provider=efa"), []),
}


@pytest.mark.parametrize("case", list(CASES))
def test_violations(case: str) -> None:
    name, overrides, expected = CASES[case]

    found = check(manifest(name, *overrides), registry=STAGES)

    assert sorted(v.rule for v in found) == sorted({rule for rule, _ in expected})
    for rule, fragment in expected:
        texts = [f"{v.message} {v.fix}" for v in found if v.rule == rule]
        assert any(fragment in text for text in texts), (fragment, texts)


def test_seed_torchvision_is_the_only_violation() -> None:
    found = check(manifest("smddp", "stages.torchvision.version=0.9.1"), registry=STAGES)

    assert [(v.rule, v.key) for v in found] == [("torchvision-pytorch",
                                                 "stages.torchvision.version")]
    assert found[0].fix == "use torchvision 0.11.x with PyTorch 1.10"
    assert found[0].source == "https://github.com/pytorch/vision#installation"


def test_every_violation_is_reported_at_once() -> None:
    found = check(manifest("smddp", "stages.torchvision.version=0.9.1", "image.python=3.9",
                           "stages.aws-ofi-nccl.configure_flags=--disable-tests"),
                  registry=STAGES)

    assert sorted(v.rule for v in found) == ["plugin-disable-tests", "smddp-python",
                                             "torchvision-pytorch"]


def test_building_the_plugin_despite_the_installer_is_explicit() -> None:
    loaded = manifest("pt25-cu124", "stages.efa.version=1.38.0")
    assert check(with_stage_values(loaded, "aws-ofi-nccl", build_despite_bundled=True),
                 registry=STAGES) == []


def pin(version: str = "2.10.3") -> NcclPin:
    commit = "c" * 40
    return NcclPin(version=version, commit=commit,
                   evidence={"method": "submodule", "path": SUBMODULE, "pin": commit})


def test_nccl_matching_pytorch_pin_passes() -> None:
    loaded = manifest("smddp")
    assert nccl_pin_rule(loaded, pin()) == []
    assert nccl_pin_rule(loaded, None) == []
    assert nccl_pin_rule(manifest("smddp", "stages.nccl.version=auto"), pin("2.11.4")) == []


def test_nccl_differing_from_pytorch_pin_is_a_violation_whatever_the_manifest_says() -> None:
    # Accepting it is the waiver's business (imageforge/planning/rules.py), not the rule's.
    loaded = with_stage_values(manifest("smddp", "stages.nccl.version=2.18.6"), "nccl",
                               differs_from_pytorch="a reason")

    found = nccl_pin_rule(loaded, pin())

    assert [v.rule for v in found] == ["nccl-pytorch-pin"]
    assert found[0].message == ("stages.nccl.version 2.18.6 differs from NCCL 2.10.3, which "
                                "PyTorch 1.10.2 pins (submodule third_party/nccl/nccl at "
                                "cccccccccccc).")
    assert '[waive]: nccl-pytorch-pin = "..."' in found[0].fix


def test_every_rule_has_an_id_a_manifest_can_name() -> None:
    ids = rule_ids(registry=STAGES)
    assert "nccl-pytorch-pin" in ids
    assert "torchvision-pytorch" in ids
    assert all(rule == rule.lower() and " " not in rule for rule in ids)


def test_format_names_rule_key_fix_and_source() -> None:
    found = check(manifest("smddp", "stages.torchvision.version=0.9.1"), registry=STAGES)

    text = format_violations(found, manifest=Path("manifests/smddp.toml"))

    assert text.splitlines() == [
        "manifests/smddp.toml: 1 compatibility problem(s):",
        "  [torchvision-pytorch] stages.torchvision.version: torchvision 0.9.1 is built for "
        "PyTorch 1.8, but stages.pytorch.version is 1.10.2.",
        "      fix: use torchvision 0.11.x with PyTorch 1.10.",
        "      source: https://github.com/pytorch/vision#installation",
    ]
    assert format_violations([], manifest=Path("m.toml")) == "m.toml: no compatibility problems."


def test_known_efa() -> None:
    installer = known_efa("1.36.0")
    assert installer is not None
    assert (installer.libfabric, installer.bundles_plugin) == (Version("1.22"), False)
    bundling = known_efa("1.38.0")
    assert bundling is not None
    assert bundling.bundles_plugin
    assert known_efa("1.11.2") is not None
    assert known_efa("1.11.0") is None  # only the 1.11.2 release is known
    assert known_efa("1.27.0") is None


def test_with_nccl_note_only_where_it_is_not_needed() -> None:
    flags = "stages.aws-ofi-nccl.configure_flags=--enable-platform-aws,--with-nccl=/opt/conda"
    assert notes(manifest("pt25-cu124", flags), registry=STAGES) == [
        "aws-ofi-nccl 1.12.1-aws serves every NCCL from one build (from 1.5.0), so --with-nccl "
        "in stages.aws-ofi-nccl.configure_flags is not needed."]
    assert notes(manifest("pt25-cu124"), registry=STAGES) == []
    assert notes(manifest("smddp", "stages.aws-ofi-nccl.configure_flags=--with-nccl=/x"),
                 registry=STAGES) == []


def test_broken_rules_file_is_a_clear_error(tmp_path: Path) -> None:
    broken = changed(tmp_path, "efa", '"1.20" = "1.16.1"', '"1.20" = "one"', name="compat.toml")

    with pytest.raises(ManifestError, match=r"compat\.toml: unusable compatibility data"):
        check(manifest("smddp"), registry=broken)

"""Every compatibility rule at exactly its limit, from both sides.

A bound moved by one (`>=` written `>`, `<` written `<=`) changes only what happens at the
limit itself, so each rule is judged on the version that is its limit and on the nearest one
past it. Where no EFA installer in stages/efa_rules.toml bundles exactly a libfabric floor,
the data is copied with two made-up installers that do (`with_installers`), so the code is
tested at the limit and the real data stays as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from imageforge.model.compat import check, notes
from imageforge.model.manifest import Manifest, load
from imageforge.model.stage import Stage
from stages import STAGES
from stages.efa_rules import known_efa
from tests.rulesdata import changed

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
NO_FLAGS = "stages.aws-ofi-nccl.configure_flags=[]"
PLATFORM_AWS = "stages.aws-ofi-nccl.configure_flags=--enable-platform-aws"


def manifest(name: str, *overrides: str) -> Manifest:
    return load(MANIFESTS / f"{name}.toml", overrides, registry=STAGES)


def cuda(version: str, base_patch: str = "0") -> tuple[str, str]:
    return (f"image.cuda={version}",
            f"image.base=nvidia/cuda:{version}.{base_patch}-cudnn8-devel-ubuntu22.04")


def refused(loaded: Manifest, *, registry: Mapping[str, Stage] = STAGES) -> list[str]:
    return sorted(v.rule for v in check(loaded, registry=registry))


# (manifest, overrides, the rules it breaks): each limit as a pair, at it and just past it.
LIMITS: list[tuple[str, tuple[str, ...], list[str]]] = [
    # cuda-arch, since: sm_86 from CUDA 11.1, sm_100 from CUDA 12.8.
    ("efa-nccl", ("image.cuda_arch=8.6", *cuda("11.1", "1")), []),
    ("efa-nccl", ("image.cuda_arch=8.6", *cuda("11.0", "3")), ["cuda-arch"]),
    ("efa-nccl", ("image.cuda_arch=10.0", *cuda("12.8")), []),
    ("efa-nccl", ("image.cuda_arch=10.0", *cuda("12.6")), ["cuda-arch"]),
    # cuda-arch, until: CUDA 12.0 dropped sm_37, CUDA 13.0 dropped sm_70.
    ("efa-nccl", ("image.cuda_arch=3.7", *cuda("11.8")), []),
    ("efa-nccl", ("image.cuda_arch=3.7", *cuda("12.0")), ["cuda-arch"]),
    ("efa-nccl", ("image.cuda_arch=7.0", *cuda("12.9")), []),
    ("efa-nccl", ("image.cuda_arch=7.0", *cuda("13.0")), ["cuda-arch"]),
    # cuda-arch reads stages.pytorch.extra_cuda_arch too: sm_89 from CUDA 11.8 (SMDDP 1.4.0
    # was shipped for CUDA 11.3, so smddp-cuda holds on both sides).
    ("smddp", ('stages.pytorch.extra_cuda_arch=["8.9"]', *cuda("11.8")), ["smddp-cuda"]),
    ("smddp", ('stages.pytorch.extra_cuda_arch=["8.9"]', *cuda("11.7")),
     ["cuda-arch", "smddp-cuda"]),
    # plugin-nccl: aws-ofi-nccl 1.10.0 on needs NCCL 2.17.1, 1.1.x-1.9.x NCCL 2.4.8.
    ("pt25-cu124", ("stages.nccl.version=2.17.1",), []),
    ("pt25-cu124", ("stages.nccl.version=2.17.0",), ["plugin-nccl"]),
    ("pt25-cu124", ("stages.nccl.version=2.16.5", "stages.aws-ofi-nccl.version=1.9.9"), []),
    ("pt25-cu124", ("stages.nccl.version=2.16.5", "stages.aws-ofi-nccl.version=1.10.0"),
     ["plugin-nccl"]),
    ("efa-nccl", ("stages.nccl.version=2.4.8",), []),
    ("efa-nccl", ("stages.nccl.version=2.4.7",), ["plugin-nccl"]),
    # plugin-disable-tests: --disable-tests exists from aws-ofi-nccl 1.4.0.
    ("efa-nccl", ("stages.aws-ofi-nccl.version=1.4.0",
                  "stages.aws-ofi-nccl.configure_flags=--disable-tests"), []),
    ("efa-nccl", ("stages.aws-ofi-nccl.version=1.3.9",
                  "stages.aws-ofi-nccl.configure_flags=--disable-tests"),
     ["plugin-disable-tests"]),
    # efa-bundled-plugin: from EFA installer 1.38 the installer ships the plugin.
    ("pt25-cu124", ("stages.efa.version=1.37.9",), []),
    ("pt25-cu124", ("stages.efa.version=1.38.0",), ["efa-bundled-plugin"]),
    # plugin-platform-aws: the flag exists from 1.6.0 ...
    ("efa-nccl", ("stages.aws-ofi-nccl.version=1.6.0", PLATFORM_AWS), []),
    ("efa-nccl", ("stages.aws-ofi-nccl.version=1.5.9", PLATFORM_AWS), ["plugin-platform-aws"]),
    # ... from 1.8.0 needs libfabric 1.18 (EFA 1.25 bundles exactly 1.18, EFA 1.22 1.17) ...
    ("pt25-cu124", ("stages.efa.version=1.25.0",), []),
    ("pt25-cu124", ("stages.efa.version=1.22.0",), ["plugin-platform-aws"]),
    ("pt25-cu124", ("stages.efa.version=1.22.0", "stages.aws-ofi-nccl.version=1.7.9"), []),
    ("pt25-cu124", ("stages.efa.version=1.22.0", "stages.aws-ofi-nccl.version=1.8.0"),
     ["plugin-platform-aws"]),
    # ... and from 1.13.0 libfabric 1.22 (EFA 1.34 bundles exactly 1.22, EFA 1.32 1.21).
    ("pt25-cu124", ("stages.efa.version=1.34.0", "stages.aws-ofi-nccl.version=1.13.0"), []),
    ("pt25-cu124", ("stages.efa.version=1.32.0", "stages.aws-ofi-nccl.version=1.13.0"),
     ["plugin-platform-aws"]),
    ("pt25-cu124", ("stages.efa.version=1.32.0", "stages.aws-ofi-nccl.version=1.12.9"), []),
    # torchvision-pytorch: 0.11 is the release for PyTorch 1.10, not 0.10 or 0.12.
    ("smddp", ("stages.torchvision.version=0.11.0",), []),
    ("smddp", ("stages.torchvision.version=0.10.0",), ["torchvision-pytorch"]),
    ("smddp", ("stages.torchvision.version=0.12.0",), ["torchvision-pytorch"]),
    # base-cuda: the base image's CUDA is image.cuda.
    ("efa-nccl", ("image.cuda=11.1",), []),
    ("efa-nccl", ("image.cuda=11.2",), ["base-cuda"]),
    ("efa-nccl", ("image.cuda=11.0",), ["base-cuda"]),
    # ptx-arch: the PTX arch must be in the list.
    ("smddp", ("stages.pytorch.ptx_arch=8.0",), []),
    ("smddp", ("stages.pytorch.ptx_arch=8.6",), ["ptx-arch"]),
]


@pytest.mark.parametrize(("name", "overrides", "broken"), LIMITS,
                         ids=[f"{n} {' '.join(o)}" for n, o, _ in LIMITS])
def test_each_rule_at_its_exact_limit(name: str, overrides: tuple[str, ...],
                                      broken: list[str]) -> None:
    assert refused(manifest(name, *overrides)) == broken


def with_installers(tmp_path: Path, installers: dict[str, str]) -> Mapping[str, Stage]:
    """The registry with more EFA installers (version -> the libfabric it bundles)."""
    rows = "".join(f'"{version}" = "{libfabric}"\n' for version, libfabric in installers.items())
    return changed(tmp_path, "efa", "[efa.libfabric]\n", "[efa.libfabric]\n" + rows)


@pytest.mark.parametrize(("plugin", "at_floor", "below_floor"), [
    ("1.1.0", "1.11.0", "1.10.9"),   # aws-ofi-nccl 1.1.0 on: libfabric 1.11.0
    ("1.12.1", "1.11.0", "1.10.9"),
    ("1.0.0", "1.9.0", "1.8.9"),     # aws-ofi-nccl 1.0.x: libfabric 1.9.0
])
def test_plugin_libfabric_at_its_exact_floor(tmp_path: Path, plugin: str, at_floor: str,
                                             below_floor: str) -> None:
    registry = with_installers(tmp_path, {"0.98": at_floor, "0.97": below_floor})
    base = ("stages.nccl.version=2.17.1", NO_FLAGS, f"stages.aws-ofi-nccl.version={plugin}")

    assert refused(manifest("efa-nccl", *base, "stages.efa.version=0.98.0"),
                   registry=registry) == []
    assert refused(manifest("efa-nccl", *base, "stages.efa.version=0.97.0"),
                   registry=registry) == ["plugin-libfabric"]


def test_platform_aws_libfabric_at_its_exact_floor(tmp_path: Path) -> None:
    registry = with_installers(tmp_path, {"0.98": "1.22.0", "0.97": "1.21.9"})
    plugin = ("stages.aws-ofi-nccl.version=1.13.0", PLATFORM_AWS)

    assert refused(manifest("pt25-cu124", *plugin, "stages.efa.version=0.98.0"),
                   registry=registry) == []
    assert refused(manifest("pt25-cu124", *plugin, "stages.efa.version=0.97.0"),
                   registry=registry) == ["plugin-platform-aws"]


def test_the_installer_that_bundles_the_plugin_starts_at_1_38() -> None:
    at, before = known_efa("1.38.0"), known_efa("1.37.0")
    assert at is not None
    assert before is not None
    assert (at.bundles_plugin, before.bundles_plugin) == (True, False)


def test_the_with_nccl_note_starts_at_1_5_0() -> None:
    flags = "stages.aws-ofi-nccl.configure_flags=--with-nccl=/opt/nccl"
    assert len(notes(manifest("efa-nccl", "stages.aws-ofi-nccl.version=1.5.0", flags),
                     registry=STAGES)) == 1
    assert notes(manifest("efa-nccl", "stages.aws-ofi-nccl.version=1.4.9", flags),
                 registry=STAGES) == []

"""NCCL "auto" under a wheel torch: the pin is the exact wheel's `nvidia-nccl-cuXX==V`, for the
image's variant, Python and platform, locked to NCCL's release tag `v{V}-1`. A real index on
127.0.0.1 serves torch wheels laid out as the wheel spec says (the real ones are 554 MB: the
one stand-in), and a real git repository carries the tags."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from imageforge.errors import SourceError
from imageforge.model.lockpin import Upstream
from imageforge.model.manifest import load
from imageforge.sources import upstream
from stages import STAGES, ncclwheelpin
from tests.gittags import tagged_repo
from tests.unit.test_wheelmeta import Index, build_wheel, serve

ROOT = Path(__file__).resolve().parents[2]
X86 = "cp311-cp311-manylinux_2_28_x86_64"
PAYLOAD = os.urandom(300_000)
IMAGE = {"python": "3.11", "platform": "linux/amd64", "cuda": "13.0"}


@pytest.fixture(scope="module")
def nccl_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    """A git repository with NCCL's tag names, and the commit each names."""
    return tagged_repo(tmp_path_factory.mktemp("nccl"), ("v2.29.3-1", "v2.30.7-1"))


def index_of(tmp_path: Path, wheels: dict[tuple[str, str], tuple[str, ...]]) -> Index:
    """(version, tag) -> the wheel's Requires-Dist."""
    files = {}
    for (version, tag), requires in wheels.items():
        # Incompressible bytes, so that reading only what the pin needs is measurable.
        path = build_wheel(tmp_path, version, tag, requires=requires, project="torch",
                           payload=PAYLOAD)
        files[path.name] = path.read_bytes()
    return Index(files=files, project="torch", advertise="no")


@pytest.fixture
def pypi(tmp_path: Path) -> Iterator[Index]:
    """PyPI's layout: one plain wheel per release, cu130 for 2.14.1."""
    state = index_of(tmp_path, {
        ("2.14.1", X86): ('nvidia-nccl-cu13==2.30.7; platform_system == "Linux"', "filelock"),
        ("2.14.1", "cp311-cp311-manylinux_2_28_aarch64"): ("nvidia-nccl-cu13==2.30.6",),
        ("2.14.1", "cp312-cp312-manylinux_2_28_x86_64"): ("nvidia-nccl-cu13==2.30.5",),
        ("2.13.0", X86): ("filelock",),
        ("2.12.0", X86): ("nvidia-nccl-cu13==2.29.9",),
    })
    with serve(state) as served:
        yield served


@pytest.fixture
def per_variant(tmp_path: Path) -> Iterator[Index]:
    """download.pytorch.org's layout: the variant in each wheel's local version."""
    state = index_of(tmp_path, {
        ("2.14.1+cu126", X86): ("nvidia-nccl-cu12==2.29.3",),
        ("2.14.1+cu130", X86): ("nvidia-nccl-cu13==2.30.7",),
    })
    with serve(state) as served:
        yield served


def resolve(index: Index, repo: str, image: dict[str, str] | None = None,
            **pytorch: str) -> dict[str, object]:
    inputs = {"version": "2.14.1", "provider": "wheel", "index": index.url, **pytorch}
    where = Upstream(locate=lambda url: url, mirrors=Path("/nonexistent"))
    return dict(ncclwheelpin.resolve(image or IMAGE, inputs, repo, where))


def test_the_pin_is_the_wheels_requirement_locked_to_its_release_tag(
        pypi: Index, nccl_repo: tuple[str, dict[str, str]]) -> None:
    repo, commits = nccl_repo
    pin = resolve(pypi, repo)
    assert (pin["version"], pin["commit"]) == ("2.30.7", commits["v2.30.7-1"])
    evidence = pin["evidence"]
    assert isinstance(evidence, dict)
    assert evidence["wheel"] == f"torch-2.14.1-{X86}.whl"
    assert evidence["requires"] == "nvidia-nccl-cu13==2.30.7"
    assert evidence["tag"] == "v2.30.7-1"
    # Read by byte ranges: no .metadata file is advertised, and the wheel was not fetched whole.
    wheel = f"torch-2.14.1-{X86}.whl"
    assert pypi.served[f"/files/{wheel}"] < 100_000 < len(pypi.files[wheel])
    assert all("Range" in headers for headers in pypi.requests_for(wheel))


def test_the_variant_picks_its_own_wheel_on_a_per_variant_index(
        per_variant: Index, nccl_repo: tuple[str, dict[str, str]]) -> None:
    repo, commits = nccl_repo
    assert resolve(per_variant, repo)["version"] == "2.30.7"   # cu130 from image.cuda 13.0
    pin = resolve(per_variant, repo, variant="cu126")
    assert (pin["version"], pin["commit"]) == ("2.29.3", commits["v2.29.3-1"])


def test_a_plain_wheel_for_another_cuda_major_is_refused(
        pypi: Index, nccl_repo: tuple[str, dict[str, str]]) -> None:
    with pytest.raises(SourceError, match=r"stages\.pytorch\.variant is cu126, but "
                                          r"torch-2\.14\.1-.* is built for CUDA 13"):
        resolve(pypi, nccl_repo[0], variant="cu126")


def test_a_wheel_that_pins_no_nccl_is_an_error_naming_the_key(
        pypi: Index, nccl_repo: tuple[str, dict[str, str]]) -> None:
    with pytest.raises(SourceError, match=r'stages\.nccl\.version = "auto": '
                                          r"torch-2\.13\.0-.*requires no nvidia-nccl"):
        resolve(pypi, nccl_repo[0], version="2.13.0")


def test_an_nccl_version_without_a_release_tag_is_an_error_naming_the_repo(
        pypi: Index, nccl_repo: tuple[str, dict[str, str]]) -> None:
    with pytest.raises(SourceError, match=r"torch 2\.12\.0 pins NCCL 2\.29\.9 .*"
                                          r"stages\.nccl\.repo .* has no release tag v2\.29\.9-1"):
        resolve(pypi, nccl_repo[0], version="2.12.0")


def test_no_wheel_for_the_images_python_is_an_error(
        pypi: Index, nccl_repo: tuple[str, dict[str, str]]) -> None:
    with pytest.raises(SourceError, match=r"torch 2\.14\.1 has no wheel for Python 3\.10"):
        resolve(pypi, nccl_repo[0], {**IMAGE, "python": "3.10"})


def test_the_platform_decides_the_wheel(pypi: Index,
                                        nccl_repo: tuple[str, dict[str, str]]) -> None:
    with pytest.raises(SourceError, match=r"no release tag v2\.30\.6-1"):
        resolve(pypi, nccl_repo[0], {**IMAGE, "platform": "linux/arm64"})


def test_an_index_that_does_not_answer_is_an_error(
        nccl_repo: tuple[str, dict[str, str]]) -> None:
    closed = Index(files={}, url="http://127.0.0.1:9/simple")
    with pytest.raises(SourceError, match=r"cannot read http://127\.0\.0\.1:9/simple/torch/"):
        resolve(closed, nccl_repo[0])


def test_lock_upgrade_reads_torch_releases_from_the_wheel_index(pypi: Index) -> None:
    """`lock --upgrade` with a policy proposes the newest torch release the index has wheels
    for; the closure and the NCCL pin then follow from the new version."""
    manifest = load(ROOT / "manifests" / "real-pytorch.toml",
                    (f"stages.pytorch.index={pypi.url}", "stages.pytorch.version=2.12.0",
                     "stages.pytorch.policy=>=2.12,<2.14"), registry=STAGES)
    found = upstream.upgrades(manifest, STAGES, ["pytorch"], upstream.Endpoints())
    assert [(u.stage, u.old, u.new) for u in found] == [("pytorch", "2.12.0", "2.13.0")]
    assert pypi.url in found[0].source

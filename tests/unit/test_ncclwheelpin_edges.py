"""stages/ncclwheelpin.py in full: every field of the pins it writes, the index URL as the
manifest may give it (a trailing slash, credentials), markers judged for the image rather than
this host, and each refusal's whole sentence. Real indexes on 127.0.0.1 (tests/unit/
test_wheelmeta.py's, and a plain one that publishes no hashes) and a real git repository."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from imageforge.errors import SourceError
from imageforge.model.lockpin import Upstream
from stages import ncclwheelpin
from tests.gittags import tagged_repo
from tests.unit.test_wheelmeta import Index, build_wheel, serve
from tests.unit.test_wheelmeta_edges import Scripted, scripted

X86 = "cp311-cp311-manylinux_2_28_x86_64"
NCCL_X86 = "py3-none-manylinux_2_18_x86_64"
IMAGE = {"python": "3.11", "platform": "linux/amd64", "cuda": "13.0"}
TORCH = f"torch-2.14.1-{X86}.whl"
NCCL = f"nvidia_nccl_cu13-2.30.7-{NCCL_X86}.whl"


@pytest.fixture(scope="module")
def nccl_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    """A git repository with NCCL's tag names, and the commit each names."""
    return tagged_repo(tmp_path_factory.mktemp("nccl"), ("v2.30.5-1", "v2.30.7-1"))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """PyPI's layout: torch wheels (one requiring NCCL per machine by marker, for Python 3.12
    on arm64; one requiring none) and the NCCL wheel they pin."""
    folder, found = tmp_path_factory.mktemp("wheels"), {}
    for project, version, tag, requires in [
            ("torch", "2.14.1", X86, ('nvidia-nccl-cu13==2.30.7; platform_system == "Linux"',)),
            ("torch", "2.14.1", "cp312-cp312-manylinux_2_28_aarch64",
             ('nvidia-nccl-cu13==2.30.5; platform_machine == "x86_64"',
              'nvidia-nccl-cu13==2.30.7; platform_machine == "aarch64" and '
              'python_version == "3.12"')),
            ("torch", "2.13.0", X86, ("filelock",)),
            ("nvidia_nccl_cu13", "2.30.7", NCCL_X86, ())]:
        path = build_wheel(folder, version, tag, requires=requires, project=project)
        found[path.name] = path.read_bytes()
    return found


@pytest.fixture
def index(files: dict[str, bytes]) -> Iterator[Index]:
    with serve(Index(files=files, project="torch", also=("nvidia-nccl-cu13",),
                     advertise="no")) as served:
        yield served


class Asked:
    """Upstream.locate that keeps every URL it was asked to locate, and moves an index at
    /simpleX (a name ending in what a sloppy strip would take) to the server's /simple."""

    def __init__(self) -> None:
        self.urls: list[str] = []

    def __call__(self, url: str) -> str:
        self.urls.append(url)
        return url.replace("/simpleX", "/simple")


def inputs(index: str, **pytorch: str) -> dict[str, str]:
    return {"version": "2.14.1", "provider": "wheel", "index": index, **pytorch}


def test_origin_is_what_picks_the_wheel() -> None:
    assert ncclwheelpin.origin(IMAGE, inputs("https://pypi.org/simple")) == {
        "provider": "wheel", "pytorch_version": "2.14.1", "variant": "cu130",
        "index": "https://pypi.org/simple", "python": "3.11", "platform": "linux/amd64"}


def test_the_source_pin_in_full(index: Index, nccl_repo: tuple[str, dict[str, str]]) -> None:
    # The manifest's index with credentials and a trailing slash: read without the slash,
    # written without the credentials.
    given = index.url.replace("http://", "http://lock:s3cret@") + "X/"
    asked = Asked()
    repo, commits = nccl_repo
    pin = ncclwheelpin.resolve(IMAGE, inputs(given), repo,
                               Upstream(locate=asked, mirrors=Path("/nonexistent")))
    shown = index.url.replace("http://", "http://***@") + "X"
    assert pin == {"version": "2.30.7", "commit": commits["v2.30.7-1"], "evidence": {
        "method": "wheel", "wheel": TORCH,
        "wheel_sha256": hashlib.sha256(index.files[TORCH]).hexdigest(),
        "requires": "nvidia-nccl-cu13==2.30.7", "index": shown, "tag": "v2.30.7-1",
        "nccl_repo": repo}}
    assert asked.urls == [given.removesuffix("/"), repo]


def test_the_wheel_pin_in_full(index: Index) -> None:
    given = index.url + "X/"
    asked = Asked()
    pin = ncclwheelpin.resolve_wheel(IMAGE, inputs(given),
                                     Upstream(locate=asked, mirrors=Path("/nonexistent")))
    base = index.url.removesuffix("/simple")
    assert pin == {
        "version": "2.30.7", "wheel_url": f"{base}/files/{NCCL}",
        "sha256": hashlib.sha256(index.files[NCCL]).hexdigest(),
        "evidence": {"method": "wheel", "wheel": TORCH,
                     "wheel_sha256": hashlib.sha256(index.files[TORCH]).hexdigest(),
                     "requires": "nvidia-nccl-cu13==2.30.7", "index": index.url + "X",
                     "nccl_wheel": NCCL}}
    assert asked.urls == [index.url + "X", index.url + "X"]


def test_markers_are_judged_for_the_image_not_this_host(
        index: Index, nccl_repo: tuple[str, dict[str, str]]) -> None:
    # This host is x86_64 and may run another Python: the image is arm64 with Python 3.12.
    image = {"python": "3.12", "platform": "linux/arm64", "cuda": "13.0"}
    where = Upstream(locate=Asked(), mirrors=Path("/nonexistent"))
    pin = ncclwheelpin.resolve(image, inputs(index.url), nccl_repo[0], where)
    assert (pin["version"], pin["evidence"]["requires"]) == ("2.30.7", "nvidia-nccl-cu13==2.30.7")


def test_without_a_cuda_variant_the_plain_wheel_is_taken_as_it_is(
        index: Index, nccl_repo: tuple[str, dict[str, str]]) -> None:
    where = Upstream(locate=Asked(), mirrors=Path("/nonexistent"))
    image = {"python": "3.11", "platform": "linux/amd64"}
    assert ncclwheelpin.origin(image, inputs(index.url))["variant"] is None
    assert ncclwheelpin.resolve(image, inputs(index.url), nccl_repo[0], where)["version"] == \
        "2.30.7"


def test_the_refusals_in_full(index: Index, nccl_repo: tuple[str, dict[str, str]]) -> None:
    where = Upstream(locate=Asked(), mirrors=Path("/nonexistent"))
    repo = nccl_repo[0]
    with pytest.raises(SourceError) as error:
        ncclwheelpin.resolve(IMAGE, inputs(index.url, version="2.13.0"), repo, where)
    assert str(error.value) == (
        f'stages.nccl.version = "auto": torch-2.13.0-{X86}.whl requires no nvidia-nccl-cuXX '
        "wheel, so it pins no NCCL; set stages.nccl.version to the NCCL to build, with provider "
        '= "source".')
    with pytest.raises(SourceError) as error:
        ncclwheelpin.resolve(IMAGE, inputs(index.url, variant="cu126"), repo, where)
    assert str(error.value) == (
        f"stages.pytorch.variant is cu126, but {TORCH} is built for CUDA 13 (it requires "
        "nvidia-nccl-cu13); use a per-variant index in stages.pytorch.index or the variant the "
        "wheel is built for.")
    empty = Path(repo).parent / "empty"
    subprocess.run(["git", "init", "-q", str(empty)], check=True)
    with pytest.raises(SourceError) as error:
        ncclwheelpin.resolve(IMAGE, inputs(index.url), str(empty), where)
    message = str(error.value)
    assert message.startswith(
        f'stages.nccl.version = "auto": torch 2.14.1 pins NCCL 2.30.7 (nvidia-nccl-cu13), but '
        f"stages.nccl.repo {empty} has no release tag v2.30.7-1 (")
    assert message.endswith("); point stages.nccl.repo at NCCL's repository or set "
                            "stages.nccl.version.")


def test_an_index_without_torch_names_the_project_it_looked_for(
        nccl_repo: tuple[str, dict[str, str]]) -> None:
    with serve(Index(files={}, project="other")) as empty, pytest.raises(SourceError) as error:
        ncclwheelpin.resolve(IMAGE, inputs(empty.url), nccl_repo[0],
                             Upstream(locate=Asked(), mirrors=Path("/nonexistent")))
    assert str(error.value) == (f"cannot read {empty.url}/torch/ (it answered 404 Not Found "
                                "for torch); check the network or the index and retry.")


def test_an_nccl_wheel_without_a_published_sha256_cannot_be_locked(
        files: dict[str, bytes]) -> None:
    """A plain file server's pages: links without #sha256, and no byte ranges."""
    pages = {"/simple/torch/": f'<a href="/files/{TORCH}">{TORCH}</a>',
             "/simple/nvidia-nccl-cu13/": f'<a href="/files/{NCCL}">{NCCL}</a>'}

    def answer(path: str, _headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if path in pages:
            return 200, {"Content-Type": "text/html"}, pages[path].encode()
        name = path.removeprefix("/files/")
        return (200, {}, files[name]) if name in files else (404, {}, b"")

    with scripted(Scripted(answer)) as server, pytest.raises(SourceError) as error:
        ncclwheelpin.resolve_wheel(
            IMAGE, inputs(server.url.replace("http://", "http://u:pw@") + "/simple"),
            Upstream(locate=Asked(), mirrors=Path("/nonexistent")))
    shown = server.url.replace("http://", "http://***@")
    assert str(error.value) == (
        f'stages.nccl.provider = "wheel": {shown}/simple gives no sha256 for {NCCL}, so it '
        "cannot be locked; use an index that publishes hashes (PyPI, download.pytorch.org) in "
        "stages.pytorch.index.")

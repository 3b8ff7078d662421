"""Pip requirements locked to versions and hashes: resolved by uv against a real PEP 503 index
on 127.0.0.1 made of real wheels, for the image's Python (not the host's)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from imageforge.errors import LockError
from imageforge.model.manifest import load
from imageforge.sources import piplock
from stages import STAGES
from tests.servers import serve_directory

SAMPLE = Path("manifests/sample.toml")


def _wheel(dist: Path, name: str, version: str, requires: tuple[str, ...] = (),
           requires_python: str | None = None) -> Path:
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    if requires_python:
        metadata += f"Requires-Python: {requires_python}\n"
    files = {f"{name}/__init__.py": "", f"{info}/METADATA": metadata,
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    record = ""
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record += f"{path},sha256={digest.decode()},{len(text)}\n"
    files[f"{info}/RECORD"] = record + f"{info}/RECORD,,\n"
    wheel = dist / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """alpha 1.0 needs beta; beta 2.0 needs Python >= 3.10, beta 1.0 does not."""
    root = tmp_path_factory.mktemp("index")
    files = root / "files"
    files.mkdir()
    wheels = [_wheel(files, "alpha", "1.0", ("beta>=1",)), _wheel(files, "beta", "1.0"),
              _wheel(files, "beta", "2.0", requires_python=">=3.10")]
    digests = {w.name: "sha256:" + hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels}
    for project in ("alpha", "beta"):
        page = root / "simple" / project
        page.mkdir(parents=True)
        links = "".join(
            f'<a href="../../files/{w.name}#sha256={digests[w.name][7:]}"'
            + (' data-requires-python="&gt;=3.10"' if w.name.startswith("beta-2.0") else "")
            + f">{w.name}</a>\n" for w in wheels if w.name.startswith(project + "-"))
        (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    with serve_directory(str(root)) as url:
        yield f"{url}/simple", digests


def test_resolves_dependencies_to_versions_and_sha256_of_the_index(
        index: tuple[str, dict[str, str]]) -> None:
    url, digests = index
    packages = piplock.resolve("demo", ["alpha"], python="3.11", platform="linux/amd64",
                               index_url=url)
    assert packages == [
        {"name": "alpha", "version": "1.0", "hashes": [digests["alpha-1.0-py3-none-any.whl"]]},
        {"name": "beta", "version": "2.0", "hashes": [digests["beta-2.0-py3-none-any.whl"]]},
    ]


def test_resolves_for_the_images_python_not_the_hosts(index: tuple[str, dict[str, str]]) -> None:
    url, _ = index
    packages = piplock.resolve("demo", ["alpha"], python="3.8", platform="linux/amd64",
                               index_url=url)
    assert {p["name"]: p["version"] for p in packages} == {"alpha": "1.0", "beta": "1.0"}


def test_unsatisfiable_requirements_are_a_lock_error_naming_the_stage(
        index: tuple[str, dict[str, str]]) -> None:
    url, _ = index
    with pytest.raises(LockError, match=r"^stages\.demo: pip requirements beta>=3 have no "
                                        r"solution for Python 3\.11"):
        piplock.resolve("demo", ["beta>=3"], python="3.11", platform="linux/amd64",
                        index_url=url)


def test_parses_uvs_hashed_requirements() -> None:
    text = ("six==1.17.0 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n"
            "boto3==1.44.8 \\\n    --hash=sha256:cc\n")
    assert piplock.parse(text) == [
        {"name": "boto3", "version": "1.44.8", "hashes": ["sha256:cc"]},
        {"name": "six", "version": "1.17.0", "hashes": ["sha256:aa", "sha256:bb"]},
    ]


def test_smddp_resolves_its_packages_with_the_toolkits_pins() -> None:
    manifest = load(SAMPLE, ('stages.smddp.pip_packages=["sagemaker-pytorch-training"]',),
                    registry=STAGES)
    context = piplock.context(manifest, STAGES)
    assert piplock.requirements(STAGES["smddp"], context) == [
        "sagemaker-training==5.1.4", "sagemaker-pytorch-training==3.0.0",
        "sagemaker-pytorch-training"]
    recipe = STAGES["smddp"].recipe(context)
    assert "-r /opt/imageforge/pip/smddp.txt" in recipe
    assert " -U " not in recipe

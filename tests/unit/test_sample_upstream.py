"""The sample upstream generator: determinism, archive and wheel format, git history."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from sample.archive import FIXED_EPOCH
from sample.generate import NCCL_FIX_LABEL, Patch, apply_patches, generate
from sample.templates import SourceFile, TemplateError, render_text


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("upstream")
    generate(out)
    return out


@pytest.fixture(scope="module")
def pins(upstream: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((upstream / "pins.json").read_text())
    return data


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "--git-dir", str(repo), *args], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_generating_twice_gives_identical_bytes(upstream: Path, tmp_path: Path) -> None:
    other = tmp_path / "again"
    generate(other)
    assert (other / "pins.json").read_text() == (upstream / "pins.json").read_text()
    assert tree_bytes(other / "files") == tree_bytes(upstream / "files")
    assert tree_bytes(other / "git") == tree_bytes(upstream / "git")


def test_regenerating_in_place_is_idempotent(tmp_path: Path) -> None:
    first = generate(tmp_path)
    before = tree_bytes(tmp_path)
    assert generate(tmp_path) == first
    assert tree_bytes(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["files", "git", "pins.json"]


def test_pins_cover_every_file_with_its_sha256(upstream: Path, pins: dict[str, Any]) -> None:
    served = sorted(p.name for p in (upstream / "files").iterdir())
    assert sorted(pins["files"]) == served
    assert served == [
        "aws-efa-installer-1.11.2.tar.gz",
        "aws-efa-installer-1.14.1.tar.gz",
        "aws-efa-installer-1.15.1.tar.gz",
        "boost_1_73_0.tar.gz",
        "boost_1_74_0.tar.gz",
        "smdistributed_dataparallel-1.4.0-cp311-cp311-linux_x86_64.whl",
        "smdistributed_dataparallel-1.4.1-cp311-cp311-linux_x86_64.whl",
    ]
    for name, pin in pins["files"].items():
        data = (upstream / "files" / name).read_bytes()
        assert pin["url"] == f"/files/{name}"
        assert pin["sha256"] == hashlib.sha256(data).hexdigest()
        assert pin["size"] == len(data)
        assert len(data) < 64 * 1024, "sample artifacts stay small"


def test_efa_pins_record_the_bundled_libfabric(pins: dict[str, Any]) -> None:
    bundled = {
        pin["meta"]["version"]: pin["meta"]["libfabric"]
        for name, pin in pins["files"].items()
        if name.startswith("aws-efa-installer")
    }
    assert bundled == {"1.11.2": "1.11.1", "1.14.1": "1.13.2", "1.15.1": "1.14.0"}


def test_tarballs_are_reproducible_archives(upstream: Path) -> None:
    raw = (upstream / "files" / "aws-efa-installer-1.14.1.tar.gz").read_bytes()
    assert raw[4:8] == b"\0\0\0\0", "gzip header mtime must be 0"
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert all(n == "aws-efa-installer" or n.startswith("aws-efa-installer/") for n in names)
    assert {(m.uid, m.gid, m.mtime) for m in members} == {(0, 0, FIXED_EPOCH)}
    modes = {m.name: m.mode for m in members}
    assert modes["aws-efa-installer/efa_installer.sh"] == 0o755
    assert modes["aws-efa-installer/src/libfabric/fabric.c"] == 0o644


def test_boost_tarball_top_dir_and_version_header(upstream: Path) -> None:
    with tarfile.open(upstream / "files" / "boost_1_74_0.tar.gz") as tar:
        names = tar.getnames()
        header = tar.extractfile("boost_1_74_0/boost/version.hpp")
        assert header is not None
        text = header.read().decode()
    assert {n.split("/")[0] for n in names} == {"boost_1_74_0"}
    assert "boost_1_74_0/bootstrap.sh" in names
    assert "#define BOOST_VERSION 107400" in text
    assert '#define BOOST_LIB_VERSION "1_74"' in text


def test_wheels_have_valid_metadata_and_record(upstream: Path) -> None:
    path = upstream / "files" / "smdistributed_dataparallel-1.4.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(path) as whl:
        names = whl.namelist()
        info = "smdistributed_dataparallel-1.4.0.dist-info"
        assert names[-1] == f"{info}/RECORD"
        wheel_meta = whl.read(f"{info}/WHEEL").decode()
        assert "Tag: cp311-cp311-linux_x86_64" in wheel_meta
        assert "Root-Is-Purelib: false" in wheel_meta
        assert "Version: 1.4.0" in whl.read(f"{info}/METADATA").decode()
        record = whl.read(f"{info}/RECORD").decode().splitlines()
        assert {z.date_time for z in whl.infolist()} == {(2022, 2, 18, 0, 0, 0)}
        for line in record:
            name, digest, size = line.rsplit(",", 2)
            if name.endswith("RECORD"):
                assert digest == size == ""
                continue
            data = whl.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + expected.decode()
            assert int(size) == len(data)
        library = whl.read("smdistributed/dataparallel/lib/libsmddp.so")
    assert library.startswith(b"\x7fELF"), "the wheel ships a compiled library"
    assert b"GCC:" not in library, "no compiler ident: the bytes are pinned"
    assert "smdistributed/dataparallel/torch/__init__.py" in names


def test_nccl_history_tags_and_post_release_fix(upstream: Path, pins: dict[str, Any]) -> None:
    repo = upstream / "git" / "nccl.git"
    nccl = pins["repos"]["nccl"]
    assert set(nccl["tags"]) == {"v2.7.8-1", "inc_nsteps", "v2.10.3-1", "v2.11.4-1"}
    for tag in ("v2.7.8-1", "v2.10.3-1", "v2.11.4-1"):
        assert git(repo, "cat-file", "-t", tag) == "tag", f"{tag} is annotated"
        assert git(repo, "rev-parse", f"{tag}^{{commit}}") == nccl["tags"][tag]
    fix = nccl["commits"][NCCL_FIX_LABEL]
    assert fix not in nccl["tags"].values(), "the post-release fix is not tagged"
    assert git(repo, "rev-parse", f"{fix}~1") == nccl["tags"]["v2.10.3-1"]
    assert git(repo, "describe", "--tags", fix) == f"v2.10.3-1-1-g{fix[:7]}"
    version_mk = git(repo, "show", f"{fix}:makefiles/version.mk")
    assert version_mk.splitlines() == [
        "##### version",
        "NCCL_MAJOR   := 2",
        "NCCL_MINOR   := 10",
        "NCCL_PATCH   := 3",
        "NCCL_SUFFIX  :=",
        "PKG_REVISION := 1",
    ]
    assert git(repo, "diff", "--name-only", "v2.10.3-1", fix) == "src/group.cc"


def test_nccl_version_code_scheme_follows_the_release(upstream: Path) -> None:
    repo = upstream / "git" / "nccl.git"
    assert '"%d%d%02d"' in git(repo, "show", "v2.7.8-1:src/Makefile")
    assert '"%d%02d%02d"' in git(repo, "show", "v2.10.3-1:src/Makefile")
    assert "(X) * 10000" not in git(repo, "show", "v2.7.8-1:src/nccl.h.in")
    assert "(X) * 10000" in git(repo, "show", "v2.10.3-1:src/nccl.h.in")


def test_pytorch_pins_nccl_through_a_real_submodule(upstream: Path, pins: dict[str, Any]) -> None:
    repo = upstream / "git" / "pytorch.git"
    nccl = pins["repos"]["nccl"]
    expected = {"v1.10.2": nccl["tags"]["v2.10.3-1"], "v1.11.0": nccl["commits"][NCCL_FIX_LABEL]}
    for tag, sha in expected.items():
        entry = git(repo, "ls-tree", tag, "third_party/nccl/nccl")
        assert entry == f"160000 commit {sha}\tthird_party/nccl/nccl"
        assert pins["repos"]["pytorch"]["submodules"][tag] == {"third_party/nccl/nccl": sha}
    gitmodules = git(repo, "show", "v1.10.2:.gitmodules")
    assert "url = ../nccl.git" in gitmodules
    assert git(repo, "show", "v1.11.0:version.txt") == "1.11.0"


def test_every_repository_has_its_tags(pins: dict[str, Any]) -> None:
    tags = {name: sorted(repo["tags"]) for name, repo in pins["repos"].items()}
    assert tags == {
        "aws-ofi-nccl": ["v1.1.1", "v1.1.3-aws", "v1.2.0-aws"],
        "nccl": ["inc_nsteps", "v2.10.3-1", "v2.11.4-1", "v2.7.8-1"],
        "nccl-tests": ["v2.0.0", "v2.11.0"],
        "pytorch": ["v1.10.2", "v1.11.0"],
        "vision": ["v0.11.3", "v0.12.0", "v0.9.1"],
    }
    for repo in pins["repos"].values():
        assert all(len(sha) == 40 for sha in repo["tags"].values())
        assert repo["head"] in repo["commits"].values()


def test_head_is_the_newest_commit(upstream: Path, pins: dict[str, Any]) -> None:
    for name, repo in pins["repos"].items():
        assert git(upstream / "git" / f"{name}.git", "rev-parse", "HEAD") == repo["head"]


def test_repositories_allow_fetching_by_sha(upstream: Path) -> None:
    config = git(upstream / "git" / "nccl.git", "config", "--list")
    assert "uploadpack.allowanysha1inwant=true" in config
    assert "uploadpack.allowreachablesha1inwant=true" in config


def test_commits_are_fixed_in_author_and_date(upstream: Path) -> None:
    log = git(upstream / "git" / "vision.git", "log", "--format=%an <%ae>|%aI|%cI", "main")
    who = "Sample Upstream <upstream@sample.invalid>"
    days = ["2022-03-10", "2022-01-27", "2021-03-25"]
    assert log.splitlines() == [f"{who}|{d}T00:00:00+00:00|{d}T00:00:00+00:00" for d in days]


def test_template_with_unknown_variable_fails() -> None:
    with pytest.raises(TemplateError, match="@@MISSING@@"):
        render_text("a @@MISSING@@ b", {}, "origin")
    assert render_text("${x} @@A@@ $(y) @z@", {"A": "1"}, "o") == "${x} 1 $(y) @z@"


def test_patch_that_no_longer_matches_fails() -> None:
    files = [SourceFile("a.c", b"int x;\n", 0o644)]
    with pytest.raises(ValueError, match="exactly once"):
        apply_patches(files, [Patch("a.c", "int y;", "int z;")])


def test_cli_generate_writes_the_same_pins(upstream: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sample", "generate", "--out", str(tmp_path / "cli")],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "wrote 7 files and 5 repositories" in proc.stdout
    assert (tmp_path / "cli" / "pins.json").read_bytes() == (upstream / "pins.json").read_bytes()

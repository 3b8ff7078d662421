"""The sample upstream's HTTP server: files with ranges, git smart HTTP, fetch by SHA."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sample.generate import NCCL_FIX_LABEL
from sample.serve import ByteRange, ServerHandle, parse_range, start_server

WHEEL = "smdistributed_dataparallel-1.4.0-cp311-cp311-linux_x86_64.whl"


@pytest.fixture(scope="module")
def upstream(sample_dir: Path) -> Path:
    """The session's sample upstream (tests/unit/conftest.py); these tests only read it."""
    return sample_dir


@pytest.fixture(scope="module")
def pins(upstream: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((upstream / "pins.json").read_text())
    return data


@pytest.fixture(scope="module")
def server(upstream: Path) -> Iterator[ServerHandle]:
    with start_server(upstream) as handle:
        yield handle


def git_env() -> dict[str, str]:
    """An environment where no user or system git config (credential helpers) takes part."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0")
    return env


def git(*args: str, cwd: Path | None = None) -> str:
    out = subprocess.run(
        ["git", *args], cwd=cwd, env=git_env(), capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_server_handle_reports_its_address(server: ServerHandle) -> None:
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"


def test_head_reports_length_without_body(server: ServerHandle, upstream: Path) -> None:
    size = (upstream / "files" / WHEEL).stat().st_size
    resp = requests.head(f"{server.url}/files/{WHEEL}", timeout=10)
    assert resp.status_code == 200
    assert resp.headers["Content-Length"] == str(size)
    assert resp.headers["Accept-Ranges"] == "bytes"
    assert resp.content == b""


def test_get_returns_the_pinned_bytes(
    server: ServerHandle, upstream: Path, pins: dict[str, Any]
) -> None:
    for name, pin in pins["files"].items():
        resp = requests.get(server.url + pin["url"], timeout=10)
        assert resp.status_code == 200
        assert resp.content == (upstream / "files" / name).read_bytes()
    assert requests.get(f"{server.url}/pins.json", timeout=10).json() == pins


def test_range_requests_get_206(server: ServerHandle, upstream: Path) -> None:
    data = (upstream / "files" / WHEEL).read_bytes()
    url = f"{server.url}/files/{WHEEL}"
    resp = requests.get(url, headers={"Range": "bytes=10-19"}, timeout=10)
    assert resp.status_code == 206
    assert resp.content == data[10:20]
    assert resp.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
    assert resp.headers["Content-Length"] == "10"
    resume = requests.get(url, headers={"Range": "bytes=100-"}, timeout=10)
    assert resume.status_code == 206
    assert resume.content == data[100:]
    suffix = requests.get(url, headers={"Range": "bytes=-7"}, timeout=10)
    assert suffix.status_code == 206
    assert suffix.content == data[-7:]
    beyond = requests.get(url, headers={"Range": f"bytes={len(data)}-"}, timeout=10)
    assert beyond.status_code == 416
    assert beyond.headers["Content-Range"] == f"bytes */{len(data)}"


def test_parse_range_forms() -> None:
    assert parse_range("", 100) is None
    assert parse_range("bytes=0-0", 100) == ByteRange(0, 0)
    assert parse_range("bytes=90-200", 100) == ByteRange(90, 99)
    assert parse_range("bytes=-200", 100) == ByteRange(0, 99)
    assert parse_range("bytes=0-1,5-6", 100) is None  # several ranges: whole file
    assert parse_range("bytes=100-", 100) == "unsatisfiable"


def test_missing_and_escaping_paths_are_404(server: ServerHandle) -> None:
    # Encoded dots survive the client's path normalisation and must be caught by the server.
    paths = (
        "/files/nope.tar.gz",
        "/files/%2e%2e/pins.json",
        "/files/..%2Fgit/nccl.git/config",
        "/",
        "/x",
    )
    for path in paths:
        assert requests.get(server.url + path, timeout=10).status_code == 404, path


def test_files_directory_is_an_autoindex_page(server: ServerHandle,
                                              pins: dict[str, Any]) -> None:
    page = requests.get(server.url + "/files/", timeout=10)
    assert page.status_code == 200
    assert page.headers["Content-Type"].startswith("text/html")
    assert re.findall(r'<a href="([^"]+)">', page.text) == sorted(pins["files"])


def test_ls_remote_lists_tags(server: ServerHandle, pins: dict[str, Any]) -> None:
    out = git("ls-remote", f"{server.url}/git/nccl.git")
    refs = {line.split("\t")[1]: line.split("\t")[0] for line in out.splitlines()}
    nccl = pins["repos"]["nccl"]
    for tag, sha in nccl["tags"].items():
        peeled = refs.get(f"refs/tags/{tag}^{{}}", refs[f"refs/tags/{tag}"])
        assert peeled == sha
    assert refs["refs/heads/main"] == nccl["head"]


def test_fetch_untagged_commit_by_sha(
    server: ServerHandle, pins: dict[str, Any], tmp_path: Path
) -> None:
    sha = pins["repos"]["nccl"]["commits"][NCCL_FIX_LABEL]
    git("init", "-q", str(tmp_path))
    git("fetch", "-q", "--depth", "1", f"{server.url}/git/nccl.git", sha, cwd=tmp_path)
    assert git("rev-parse", "FETCH_HEAD", cwd=tmp_path) == sha
    assert "NCCL_PATCH   := 3" in git("show", "FETCH_HEAD:makefiles/version.mk", cwd=tmp_path)


def test_protocol_v0_fetch_by_sha(
    server: ServerHandle, pins: dict[str, Any], tmp_path: Path
) -> None:
    sha = pins["repos"]["nccl"]["tags"]["v2.7.8-1"]
    git("init", "-q", str(tmp_path))
    git(
        "-c",
        "protocol.version=0",
        "fetch",
        "-q",
        "--depth",
        "1",
        f"{server.url}/git/nccl.git",
        sha,
        cwd=tmp_path,
    )
    assert git("rev-parse", "FETCH_HEAD", cwd=tmp_path) == sha


def test_clone_with_submodule_over_http(
    server: ServerHandle, pins: dict[str, Any], tmp_path: Path
) -> None:
    dest = tmp_path / "pytorch"
    git(
        "clone",
        "-q",
        "--recurse-submodules",
        "-b",
        "v1.10.2",
        f"{server.url}/git/pytorch.git",
        str(dest),
    )
    assert (
        git("ls-tree", "v1.10.2", "third_party/nccl/nccl", cwd=dest).split()[2]
        == (pins["repos"]["nccl"]["tags"]["v2.10.3-1"])
    )
    submodule = dest / "third_party" / "nccl" / "nccl"
    assert (submodule / "makefiles" / "version.mk").is_file()
    assert git("rev-parse", "HEAD", cwd=submodule) == pins["repos"]["nccl"]["tags"]["v2.10.3-1"]


def test_push_is_refused(server: ServerHandle, tmp_path: Path) -> None:
    git("clone", "-q", f"{server.url}/git/vision.git", str(tmp_path / "v"))
    proc = subprocess.run(
        ["git", "push", "origin", "HEAD:refs/heads/other"],
        cwd=tmp_path / "v",
        # LC_ALL=C: git translates its messages.
        env={**git_env(), "LC_ALL": "C"},
        capture_output=True,
        text=True,
        check=False,
    )
    # git http-backend refuses receive-pack to an unauthenticated client (403); git's own
    # exit code for a fatal error is 128.
    assert proc.returncode == 128, proc.stderr
    assert proc.stderr == (f"fatal: unable to access '{server.url}/git/vision.git/': "
                           "The requested URL returned error: 403\n")
    # And the server's repository really is unchanged.
    refs = git("ls-remote", f"{server.url}/git/vision.git").split()
    assert "refs/heads/main" in refs
    assert "refs/heads/other" not in refs


def test_file_url_clone_works_too(upstream: Path, pins: dict[str, Any], tmp_path: Path) -> None:
    dest = tmp_path / "tests"
    git("clone", "-q", "-b", "v2.11.0", f"file://{upstream}/git/nccl-tests.git", str(dest))
    assert git("rev-parse", "HEAD", cwd=dest) == pins["repos"]["nccl-tests"]["tags"]["v2.11.0"]


def test_stopped_server_refuses_connections(upstream: Path) -> None:
    handle = start_server(upstream)
    url = handle.url
    assert requests.head(f"{url}/pins.json", timeout=10).status_code == 200
    handle.stop()
    with pytest.raises(requests.ConnectionError):
        requests.head(f"{url}/pins.json", timeout=2)


def test_cli_serve_on_a_missing_directory_fails(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sample", "serve", "--dir", str(tmp_path), "--port", "0"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    assert proc.returncode == 1
    assert "run `python -m sample generate` first" in proc.stderr

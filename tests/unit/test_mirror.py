"""Air-gapped fetches through a mirror (a directory, or served over HTTP with a token) and URL
rewrite rules, against the served sample upstream."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.errors import ManifestError, SourceError
from imageforge.sources.mirror import Locations, Rewrite, parse_rewrites
from sample.serve import ServerHandle
from stages import STAGES
from tests.servers import ScriptedServer
from tests.unit.conftest import ROOT, sample_manifest

pytestmark = pytest.mark.usefixtures("isolated_git")

TOKEN = "mirror-secret-7f3a9c"
# pytorch's submodule (third_party/nccl/nccl, url ../nccl.git) must come from the mirror too.
SUBMODULES = ("stages.pytorch.submodules=true",)


def settings(manifest: Path, cache: str = "cache", **more: Any) -> Workspace:
    return Workspace(registry=STAGES, manifest=manifest, overrides=SUBMODULES,
                            cache_dir=manifest.parent / cache, **more)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def mirrored(sample_server: ServerHandle, tmp_path: Path) -> tuple[Path, Path]:
    """A locked sample manifest and its synced mirror; the upstream is stopped afterwards."""
    manifest = sample_manifest(tmp_path / "m", sample_server.url)
    project.write_lock(settings(manifest), upgrade=False)
    index = project.mirror_sync(settings(manifest), tmp_path / "mirror")
    sample_server.stop()
    return manifest, index.parent


class _TokenHandler(SimpleHTTPRequestHandler):
    """A plain static file server (no git on it) that wants a Bearer token."""

    seen: list[str | None]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_error(401)
            return
        super().do_GET()


@pytest.fixture
def served_mirror(mirrored: tuple[Path, Path]) -> Iterator[tuple[str, list[str | None]]]:
    seen: list[str | None] = []
    handler = type("Handler", (_TokenHandler,), {"seen": seen})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0),
                                functools.partial(handler, directory=str(mirrored[1])))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/", seen
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_sync_writes_every_source_and_an_index(mirrored: tuple[Path, Path],
                                               sample_pins: dict[str, Any]) -> None:
    _, mirror = mirrored
    index = json.loads((mirror / "index.json").read_text())
    files = {Path(url).name: entry for url, entry in index["files"].items()}
    for name in ("aws-efa-installer-1.14.1.tar.gz", "boost_1_73_0.tar.gz",
                 "smdistributed_dataparallel-1.4.0-cp311-cp311-linux_x86_64.whl"):
        assert files[name]["sha256"] == sample_pins["files"][name]["sha256"]
        assert sha256(mirror / files[name]["path"]) == files[name]["sha256"]
    repos = {url.rsplit("/", 1)[-1]: entry for url, entry in index["git"].items()}
    assert set(repos) == {"nccl.git", "aws-ofi-nccl.git", "nccl-tests.git", "pytorch.git",
                          "vision.git"}
    for entry in repos.values():
        bare = mirror / entry["path"]
        for commit in entry["commits"]:
            subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=bare,
                           check=True)


def test_fetch_uses_only_the_mirror_dir(mirrored: tuple[Path, Path], sample_pins: dict[str, Any],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    manifest, mirror = mirrored

    fetched = project.fetch(settings(manifest, "air-gapped", mirror=str(mirror)), "smddp")

    efa = fetched["src-efa"] / "aws-efa-installer-1.14.1.tar.gz"
    assert sha256(efa) == sample_pins["files"]["aws-efa-installer-1.14.1.tar.gz"]["sha256"]
    pytorch = fetched["src-pytorch"]
    assert (pytorch / "third_party/nccl/nccl/makefiles/version.mk").is_file()
    assert (fetched["src-nccl"] / "makefiles/version.mk").is_file()
    assert f"fetching {mirror.as_uri()}/" in capsys.readouterr().err


def test_an_http_mirror_gets_the_token_and_nothing_shows_it(
        mirrored: tuple[Path, Path], served_mirror: tuple[str, list[str | None]],
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    manifest, mirror = mirrored
    url, seen = served_mirror
    s = settings(manifest, "air-gapped", mirror=url)
    with pytest.raises(SourceError, match=r"index\.json answered 401"):
        project.fetch(s, "smddp")
    monkeypatch.setenv("IMAGEFORGE_MIRROR_TOKEN", TOKEN)

    fetched = project.fetch(s, "efa-nccl")

    assert (fetched["src-nccl-tests"] / "Makefile").is_file()
    assert seen.count(f"Bearer {TOKEN}") > 5
    written = [manifest.with_name("sample.lock.json"), mirror / "index.json",
               *(p for p in (manifest.parent / "air-gapped").rglob("*") if p.is_file())]
    assert all(TOKEN.encode() not in path.read_bytes() for path in written)
    output = capfd.readouterr()
    assert TOKEN not in output.out + output.err


def test_the_token_goes_to_the_mirror_host_only() -> None:
    with ScriptedServer() as mirror_host, ScriptedServer() as other_host:
        mirror_host.route("/x", b"x")
        other_host.route("/x", b"x")
        session = Locations(mirror=mirror_host.url("/"), token=TOKEN).session()
        assert session is not None
        with session:
            session.get(mirror_host.url("/x"), timeout=10)
            session.get(other_host.url("/x"), timeout=10)
        assert mirror_host.requests_for("/x")[0].headers["Authorization"] == f"Bearer {TOKEN}"
        assert "Authorization" not in other_host.requests_for("/x")[0].headers


def test_a_source_missing_from_the_mirror_is_named(
        sample_server: ServerHandle, tmp_path: Path) -> None:
    manifest = sample_manifest(tmp_path / "m", sample_server.url)
    project.write_lock(settings(manifest), upgrade=False)
    project.mirror_sync(settings(manifest), tmp_path / "mirror")
    newer = ("stages.boost.version=1.74.0", 'stages.boost.sha256=' + "0" * 64)
    s = Workspace(registry=STAGES,
                         manifest=manifest, overrides=newer, cache_dir=tmp_path / "c",
                         mirror=str(tmp_path / "mirror"))
    with pytest.raises(SourceError) as refused:
        project.fetch(s, "boost")
    assert "boost_1_74_0.tar.gz is not in the mirror" in str(refused.value)
    assert "invoke mirror.sync" in str(refused.value)
    with pytest.raises(ManifestError, match="without --mirror"):
        project.write_lock(s, upgrade=False)


def test_rewrite_rules_move_every_fetch_and_locks_keep_the_original_urls(
        sample_server: ServerHandle, tmp_path: Path) -> None:
    original = "http://upstream.invalid/sample"
    manifest = sample_manifest(tmp_path / "m", original,
                               {"[stages.efa]\n": '[stages.efa]\npolicy = "~=1.14"\n'})
    rules = (Rewrite(prefix=f"{original}/", replace=f"{sample_server.url}/"),)
    s = settings(manifest, rewrites=rules)

    lock_file, changes = project.write_lock(s, upgrade=True)
    fetched = project.fetch(s, "smddp")

    assert "efa: 1.14.1 -> 1.15.1 (policy ~=1.14)" in changes
    text = lock_file.read_text()
    assert sample_server.url not in text
    locked = json.loads(text)
    assert locked["stages"]["pytorch"]["src-pytorch"]["from"]["repo"] == \
        f"{original}/git/pytorch.git"
    assert locked["nccl_pytorch_pin"]["evidence"]["nccl_repo"] == f"{original}/git/nccl.git"
    assert locked["upgraded"]["efa"]["source"] == f"{original}/files/"
    assert (fetched["src-pytorch"] / "third_party/nccl/nccl/Makefile").is_file()
    assert (fetched["src-efa"] / "aws-efa-installer-1.15.1.tar.gz").is_file()


def test_rewrite_rules_come_from_the_invoke_config(sample_server: ServerHandle,
                                                  tmp_path: Path) -> None:
    original = "http://upstream.invalid/sample"
    manifest = sample_manifest(tmp_path / "m", original)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GIT_CONFIG_NOSYSTEM": "1",
           "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path / "cache"),
           "INVOKE_IMAGEFORGE_REWRITE": f"{original}/={sample_server.url}/"}
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "lock",
                             "--manifest", str(manifest)], cwd=ROOT, env=env, capture_output=True,
                            text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    text = manifest.with_name("sample.lock.json").read_text()
    assert f"{original}/git/nccl.git" in text
    assert sample_server.url not in text


def test_bad_rewrite_rules_are_refused() -> None:
    assert parse_rewrites("") == ()
    assert parse_rewrites([{"prefix": "https://github.com/",
                            "replace": "https://git.corp.example/github/"}]) == (
        Rewrite(prefix="https://github.com/", replace="https://git.corp.example/github/"),)
    with pytest.raises(ManifestError, match=r"imageforge\.rewrite\[0\]"):
        parse_rewrites([{"prefix": "https://github.com/"}])
    with pytest.raises(ManifestError, match=r"rewrite\[1\].*not an http"):
        parse_rewrites("https://a/=https://b/ https://c/=ssh://d/")
    with pytest.raises(ManifestError, match="starts with the prefix"):
        parse_rewrites("https://a/=https://a/b/")

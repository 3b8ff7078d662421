"""Hostile tarballs served by a real HTTP server: fetch and lock refuse them on the host
(exit 4, naming the source, its URL and the member), keep nothing, and let good ones in."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from imageforge.errors import SourceError
from imageforge.model.sourcetypes import UrlSource
from imageforge.sources import tarcheck
from imageforge.sources.sources import SourceCache
from sample.serve import ServerHandle
from tests.servers import ScriptedServer
from tests.unit.conftest import sample_manifest

ROOT = Path(__file__).resolve().parents[2]
R, D, S, H = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
Member = tuple[str, bytes, str]  # (name, type, link target)

# Each archive is a harmless installer tree plus the one member that makes it hostile.
INSTALLER: list[Member] = [("aws-efa-installer", D, ""), ("aws-efa-installer/README", R, ""),
                           ("aws-efa-installer/efa_installer.sh", R, "")]
HOSTILE: dict[str, tuple[list[Member], str, str]] = {
    # case: (members added, the member named in the refusal, what the refusal says)
    "dot-dot": ([("aws-efa-installer/../../etc/cron.d/x", R, "")],
                "aws-efa-installer/../../etc/cron.d/x", "'..' path component"),
    "dot-dot-inside": ([("aws-efa-installer/../aws-efa-installer/y", R, "")],
                       "aws-efa-installer/../aws-efa-installer/y", "'..' path component"),
    "absolute": ([("/etc/cron.d/x", R, "")], "/etc/cron.d/x", "absolute path"),
    "symlink-absolute": ([("aws-efa-installer/etc", S, "/etc")], "aws-efa-installer/etc",
                         "absolute path '/etc'"),
    "symlink-out": ([("aws-efa-installer/up", S, "../../..")], "aws-efa-installer/up",
                    "outside the archive's tree"),
    "hardlink-out": ([("aws-efa-installer/passwd", H, "../etc/passwd")],
                     "aws-efa-installer/passwd", "outside the archive's tree"),
    "hardlink-absolute": ([("aws-efa-installer/passwd", H, "/etc/passwd")],
                          "aws-efa-installer/passwd", "absolute path '/etc/passwd'"),
    # Each link looks harmless alone: `here` is "." and `out` is "here/..".
    "symlink-chain": ([("here", S, "."), ("out", S, "here/.."), ("out/x", R, "")], "out",
                      "outside the archive's tree"),
    # `later` points at a directory that only afterwards becomes a link to ".".
    "symlink-reordered": ([("later", S, "d/.."), ("d", S, ".")], "later",
                          "outside the archive's tree"),
    "write-through-symlink": ([("tmp", S, "aws-efa-installer/../.."), ("tmp/x", R, "")],
                              "tmp", "outside the archive's tree"),
    "char-device": ([("aws-efa-installer/null", tarfile.CHRTYPE, "")],
                    "aws-efa-installer/null", "device file"),
    "block-device": ([("aws-efa-installer/sda", tarfile.BLKTYPE, "")],
                     "aws-efa-installer/sda", "device file"),
    "fifo": ([("aws-efa-installer/pipe", tarfile.FIFOTYPE, "")], "aws-efa-installer/pipe",
             "fifo"),
}
EFA_PIN = 'sha256 = "24220cb0add4527f3e3797d4cb19e85aadca13c5b549902a19028aa19afd0a54"\n'
COMPRESSION = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz", ".tar.bz2": "w:bz2",
               ".tar.xz": "w:xz"}


def tarball(members: list[Member], mode: str = "w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:  # type: ignore[call-overload]
        for name, kind, link in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, link, 0o755 if kind == D else 0o644
            body = f"contents of {name}\n".encode() if kind == R else b""
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def kept(cache: Path) -> list[str]:
    """Everything in the source cache but the per-entry lock files."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")
                  if p.is_file() and not p.name.endswith(".lock"))


def fetch_through(server: ScriptedServer, cache: Path, body: bytes,
                  filename: str = "aws-efa-installer-1.14.1.tar.gz") -> Path:
    server.route(f"/{filename}", body)
    source = UrlSource(name="src-efa", url=server.url(f"/{filename}"),
                       sha256=hashlib.sha256(body).hexdigest(), filename=filename)
    return SourceCache(cache).materialize(source)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_tarball_is_refused_and_nothing_is_kept(server: ScriptedServer,
                                                          tmp_path: Path, case: str) -> None:
    added, member, why = HOSTILE[case]
    body = tarball(INSTALLER + added)
    with pytest.raises(SourceError) as refused:
        fetch_through(server, tmp_path, body)
    message = str(refused.value)
    assert refused.value.return_code == 4
    assert "src-efa" in message
    assert server.url("/aws-efa-installer-1.14.1.tar.gz") in message
    assert repr(member) in message, message
    assert why in message, message
    assert kept(tmp_path) == []


@pytest.mark.parametrize("suffix", sorted(COMPRESSION))
def test_every_tarball_suffix_is_scanned(server: ScriptedServer, tmp_path: Path,
                                         suffix: str) -> None:
    hostile = tarball([("../x", R, "")], COMPRESSION[suffix])
    with pytest.raises(SourceError, match=r"'\.\.' path component"):
        fetch_through(server, tmp_path / "bad", hostile, f"installer{suffix}")
    good = tarball(INSTALLER, COMPRESSION[suffix])
    entry = fetch_through(server, tmp_path / "good", good, f"installer{suffix}")
    assert (entry / f"installer{suffix}").read_bytes() == good


def test_links_that_stay_inside_and_non_tarballs_are_kept(server: ScriptedServer,
                                                          tmp_path: Path) -> None:
    inside = tarball([
        *INSTALLER, ("aws-efa-installer/lib", D, ""),
        ("aws-efa-installer/lib/libfabric.so.1", R, ""),
        ("aws-efa-installer/lib/libfabric.so", S, "libfabric.so.1"),
        ("aws-efa-installer/bin", S, "./lib/../lib"),
        ("aws-efa-installer/copy", H, "aws-efa-installer/README")])
    assert fetch_through(server, tmp_path, inside).is_dir()
    # A wheel is a zip, not a tarball: kept as it is.
    assert fetch_through(server, tmp_path, b"PK\x03\x04 not a tarball", "x-1.0-py3-none-any.whl")


def test_a_corrupt_tarball_is_refused_as_unreadable(server: ScriptedServer,
                                                    tmp_path: Path) -> None:
    body = tarball([*INSTALLER, *[("aws-efa-installer/big", R, "")] * 50])
    with pytest.raises(SourceError, match="not a readable tar archive"):
        fetch_through(server, tmp_path, body[:len(body) // 2])
    assert kept(tmp_path) == []


def test_the_sample_upstreams_tarballs_pass(sample_dir: Path) -> None:
    tarballs = sorted(p for p in (sample_dir / "files").iterdir() if tarcheck.is_tarball(p.name))
    assert {p.name.split("-1.")[0].split("_1_")[0] for p in tarballs} == {
        "aws-efa-installer", "boost"}
    for path in tarballs:
        assert tarcheck.first_problem(path) is None, path


def manifest(tmp_path: Path, url: str, sha256: str | None) -> Path:
    path = tmp_path / "m.toml"
    pin = f'sha256 = "{sha256}"\n' if sha256 else ""
    path.write_text('[image]\nbase = "example/base:1"\ncuda_arch = ["8.0"]\npython = "3.11"\n'
                    f'apt = false\n[stages.efa]\nversion = "1.14.1"\nurl = "{url}"\n{pin}')
    return path


def invoke(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_IMAGEFORGE_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def test_fetch_refuses_with_exit_4_naming_source_url_and_member(server: ScriptedServer,
                                                                 tmp_path: Path) -> None:
    body = tarball([*INSTALLER, ("aws-efa-installer/etc", S, "/etc")])
    server.route("/aws-efa-installer-1.14.1.tar.gz", body)
    url = server.url("/aws-efa-installer-1.14.1.tar.gz")
    path = manifest(tmp_path, url, hashlib.sha256(body).hexdigest())
    result = invoke("fetch", "--target", "efa", "--manifest", str(path), cache=tmp_path / "c")
    assert_refused(result, url)
    assert kept(tmp_path / "c") == []


@pytest.mark.usefixtures("isolated_git")
def test_lock_refuses_to_pin_a_hostile_release(server: ScriptedServer,
                                               sample_server: ServerHandle,
                                               tmp_path: Path) -> None:
    # What `lock --upgrade` and the nightly do with a new release: download it and pin it.
    body = tarball([*INSTALLER, ("aws-efa-installer/etc", S, "/etc")])
    server.route("/aws-efa-installer-1.14.1.tar.gz", body)
    url = server.url("/aws-efa-installer-1.14.1.tar.gz")
    path = sample_manifest(tmp_path / "m", sample_server.url, {EFA_PIN: ""})
    path.write_text(path.read_text().replace(
        f"{sample_server.url}/files/aws-efa-installer-{{version}}.tar.gz", url))
    result = invoke("lock", "--manifest", str(path), cache=tmp_path / "c")
    assert_refused(result, url)
    assert not (path.parent / "sample.lock.json").exists()
    assert not [p for p in kept(tmp_path / "c") if p.startswith("sha256/")]


def assert_refused(result: subprocess.CompletedProcess[str], url: str) -> None:
    assert result.returncode == 4, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("imageforge: error: source src-efa"), last
    assert url in last, last
    assert "member 'aws-efa-installer/etc' is a symlink to the absolute path '/etc'" in last

"""The sample upstream, served on 127.0.0.1, manifests/sample.toml pointed at it, and its
smddp plan."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.planning.plan import Plan
from sample.generate import generate
from sample.serve import ServerHandle, start_server
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
ENTRY = Path(sys.executable).parent / "imageforge"
SAMPLE_ADDRESS = "http://127.0.0.1:8741"


def imageforge(*args: str, cwd: Path, stdin: int | None = None, input: bytes | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The installed `imageforge` command run in `cwd` with a cache of its own there and no
    manifest or log level from this environment; output decoded, undecodable bytes replaced."""
    env = {**os.environ, "INVOKE_IMAGEFORGE_CACHE_DIR": str(cwd / "cache")}
    for name in ("INVOKE_IMAGEFORGE_MANIFEST", "IMAGEFORGE_LOG"):
        env.pop(name, None)
    result = subprocess.run([str(ENTRY), *args], cwd=cwd, capture_output=True, env=env,
                            check=False, timeout=timeout, stdin=stdin, input=input)
    return subprocess.CompletedProcess(result.args, result.returncode,
                                       result.stdout.decode(errors="replace"),
                                       result.stderr.decode(errors="replace"))


@pytest.fixture(scope="session")
def sample_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sample-upstream")
    generate(out)
    return out


@pytest.fixture(scope="session")
def sample_plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    """manifests/sample.toml planned for smddp, unresolved (nothing is fetched)."""
    settings = Workspace(registry=STAGES, manifest=ROOT / "manifests/sample.toml",
                                cache_dir=tmp_path_factory.mktemp("cache"))
    return project.plan(settings, "smddp")


@pytest.fixture
def sample_copy(sample_dir: Path, tmp_path: Path) -> Path:
    """A copy of the sample upstream that a test may change (move tags, delete files)."""
    copy = tmp_path / "upstream"
    shutil.copytree(sample_dir, copy)
    return copy


@pytest.fixture
def sample_server(sample_copy: Path) -> Iterator[ServerHandle]:
    handle = start_server(sample_copy)
    try:
        yield handle
    finally:
        if handle.thread.is_alive():
            handle.stop()


@pytest.fixture
def sample_pins(sample_dir: Path) -> dict[str, Any]:
    pins: dict[str, Any] = json.loads((sample_dir / "pins.json").read_text())
    return pins


@pytest.fixture
def in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the test with the repository root as the working directory (manifests name their
    files relative to it), and the previous one back afterwards. Use it with
    `pytestmark = pytest.mark.usefixtures("in_repo_root")` or as an argument."""
    monkeypatch.chdir(ROOT)


@pytest.fixture
def isolated_git(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def sample_manifest(dest: Path, url: str, edits: Mapping[str, str] | None = None) -> Path:
    """manifests/sample.toml with its sources at `url`, written into `dest`; `edits` replaces
    text (e.g. adds a policy line under a table header)."""
    text = (ROOT / "manifests/sample.toml").read_text().replace(SAMPLE_ADDRESS, url)
    for old, new in (edits or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "sample.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made by the openssl tool: for the
    TLS servers of the download and index tests."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60)
    return cert, key

"""SIGTERM (how CI cancels a job) and Ctrl-C during a fetch: a clear exit, nothing
half-written left in the cache, and the next run succeeds."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.payloads import random_tarball
from tests.servers import ScriptedServer

ROOT = Path(__file__).resolve().parents[2]
BODY = random_tarball(256 * 1024)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def manifest(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(
        '[image]\nbase = "example/base:1"\ncuda_arch = ["8.0"]\npython = "3.11"\napt = false\n'
        f'[stages.efa]\nversion = "1.14.1"\nurl = "{url}"\n'
        f'sha256 = "{hashlib.sha256(BODY).hexdigest()}"\n')
    return path


def fetch(path: Path, cache: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_IMAGEFORGE_CACHE_DIR": str(cache)}
    return subprocess.Popen([sys.executable, "-m", "invoke", "-r", str(ROOT), "fetch",
                             "--target", "efa", "--manifest", str(path)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def files(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")
                  if p.is_file() and not p.name.endswith(".lock"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_download_leaves_nothing_and_the_next_run_succeeds(
        server: ScriptedServer, tmp_path: Path, signum: int) -> None:
    server.route("/efa.tar.gz", BODY, drip=0.05)  # a slow body: about 3 s
    path = manifest(tmp_path, server.url("/efa.tar.gz"))
    cache = tmp_path / "cache"
    proc = fetch(path, cache)
    deadline = time.monotonic() + 30
    while server.count("/efa.tar.gz") == 0:
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert files(cache) == [], "nothing half-written stays in the cache"
    server.route("/efa.tar.gz", BODY)
    again = fetch(path, cache)
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert any(f.endswith("efa.tar.gz") for f in files(cache))

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
BODY = random_tarball(1024 * 1024)


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


def partial_files(cache: Path) -> list[Path]:
    """The fetch's temporary file, with bytes in it."""
    return [p for p in cache.rglob("*.part") if p.is_file() and p.stat().st_size > 0]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_download_leaves_nothing_and_the_next_run_succeeds(
        server: ScriptedServer, tmp_path: Path, signum: int) -> None:
    # The server sends 160 KiB of the body and holds the rest: the signal lands mid-body,
    # whatever the machine's speed.
    route = server.route("/efa.tar.gz", BODY, hold_at=160 * 1024, drip=0.1)
    path = manifest(tmp_path, server.url("/efa.tar.gz"))
    cache = tmp_path / "cache"
    proc = fetch(path, cache)
    try:
        assert route.holding.wait(timeout=60), "the fetch never asked for the file"
        # Safety net only: the client writes what it received (64 KiB reads) at once.
        deadline = time.monotonic() + 60
        while not partial_files(cache):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no partial download appeared in the cache"
            time.sleep(0.01)
        proc.send_signal(signum)
        # The server stays silent: the fetch must stop now, not after its 60 s read
        # timeout (its stalled read's socket is shut down).
        _, err = proc.communicate(timeout=20)
    finally:
        route.release.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert "Traceback" not in err
    (seen,) = server.requests_for("/efa.tar.gz")
    assert seen.hung_up.wait(timeout=30)
    assert not seen.answered.is_set()
    assert files(cache) == [], "nothing half-written stays in the cache"
    server.route("/efa.tar.gz", BODY)
    again = fetch(path, cache)
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert any(f.endswith("efa.tar.gz") for f in files(cache))

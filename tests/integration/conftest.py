"""Real Docker + BuildKit, a real sample upstream served on 127.0.0.1.

Under CI=true a missing Docker daemon fails these tests; elsewhere they are skipped with
the reason, so unit work stays possible on a laptop without Docker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_PORT = "127.0.0.1:8741"


def docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "docker is not installed"
    info = subprocess.run(["docker", "info"], capture_output=True, check=False)
    if info.returncode != 0:
        return "the Docker daemon is not running"
    if subprocess.run(["docker", "buildx", "version"], capture_output=True,
                      check=False).returncode != 0:
        return "docker buildx is missing"
    if subprocess.run(["docker", "image", "inspect", "imageforge/base:bookworm"],
                      capture_output=True, check=False).returncode != 0:
        return "the base image imageforge/base:bookworm is missing (make docker)"
    return None


@pytest.fixture(scope="session")
def docker_ready() -> None:
    problem = docker_problem()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"Docker tests need Docker under CI: {problem}; run `make docker`.")
    pytest.skip(f"{problem} (set CI=true to make this a failure)")


@pytest.fixture(scope="session")
def upstream(tmp_path_factory: pytest.TempPathFactory, docker_ready: None) -> Iterator[str]:
    """The sample upstream, generated and served; yields its base URL."""
    from sample.serve import start_server

    out = tmp_path_factory.mktemp("upstream")
    subprocess.run([sys.executable, "-m", "sample", "generate", "--out", str(out)], check=True,
                   cwd=ROOT)
    server = start_server(out)
    try:
        yield server.url.rstrip("/")
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sample_manifest(tmp_path_factory: pytest.TempPathFactory, upstream: str,
                    cache_dir: Path) -> Path:
    """manifests/sample.toml pointing at this session's server, locked."""
    text = (ROOT / "manifests/sample.toml").read_text()
    path = tmp_path_factory.mktemp("manifests") / "sample.toml"
    path.write_text(text.replace(f"http://{SAMPLE_PORT}", upstream))
    result = invoke("lock", "--manifest", str(path), cache=cache_dir)
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cache")
    return path


def invoke(*args: str, cache: Path | None = None, env: dict[str, str] | None = None,
           timeout: float = 900) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    if cache is not None:
        full_env["INVOKE_IMAGEFORGE_CACHE_DIR"] = str(cache)
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], cwd=ROOT,
                          capture_output=True, text=True, env=full_env, check=False,
                          timeout=timeout)


def docker_out(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True,
                          check=True).stdout.strip()

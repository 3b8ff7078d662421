"""Real Docker + BuildKit, a real sample upstream served on 127.0.0.1.

Under CI=true a missing Docker daemon fails these tests; elsewhere they are skipped with
the reason, so unit work stays possible on a laptop without Docker.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

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


# The test registry's password: chosen per session, handed to compose through the
# environment, and searched for in outputs by the secret tests.
REGISTRY_USER = "imageforge"
REGISTRY_PASSWORD = os.environ.setdefault("IMAGEFORGE_TEST_REGISTRY_PASSWORD",
                                          "pw-" + secrets.token_hex(12))


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    return str(Path(__file__).parent / "docker-compose.yml")


@pytest.fixture(scope="session")
def docker_compose_project_name() -> str:
    return f"imageforge-test-{os.getpid()}"


@pytest.fixture(scope="session")
def registry(docker_ready: None, docker_services: Any) -> str:
    """A real registry (distribution, htpasswd auth) on 127.0.0.1; returns host:port."""
    port = docker_services.port_for("registry", 5000)
    url = f"http://127.0.0.1:{port}/v2/"

    def up() -> bool:
        try:
            # 401 is "up": the registry answers and wants credentials.
            return requests.get(url, timeout=2).status_code in (200, 401)
        except requests.RequestException:
            return False

    docker_services.wait_until_responsive(check=up, timeout=60, pause=0.5)
    return f"127.0.0.1:{port}"


def registry_env() -> dict[str, str]:
    return {"IMAGEFORGE_REGISTRY_USER": REGISTRY_USER,
            "IMAGEFORGE_REGISTRY_PASSWORD": REGISTRY_PASSWORD}

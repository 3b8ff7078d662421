"""Registry questions over the registry's own HTTP API (imageforge/cache/registryhttp.py), against
the real test registry (distribution, htpasswd auth): the digest it gives is the one
`docker buildx imagetools inspect` gives, a missing artifact is a no, wrong credentials are
refused, and none of it runs docker (a `docker` on PATH that fails says so)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from imageforge.cache import remote
from imageforge.errors import CacheError
from tests.integration.conftest import REGISTRY_USER, registry_env

KEY = "sha256:" + uuid.uuid4().hex * 2


@pytest.fixture(scope="module")
def pushed(registry: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small artifact pushed to the test registry under `efa`'s name for KEY."""
    context = tmp_path_factory.mktemp("artifact")
    (context / "Dockerfile").write_text(f"FROM scratch\nCOPY Dockerfile /{KEY[7:]}\n")
    repository = f"{registry}/http-{KEY[7:15]}"
    with remote.credentials(registry, registry_env()) as env:
        proc = subprocess.run(
            ["docker", "buildx", "build", "--quiet", "--provenance=false", "--output",
             f"type=registry,name={remote.Remote(repository=repository).ref('efa', KEY)}",
             str(context)], env={**os.environ, **env}, capture_output=True, text=True,
            check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return repository


def test_the_registry_answers_as_docker_does_without_a_docker_run(
        pushed: str, registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with remote.credentials(registry, registry_env()) as env:
        by_docker = remote.Remote(repository=pushed, env=env)._docker_digest("efa", KEY, 60)
        assert by_docker is not None
        assert by_docker.startswith("sha256:")
        failing = tmp_path / "bin"
        failing.mkdir()
        (failing / "docker").write_text("#!/bin/sh\necho docker was run >&2\nexit 3\n")
        (failing / "docker").chmod(0o755)
        monkeypatch.setenv("PATH", f"{failing}{os.pathsep}{os.environ['PATH']}")
        asking = remote.Remote(repository=pushed, env=env)
        assert asking.digest("efa", KEY) == by_docker
        assert asking.digest("nccl", KEY) is None
        assert asking.holds([("efa", KEY), ("nccl", KEY)]) == [True, False]


def test_wrong_credentials_are_refused_over_http(pushed: str, registry: str) -> None:
    wrong = {"IMAGEFORGE_REGISTRY_USER": REGISTRY_USER, "IMAGEFORGE_REGISTRY_PASSWORD": "wrong"}
    with remote.credentials(registry, wrong) as env, \
            pytest.raises(CacheError, match=f"registry {registry} refused our credentials"):
        remote.Remote(repository=pushed, env=env).digest("efa", KEY)

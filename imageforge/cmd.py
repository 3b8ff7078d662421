"""The one place imageforge starts other programs: argv lists, never shell strings."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from imageforge.errors import DockerError


def docker_binary() -> str:
    path = shutil.which("docker")
    if path is None:
        raise DockerError("docker is not installed; run `scripts/setup-host.sh` (Debian) or "
                          "install Docker with buildx, then retry.")
    return path


def run(args: Sequence[str], *, timeout: float | None = 120, input: bytes | None = None,
        env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run a command, capture its output, never raise on a non-zero exit. `env` adds to
    (not replaces) the environment: e.g. a private DOCKER_CONFIG with credentials."""
    return subprocess.run(list(args), capture_output=True, timeout=timeout, input=input,
                          check=False, env={**os.environ, **env} if env else None)


def docker(*args: str, timeout: float | None = 120,
           env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return run([docker_binary(), *args], timeout=timeout, env=env)

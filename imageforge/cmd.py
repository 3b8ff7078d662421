"""The one place imageforge starts other programs: argv lists, never shell strings."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

from imageforge.errors import DockerError


def docker_binary() -> str:
    path = shutil.which("docker")
    if path is None:
        raise DockerError("docker is not installed; run `scripts/setup-host.sh` (Debian) or "
                          "install Docker with buildx, then retry.")
    return path


def run(args: Sequence[str], *, timeout: float | None = 120,
        input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run a command, capture its output, never raise on a non-zero exit."""
    return subprocess.run(list(args), capture_output=True, timeout=timeout, input=input,
                          check=False)


def docker(*args: str, timeout: float | None = 120) -> subprocess.CompletedProcess[bytes]:
    return run([docker_binary(), *args], timeout=timeout)

"""Checks that Docker, its daemon and buildx are usable, each failing with one sentence."""

from __future__ import annotations

import contextlib
import json
import subprocess
from typing import Any

from imageforge import engineapi
from imageforge.cmd import docker
from imageforge.errors import DockerError, FatalError

# Labels imageforge puts on images: <prefix>.key.<stage>, <prefix>.version.<stage>, ...
LABEL_PREFIX = "io.imageforge"


BUILDX_MISSING = ("docker buildx is not installed; install the buildx plugin "
                  "(scripts/setup-host.sh does on Debian) and retry.")


def ensure_ready(builder: str | None = None, *, buildx: bool = True) -> None:
    """The daemon answers, and (`buildx`) the buildx plugin is there and knows `builder`.
    A caller whose next command is a buildx one may leave buildx to it (bakefail names a
    missing plugin the same way)."""
    ensure_daemon()
    if not buildx:
        return
    found = docker("buildx", "version", timeout=30)
    if found.returncode != 0:
        raise DockerError(BUILDX_MISSING)
    if builder:
        inspect = docker("buildx", "inspect", builder, timeout=30)
        if inspect.returncode != 0:
            raise DockerError(f"--builder {builder}: no such buildx builder; "
                              "see `docker buildx ls`.")


def ensure_daemon() -> None:
    with contextlib.suppress(engineapi.Unreachable), engineapi.Engine() as engine:
        status, _ = engine.get("/version")
        if status == 200:
            return
    try:
        info = docker("info", "--format", "{{json .ServerVersion}}", timeout=30)
    except subprocess.TimeoutExpired:
        raise DockerError("the Docker daemon does not answer (docker info timed out); "
                          "restart it and retry.") from None
    if info.returncode != 0:
        detail = info.stderr.decode(errors="replace").strip().splitlines()
        raise DockerError("the Docker daemon is not running or not reachable "
                          f"({detail[-1] if detail else 'docker info failed'}); start it "
                          "(scripts/setup-host.sh does on Debian) and retry.")


def _inspect(ref: str, context: str | None) -> dict[str, Any] | None:
    if context is None:
        with contextlib.suppress(engineapi.Unreachable), engineapi.Engine() as api:
            return api.image(ref)
    engine = ("--context", context) if context else ()
    result = docker(*engine, "image", "inspect", "--format", "{{json .}}", ref, timeout=60)
    if result.returncode != 0:
        return None
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def image_labels(ref: str) -> dict[str, str]:
    result = docker("image", "inspect", "--format", "{{json .Config.Labels}}", ref)
    if result.returncode != 0:
        raise DockerError(f"image {ref} is not in the local Docker image store; build it first.")
    return json.loads(result.stdout or b"null") or {}


def local_image(ref: str, context: str | None = None
                ) -> tuple[str | None, dict[str, str] | None]:
    """The ID and labels of `ref` in the image store of the current engine (or of the
    docker context `context`); Nones when it has no such image."""
    data = _inspect(ref, context)
    if data is None:
        return None, None
    labels = (data.get("Config") or {}).get("Labels") or {}
    return str(data.get("Id") or "") or None, dict(labels)


def local_image_id(ref: str) -> str | None:
    """The image ID of `ref` in the local image store; None when it has none, or when Docker
    cannot say (plans also run where Docker is not)."""
    try:
        return local_image(ref)[0]
    except (FatalError, OSError, subprocess.TimeoutExpired):
        return None


def image_digest(ref: str) -> str:
    """The local image's ID: with the containerd image store, the digest a push publishes."""
    result = docker("image", "inspect", "--format", "{{.Id}}", ref)
    if result.returncode != 0:
        raise DockerError(f"image {ref} is not in the local Docker image store; build it first.")
    return result.stdout.decode().strip()

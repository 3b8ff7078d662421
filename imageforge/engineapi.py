"""Questions for the local Docker engine through its API socket, without the docker CLI.

Each docker CLI command costs 50-150 ms to start; a build asks the engine a handful of
questions (is it up, what is this image's ID and labels, which artifact images does it hold)
that its API answers in about a millisecond each. Only the engine the docker CLI itself
would talk to is asked this way: the default context and a unix socket (DOCKER_HOST unset or
unix://). Anything else (another context, a TCP host) raises Unreachable and the caller asks
through the CLI, which knows contexts, TLS and SSH.

Only the standard library: imageforge/uptodate.py uses it before anything else is imported.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.parse
from pathlib import Path
from typing import Any

TIMEOUT = 10.0


class Unreachable(OSError):
    """The engine cannot be asked through its socket: ask through the docker CLI."""


def docker_config() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def socket_path() -> str | None:
    """The local engine's socket when the docker CLI would talk to it; None otherwise."""
    if os.environ.get("DOCKER_CONTEXT", "default") != "default":
        return None
    try:
        current = json.loads(docker_config().read_text()).get("currentContext")
    except (OSError, ValueError):
        current = None
    if current not in (None, "", "default"):
        return None
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return host.removeprefix("unix://") if host.startswith("unix://") else None


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=TIMEOUT)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT)
        self.sock.connect(self.socket_path)


class Engine:
    """One connection to the local engine's API; raises Unreachable when there is none."""

    def __init__(self) -> None:
        path = socket_path()
        if path is None:
            raise Unreachable("not the local engine's socket")
        self._connection = _UnixConnection(path)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self._connection.close()

    def get(self, path: str) -> tuple[int, Any]:
        """Status and JSON body of GET `path`; Unreachable when the socket does not answer."""
        try:
            self._connection.request("GET", path)
            response = self._connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable(str(exc)) from None
        try:
            return response.status, json.loads(body or b"null")
        except ValueError:
            raise Unreachable(f"GET {path}: not JSON") from None

    def image(self, ref: str) -> dict[str, Any] | None:
        """`docker image inspect ref` as JSON; None when the engine has no such image."""
        status, body = self.get(f"/images/{urllib.parse.quote(ref, safe='')}/json")
        return body if status == 200 and isinstance(body, dict) else None

    def images(self, reference: str) -> dict[str, str]:
        """Every tag matching `reference` (a docker image ls filter) -> image ID."""
        filters = urllib.parse.quote(json.dumps({"reference": [reference]}))
        status, body = self.get(f"/images/json?filters={filters}")
        if status != 200 or not isinstance(body, list):
            raise Unreachable(f"listing images: HTTP {status}")
        return {tag: str(item["Id"]) for item in body for tag in item.get("RepoTags") or []}


def image_ids(refs: list[str]) -> dict[str, str | None]:
    """Each image's ID, None for one the engine does not have."""
    with Engine() as engine:
        found = {ref: engine.image(ref) for ref in refs}
    return {ref: str(data["Id"]) if data else None for ref, data in found.items()}

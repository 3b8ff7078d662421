"""A stand-in Docker engine API on a real unix socket, for unit tests of what imageforge asks
the local engine without the docker CLI (imageforge/engineapi.py): DOCKER_HOST points at it,
and it answers /version, /images/<name>/json and /images/json?filters= as the engine does,
from the images a test gives it, or one fixed answer to every request (a test of what no engine
should answer)."""

from __future__ import annotations

import contextlib
import http.server
import json
import socketserver
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

TAG = "imageforge/smddp:t"
ID = "sha256:" + "1" * 64


class _Handler(http.server.BaseHTTPRequestHandler):
    images: ClassVar[dict[str, str]] = {}
    labels: ClassVar[dict[str, dict[str, str]]] = {}
    # {"status": int, "body": bytes}, which the test may change while serving; None: the API.
    fixed: ClassVar[dict[str, Any] | None] = None

    def do_GET(self) -> None:
        if self.fixed is not None:
            self._send(self.fixed["status"], self.fixed["body"])
            return
        url = urllib.parse.urlsplit(self.path)
        body: Any
        if url.path == "/version":
            status, body = 200, {"Version": "stand-in"}
        elif url.path == "/images/json":
            filters = json.loads(urllib.parse.parse_qs(url.query)["filters"][0])
            prefix = filters["reference"][0].split("*", 1)[0]
            status, body = 200, [{"Id": i, "RepoTags": [t]} for t, i in self.images.items()
                                 if t.startswith(prefix)]
        else:
            name = urllib.parse.unquote(url.path.removeprefix("/images/").removesuffix("/json"))
            found = self.images.get(name)
            status = 200 if found else 404
            body = {"Id": found, "Config": {"Labels": self.labels.get(name)}} if found \
                else {"message": "No such image"}
        self._send(status, json.dumps(body).encode())

    def _send(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@contextlib.contextmanager
def serve_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 labels: dict[str, dict[str, str]] | None = None,
                 fixed: dict[str, Any] | None = None) -> Iterator[dict[str, str]]:
    """Serve on tmp_path/docker.sock; yields the images (name -> ID) the test sets."""
    sock = tmp_path / "docker.sock"
    images: dict[str, str] = {}
    handler = type("Handler", (_Handler,), {"images": images, "labels": labels or {},
                                            "fixed": fixed})
    server = _Server(str(sock), handler)
    # Polled every 50 ms, so that shutdown returns at once.
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    try:
        yield images
    finally:
        server.shutdown()
        server.server_close()

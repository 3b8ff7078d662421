"""A real HTTP proxy on 127.0.0.1 in front of a registry that fails on cue.

It passes requests through until the registry has answered `after` requests that match
`trigger` with success (a 401 asking for credentials does not count), then answers the next
`errors` requests with 500 Internal Server Error, then closes its sockets: the registry "goes
down" in the middle of whatever the client was doing.

    with FlakyProxy("127.0.0.1:5000", trigger=blob_upload, after=1, errors=3) as proxy:
        push_to(f"{proxy.address}/cache")
        assert proxy.down.is_set()
"""

from __future__ import annotations

import http.client
import io
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

Trigger = Callable[[str, str], bool]  # (method, path) -> counts towards `after` once answered

# Headers about one connection, not the message: never forwarded.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
              "trailer", "upgrade"}


def blob_upload(method: str, path: str) -> bool:
    """A push sending layer or config bytes (OCI distribution API)."""
    return method in ("PUT", "PATCH", "POST") and "/blobs/uploads/" in path


def manifest_request(method: str, path: str) -> bool:
    """A question about a manifest (HEAD) or a pull reading one (GET)."""
    return method in ("HEAD", "GET") and "/manifests/" in path


class FlakyProxy:
    def __init__(self, upstream: str, *, trigger: Trigger, after: int, errors: int) -> None:
        self.upstream = upstream
        self.trigger = trigger
        self.after = after
        self.errors = errors
        self.lock = threading.Lock()
        self.matched = 0
        self.failed = 0
        self.log: list[tuple[str, str, int]] = []  # (method, path, status answered)
        self.down = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> FlakyProxy:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.go_down()
        self._thread.join(timeout=10)

    def go_down(self) -> None:
        """Stop answering: the listening socket closes, later connections are refused."""
        if self.down.is_set():
            return
        self.down.set()
        # shutdown() waits for serve_forever, which must not be this (handler) thread.
        threading.Thread(target=self._stop, daemon=True).start()

    def _stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def decide(self) -> str:
        """"pass", "fail" (answer 500) or "drop" (close the connection unanswered)."""
        with self.lock:
            if self.down.is_set():
                return "drop"
            if self.matched >= self.after:
                if self.failed >= self.errors:
                    self.go_down()
                    return "drop"
                self.failed += 1
                return "fail"
            return "pass"

    def answered(self, method: str, path: str, status: int) -> None:
        """Log an answer, from the registry or injected; a success may count towards `after`."""
        with self.lock:
            self.log.append((method, path, status))
            if status < 400 and self.trigger(method, path):
                self.matched += 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up and connections we drop on purpose are part of the script.
        pass


def _handler_for(proxy: FlakyProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def handle_one_request(self) -> None:
            # Docker tries TLS first and falls back to plain HTTP only when the answer to its
            # ClientHello starts with "HTTP/", as a real registry's does.
            assert isinstance(self.rfile, io.BufferedReader)
            if self.rfile.peek(1)[:1] == b"\x16":
                self.wfile.write(b"HTTP/1.0 400 Bad Request\r\n\r\n")
                self.close_connection = True
                return
            super().handle_one_request()

        def do_GET(self) -> None:
            self._handle()

        do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = do_GET

        def _handle(self) -> None:
            body = self._read_body()
            decision = proxy.decide()
            if decision == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if decision == "fail":
                self._answer_500()
                return
            self._forward(body)

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks: list[bytes] = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _answer_500(self) -> None:
            text = b'{"errors":[{"code":"UNKNOWN","message":"injected failure"}]}'
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(text)
            proxy.answered(self.command, self.path, 500)

        def _forward(self, body: bytes) -> None:
            upstream = http.client.HTTPConnection(proxy.upstream, timeout=120)
            try:
                # Header by header: clients repeat Accept (one per manifest type). Host stays
                # the proxy's, since the registry builds upload URLs from it.
                upstream.putrequest(self.command, self.path, skip_host=True,
                                    skip_accept_encoding=True)
                for key, value in self.headers.items():
                    if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                        upstream.putheader(key, value)
                upstream.putheader("Content-Length", str(len(body)))
                upstream.endheaders(body)
                response = upstream.getresponse()
                payload = response.read()
                self.send_response(response.status, response.reason)
                for key, value in response.getheaders():
                    if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                length = response.getheader("Content-Length")
                if self.command == "HEAD" and length is not None:
                    self.send_header("Content-Length", length)
                else:
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                proxy.answered(self.command, self.path, response.status)
            finally:
                upstream.close()

    return Handler

"""A real HTTP server on 127.0.0.1 whose misbehaviour is scripted per path.

    with ScriptedServer() as server:
        server.route("/f.tar.gz", body, failures=2)          # 503, 503, then the file
        server.route("/cut", body, truncate_at=1000, accept_ranges=True)
        download(server.url("/f.tar.gz"), ...)
        assert server.count("/f.tar.gz") == 3

Tests wait on what the server observed, never on the clock: every request is recorded
(`Seen`) with the monotonic time it arrived, whether its client hung up before it was
answered, and when its answer was complete; a route with `hold_at` sends part of the body,
sets `holding` and waits for `release` (or for the client to hang up).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import select
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

ETAG = '"v1"'
DRIP_CHUNK = 4096


@dataclass
class Route:
    """What one path answers. Counters (failures, truncations, stalls) are used up in order."""

    body: bytes = b""
    status: int = 200  # answer every request with this status instead (404, 429, ...)
    failures: int = 0  # answer the first N requests with fail_status
    fail_status: int = 503
    retry_after: str | None = None  # sent with failure and status answers
    truncate_at: int | None = None  # close the connection after this many body bytes...
    truncations: int = 1  # ...on this many requests
    accept_ranges: bool = False  # advertise Accept-Ranges: bytes (and an ETag)
    honour_ranges: bool = True  # False: advertise ranges but answer Range requests with 200
    range_shift: int = 0  # a broken server: Content-Range starts this far from what was asked
    stall: float = 0.0  # seconds to wait before answering...
    stalls: int = 0  # ...the first N requests
    drip: float = 0.0  # seconds to wait between chunks of the body
    hold_at: int | None = None  # send this many body bytes, then wait for `release` (then drip)
    holding: threading.Event = field(default_factory=threading.Event)  # set once they are sent
    release: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Seen:
    """One request as the server saw it."""

    path: str
    headers: dict[str, str] = field(default_factory=dict)
    at: float = 0.0  # time.monotonic() when it arrived
    # Set when the client closed the connection before the whole answer was sent.
    hung_up: threading.Event = field(default_factory=threading.Event)
    answered: threading.Event = field(default_factory=threading.Event)  # all of the answer sent

    @property
    def range(self) -> str | None:
        return self.headers.get("Range")


class ScriptedServer:
    """A threaded HTTP/1.1 server; use as a context manager (or through a pytest fixture)."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._httpd = _QuietServer(("127.0.0.1", 0), _handler_for(self))
        # A short poll interval keeps shutdown (once per test) fast.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stopping.set()  # release stalled handlers
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def route(self, path: str, body: bytes = b"", **behaviour: Any) -> Route:
        route = Route(body=body, **behaviour)
        self.routes[path] = route
        return route

    def requests_for(self, path: str) -> list[Seen]:
        with self.lock:
            return [seen for seen in self.seen if seen.path == path]

    def count(self, path: str) -> int:
        return len(self.requests_for(path))

    def ranges(self, path: str) -> list[str | None]:
        return [seen.range for seen in self.requests_for(path)]

    @property
    def connections(self) -> int:
        """TCP connections accepted so far: a kept-alive connection counts once."""
        return self._httpd.accepted

    def wait_closed(self, count: int, timeout: float) -> bool:
        """Wait until the server has closed `count` connections (after the client hung up or
        the route ended it); False when `timeout` seconds pass first."""
        httpd = self._httpd
        with httpd.changed:
            return httpd.changed.wait_for(lambda: httpd.closed >= count, timeout)

    def use_tls(self, context: ssl.SSLContext) -> None:
        """Speak HTTPS from now on (call before entering); see `https_url`. A client that
        refuses the certificate ends the handshake, and the server then sees no request."""
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)

    def https_url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def gaps(self, path: str) -> list[float]:
        """Seconds between consecutive requests for `path`, as the server received them."""
        times = [seen.at for seen in self.requests_for(path)]
        return [later - earlier for earlier, later in itertools.pairwise(times)]


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that hang up early are part of the script, not a failure of the server.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accepted = 0  # connections accepted (counted by the serving thread)...
        self.closed = 0  # ...and closed once their handler is done
        self.changed = threading.Condition()

    def verify_request(self, _request: Any, _client_address: Any) -> bool:
        self.accepted += 1
        return True

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        with self.changed:
            self.closed += 1
            self.changed.notify_all()


@dataclass
class _Plan:
    """What to do for one request, decided under the server lock."""

    route: Route | None
    stall: float = 0.0
    fail: bool = False
    truncate_at: int | None = None


def _plan(server: ScriptedServer, path: str) -> _Plan:
    route = server.routes.get(path)
    if route is None:
        return _Plan(route=None)
    plan = _Plan(route=route)
    if route.stalls > 0:
        route.stalls -= 1
        plan.stall = route.stall
    if route.failures > 0:
        route.failures -= 1
        plan.fail = True
    elif route.truncate_at is not None and route.truncations > 0:
        route.truncations -= 1
        plan.truncate_at = route.truncate_at
    return plan


def _handler_for(server: ScriptedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            seen = Seen(path=path, headers=dict(self.headers.items()), at=time.monotonic())
            with server.lock:
                server.seen.append(seen)
                plan = _plan(server, path)
            # The client may hang up early, which is what some tests want.
            try:
                if self._answer(plan, seen):
                    seen.answered.set()
            except (BrokenPipeError, ConnectionResetError):
                seen.hung_up.set()
            if seen.hung_up.is_set():
                self.close_connection = True

        def _wait(self, seen: Seen, until: threading.Event, seconds: float | None) -> bool:
            """Wait until `until` is set, `seconds` have passed or the server stops; False
            (and `seen.hung_up` set) when the client hangs up first."""
            deadline = None if seconds is None else time.monotonic() + seconds
            while not (until.is_set() or server.stopping.is_set()):
                left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
                if left <= 0:
                    break
                readable, _, _ = select.select([self.connection], [], [], left)
                if readable and self._closed():
                    seen.hung_up.set()
                    return False
                if readable:
                    until.wait(left)  # bytes we do not read (a pipelined request): just wait
            return True

        def _closed(self) -> bool:
            """The client closed (or reset) the connection: a readable socket with no data."""
            try:
                return not self.connection.recv(1, socket.MSG_PEEK)
            except ConnectionError:
                return True

        def _answer(self, plan: _Plan, seen: Seen) -> bool:
            """Answer the request; False when the client hung up before that."""
            if plan.stall and not self._wait(seen, server.stopping, plan.stall):
                return False
            route = plan.route
            if route is None:
                self._status(404, None)
            elif plan.fail:
                self._status(route.fail_status, route.retry_after)
            elif route.status != 200:
                self._status(route.status, route.retry_after)
            else:
                return self._body(route, plan.truncate_at, seen)
            return True

        def _status(self, status: int, retry_after: str | None) -> None:
            self.send_response(status)
            if retry_after is not None:
                self.send_header("Retry-After", retry_after)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _body(self, route: Route, truncate_at: int | None, seen: Seen) -> bool:
            start = self._range_start(route)
            payload = route.body[start:]
            self.send_response(200 if start is None else 206)
            self.send_header("Content-Length", str(len(payload)))
            if route.accept_ranges:
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("ETag", ETAG)
            if start is not None:
                first = start + route.range_shift
                total = len(route.body)
                self.send_header("Content-Range", f"bytes {first}-{total - 1}/{total}")
            self.end_headers()
            if truncate_at is not None:
                self.wfile.write(payload[:truncate_at])
                self.wfile.flush()
                self.close_connection = True
                return True
            if route.hold_at is not None:
                self.wfile.write(payload[:route.hold_at])
                self.wfile.flush()
                route.holding.set()
                if not self._wait(seen, route.release, None):
                    return False
                payload = payload[route.hold_at:]
            self._send(payload, route.drip)
            return True

        def _range_start(self, route: Route) -> int | None:
            match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
            if_range = self.headers.get("If-Range")
            if not (match and route.accept_ranges and route.honour_ranges):
                return None
            if if_range is not None and if_range != ETAG:
                return None
            return int(match.group(1))

        def _send(self, payload: bytes, drip: float) -> None:
            if not drip:
                self.wfile.write(payload)
                return
            for offset in range(0, len(payload), DRIP_CHUNK):
                self.wfile.write(payload[offset:offset + DRIP_CHUNK])
                self.wfile.flush()
                server.stopping.wait(drip)

    return Handler


class _QuietFileHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve_directory(root: str) -> Iterator[str]:
    """A static HTTP server for `root` on 127.0.0.1 (e.g. a PEP 503 package index: each
    project's `index.html` is served for its directory URL, as text/html); yields its URL."""
    handler = functools.partial(_QuietFileHandler, directory=root)
    httpd = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()

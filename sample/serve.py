"""HTTP server for the sample upstream.

    /files/              an autoindex-style HTML listing of the artifacts
    /files/<name>        artifacts, with HEAD, single-range GET (206) and Content-Length
    /git/<repo>.git/...  git smart HTTP, through ``git http-backend`` run as a CGI program
    /pins.json           the pins written by ``generate``

Tests use ``start_server`` (a context manager); ``python -m sample serve`` runs it in the
foreground.
"""

from __future__ import annotations

import email.utils
import html
import logging
import mimetypes
import os
import re
import socket
import subprocess
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, cast
from urllib.parse import quote, unquote, urlsplit

log = logging.getLogger("sample.serve")

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_CHUNK = 1 << 16


class UpstreamServer(ThreadingHTTPServer):
    """A threading server that knows the upstream directory it serves."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], root: Path, verbose: bool) -> None:
        self.root = root.resolve()
        self.verbose = verbose
        super().__init__(address, UpstreamHandler)

    def handle_error(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any
    ) -> None:
        # Clients that hang up mid-download (range probes, cancelled fetches) are normal here;
        # a traceback per connection would bury real output.
        if self.verbose:
            super().handle_error(request, client_address)
        else:
            log.debug("error while serving %s", client_address, exc_info=True)


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # inclusive

    @property
    def length(self) -> int:
        return self.end - self.start + 1


def parse_range(header: str, size: int) -> ByteRange | str | None:
    """A single byte range from a Range header.

    Returns the range, None to serve the whole file (no header, or a form this server does not
    handle, such as several ranges, which RFC 9110 allows a server to ignore), or "unsatisfiable".
    """
    match = _RANGE.match(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # suffix: the last N bytes
        length = int(last)
        if length == 0 or size == 0:
            return "unsatisfiable"
        return ByteRange(max(0, size - length), size - 1)
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or end < start:
        return "unsatisfiable"
    return ByteRange(start, end)


def _content_type(path: Path) -> str:
    if path.name.endswith(".whl"):
        return "application/zip"
    guessed, encoding = mimetypes.guess_type(path.name)
    if encoding == "gzip":
        return "application/gzip"
    return guessed or "application/octet-stream"


class UpstreamHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sample-upstream/1"

    @property
    def upstream(self) -> UpstreamServer:
        return cast(UpstreamServer, self.server)

    def log_message(self, format: str, *args: object) -> None:
        # One line per request only when asked for: tests run many requests.
        if self.upstream.verbose:
            super().log_message(format, *args)

    # ------------------------------------------------------------------ dispatch

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_POST(self) -> None:
        path = unquote(urlsplit(self.path).path)
        if path.startswith("/git/"):
            self._git(path[len("/git") :])
        else:
            self._error(HTTPStatus.METHOD_NOT_ALLOWED)

    def _dispatch(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        if path == "/files/":
            self._listing(self.upstream.root / "files", head)
        elif path.startswith("/files/"):
            self._file(self.upstream.root / "files", path[len("/files/") :], head)
        elif path == "/pins.json":
            self._file(self.upstream.root, "pins.json", head)
        elif path.startswith("/git/") and not head:
            self._git(path[len("/git") :])
        else:
            self._error(HTTPStatus.NOT_FOUND)

    def _error(self, status: HTTPStatus, detail: str = "") -> None:
        body = f"{status.value} {status.phrase}{': ' + detail if detail else ''}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    # ------------------------------------------------------------------ files

    def _resolve(self, base: Path, name: str) -> Path | None:
        """The file ``name`` under ``base``, or None if it is missing or escapes ``base``."""
        if not name or "\x00" in name:
            return None
        candidate = (base / name).resolve()
        if not candidate.is_relative_to(base.resolve()) or not candidate.is_file():
            return None
        return candidate

    def _file(self, base: Path, name: str, head: bool) -> None:
        path = self._resolve(base, name)
        if path is None:
            self._error(HTTPStatus.NOT_FOUND)
            return
        stat = path.stat()
        wanted = parse_range(self.headers.get("Range", ""), stat.st_size)
        if wanted == "unsatisfiable":
            self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            self.send_header("Content-Range", f"bytes */{stat.st_size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        byte_range = wanted if isinstance(wanted, ByteRange) else ByteRange(0, stat.st_size - 1)
        self.send_response(HTTPStatus.PARTIAL_CONTENT if wanted else HTTPStatus.OK)
        self.send_header("Content-Type", _content_type(path))
        self.send_header("Content-Length", str(max(byte_range.length, 0)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Last-Modified", email.utils.formatdate(stat.st_mtime, usegmt=True))
        self.send_header("ETag", f'"{stat.st_size:x}-{int(stat.st_mtime_ns):x}"')
        if wanted:
            self.send_header(
                "Content-Range", f"bytes {byte_range.start}-{byte_range.end}/{stat.st_size}"
            )
        self.end_headers()
        if not head:
            self._send_bytes(path, byte_range)

    def _listing(self, base: Path, head: bool) -> None:
        """What nginx's autoindex serves: one link per file, so release scanners work."""
        names = sorted(p.name for p in base.iterdir() if p.is_file())
        links = "".join(f'<a href="{quote(n)}">{html.escape(n)}</a>\n' for n in names)
        body = f"<html><head><title>Index of /files/</title></head><body><pre>\n{links}"
        payload = f"{body}</pre></body></html>\n".encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if not head:
            self.wfile.write(payload)

    def _send_bytes(self, path: Path, byte_range: ByteRange) -> None:
        remaining = byte_range.length
        with path.open("rb") as f:
            f.seek(byte_range.start)
            while remaining > 0:
                chunk = f.read(min(_CHUNK, remaining))
                if not chunk:
                    break
                self.wfile.write(chunk)
                remaining -= len(chunk)

    # ------------------------------------------------------------------ git

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size_line = self.rfile.readline()
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                # Trailer section, ended by an empty line.
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()  # CRLF after each chunk

    def _cgi_env(self, path_info: str, body: bytes) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env.update(
            GIT_PROJECT_ROOT=str(self.upstream.root / "git"),
            GIT_HTTP_EXPORT_ALL="1",
            GIT_CONFIG_NOSYSTEM="1",
            GIT_CONFIG_GLOBAL=os.devnull,
            GATEWAY_INTERFACE="CGI/1.1",
            SERVER_PROTOCOL=self.request_version,
            SERVER_SOFTWARE=self.server_version,
            REQUEST_METHOD=self.command,
            PATH_INFO=path_info,
            QUERY_STRING=urlsplit(self.path).query,
            REMOTE_ADDR=self.client_address[0],
            CONTENT_LENGTH=str(len(body)),
        )
        content_type = self.headers.get("Content-Type")
        if content_type:
            env["CONTENT_TYPE"] = content_type
        # Git-Protocol (protocol v2) and Content-Encoding (gzip bodies) reach the backend as
        # HTTP_* variables, as CGI specifies.
        for key, value in self.headers.items():
            name = "HTTP_" + key.upper().replace("-", "_")
            if name not in ("HTTP_CONTENT_LENGTH", "HTTP_CONTENT_TYPE", "HTTP_TRANSFER_ENCODING"):
                env[name] = value
        return env

    def _git(self, path_info: str) -> None:
        body = self._read_body()
        try:
            proc = subprocess.run(
                ["git", "http-backend"],
                input=body,
                capture_output=True,
                env=self._cgi_env(path_info, body),
                check=False,
            )
        except OSError as exc:
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"cannot run git http-backend: {exc}")
            return
        if proc.stderr and self.upstream.verbose:
            log.warning("git http-backend: %s", proc.stderr.decode(errors="replace").strip())
        self._relay_cgi(proc.stdout)

    def _relay_cgi(self, output: bytes) -> None:
        head, sep, payload = output.partition(b"\r\n\r\n")
        if not sep:
            head, sep, payload = output.partition(b"\n\n")
        status = HTTPStatus.OK.value
        headers: list[tuple[str, str]] = []
        for raw in head.decode("latin-1").splitlines():
            key, _, value = raw.partition(":")
            if key.lower() == "status":
                status = int(value.strip().split()[0])
            elif key and key.lower() not in ("content-length", "transfer-encoding"):
                headers.append((key, value.strip()))
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)


@dataclass
class ServerHandle:
    """A running server; ``stop()`` (or leaving the ``with`` block) shuts it down."""

    server: UpstreamServer
    thread: threading.Thread

    @property
    def host(self) -> str:
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def make_server(
    dir: Path, host: str = "127.0.0.1", port: int = 0, verbose: bool = False
) -> UpstreamServer:
    if not (dir / "files").is_dir() or not (dir / "git").is_dir():
        raise FileNotFoundError(
            f"{dir} has no files/ and git/: run `python -m sample generate` first"
        )
    return UpstreamServer((host, port), dir, verbose)


def start_server(
    dir: Path, host: str = "127.0.0.1", port: int = 0, verbose: bool = False
) -> ServerHandle:
    """Serve ``dir`` in a background thread; port 0 picks a free port."""
    server = make_server(dir, host, port, verbose)
    thread = threading.Thread(target=server.serve_forever, name="sample-upstream", daemon=True)
    thread.start()
    return ServerHandle(server, thread)

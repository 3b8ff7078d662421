"""Download one file, verified by sha256, over HTTP(S) or from the local file system.

The destination appears atomically and only with the pinned bytes; on any failure nothing is left
behind. HTTP transfers retry transient failures with backoff and resume broken bodies when the
server supports byte ranges.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO
from urllib.parse import urlsplit
from urllib.request import url2pathname

if TYPE_CHECKING:
    # requests, urllib3 and tenacity are imported where a transfer starts: with rich they
    # were about 0.12 s of the 0.42 s every command spent importing, and most commands (a
    # build whose sources are all cached) never download.
    import requests
    from tenacity import RetryCallState, Retrying

from imageforge.errors import ChecksumError, Interrupted, SourceError
from imageforge.textsafe import redact

Progress = Callable[[int, int | None], None]

CHUNK_SIZE = 1 << 16

# The socket each thread reads a body from, and the threads told to stop: a recv blocked on
# a stalled server returns only when its socket is shut down, which another thread may do.
_reading: dict[int, socket.socket] = {}
_stopped: set[int] = set()
_guard = threading.Lock()


def interrupt(threads: Iterable[int]) -> None:
    """Stop the downloads these threads run, at once: a stalled read returns now, not after
    its read timeout, and the download ends with Interrupted, leaving nothing behind."""
    with _guard:
        _stopped.update(threads)
        reading = [_reading[t] for t in _stopped if t in _reading]
    for sock in reading:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _check_stopped() -> None:
    with _guard:
        stopped = threading.get_ident() in _stopped
    if stopped:
        raise Interrupted("the download was stopped; run the command again")


@contextlib.contextmanager
def _reading_from(response: requests.Response) -> Iterator[None]:
    # urllib3 2's response keeps the connection it reads from; without one (another urllib3)
    # a stop waits for the read timeout instead.
    connection = getattr(response.raw, "_connection", None)
    sock = getattr(connection, "sock", None)
    me = threading.get_ident()
    with _guard:
        if isinstance(sock, socket.socket):
            _reading[me] = sock
    try:
        yield
    finally:
        with _guard:
            _reading.pop(me, None)
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: attempts and total time are both bounded."""

    attempts: int = 5
    max_seconds: float = 120.0
    backoff_initial: float = 0.5
    backoff_max: float = 10.0
    retry_after_max: float = 60.0

    def retrying(self, transient: type[BaseException],
                 wait: Callable[[RetryCallState], float] | None = None) -> Retrying:
        """A tenacity loop that retries `transient` within these bounds (exponential
        backoff with jitter unless `wait` decides), re-raising the last failure."""
        from tenacity import (
            Retrying,
            retry_if_exception_type,
            stop_after_attempt,
            stop_before_delay,
            wait_random_exponential,
        )

        return Retrying(
            stop=stop_after_attempt(self.attempts) | stop_before_delay(self.max_seconds),
            wait=wait or wait_random_exponential(multiplier=self.backoff_initial,
                                                 max=self.backoff_max),
            retry=retry_if_exception_type(transient),
            reraise=True,
        )


DEFAULT_POLICY = RetryPolicy()


def _user_agent() -> str:
    try:
        return f"imageforge/{metadata.version('imageforge')}"
    except metadata.PackageNotFoundError:
        # Running from a source tree that was never installed.
        return "imageforge/unknown"


USER_AGENT = _user_agent()


def download(
    url: str,
    dest: Path,
    *,
    sha256: str | None,
    timeout: tuple[float, float] = (10, 60),
    policy: RetryPolicy = DEFAULT_POLICY,
    on_progress: Progress | None = None,
    session: requests.Session | None = None,
) -> str:
    """Fetch `url` into `dest` and return the sha256 hex digest of its bytes.

    `dest` is written only if the digest equals `sha256` (when given). `on_progress` is called
    with (bytes so far, total or None) as data arrives.
    """
    expected = _expected_digest(url, sha256)
    with _guard:
        _stopped.discard(threading.get_ident())
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w+b") as file:
            sink = _Sink(file)
            _fetch(url, sink, timeout=timeout, policy=policy, on_progress=on_progress,
                   session=session)
            file.flush()
            # The cache marks an entry complete right after this; the bytes must be on disk first.
            os.fsync(file.fileno())
        _check_digest(url, expected, sink.digest)
        os.replace(tmp, dest)
    except KeyboardInterrupt:
        tmp.unlink(missing_ok=True)
        raise Interrupted(
            f"the download of {redact(url)} was interrupted and nothing was kept; run the command "
            "again"
        ) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return sink.digest


def _expected_digest(url: str, sha256: str | None) -> str | None:
    if sha256 is None:
        return None
    digest = sha256.strip().lower().removeprefix("sha256:")
    if not SHA256_HEX.fullmatch(digest):
        raise SourceError(
            f"the pinned sha256 {sha256!r} for {redact(url)} is not 64 hex digits; fix the pin or "
            "run `invoke lock`"
        )
    return digest


def _check_digest(url: str, expected: str | None, actual: str) -> None:
    if expected is not None and actual != expected:
        raise ChecksumError(
            f"checksum mismatch for {redact(url)}: expected sha256 {expected} but got {actual}; "
            "the file changed upstream or was corrupted, so check it and update the pin with "
            "`invoke lock --upgrade` if the new file is trusted"
        )


class _Sink:
    """The temp file plus a running digest of exactly the bytes written to it."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.hasher = hashlib.sha256()
        self.received = 0

    def write(self, chunk: bytes) -> None:
        self.file.write(chunk)
        self.hasher.update(chunk)
        self.received += len(chunk)

    def reset(self) -> None:
        self.file.seek(0)
        self.file.truncate()
        self.hasher = hashlib.sha256()
        self.received = 0

    @property
    def digest(self) -> str:
        return self.hasher.hexdigest()


def _fetch(
    url: str,
    sink: _Sink,
    *,
    timeout: tuple[float, float],
    policy: RetryPolicy,
    on_progress: Progress | None,
    session: requests.Session | None,
) -> None:
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError as exc:       # e.g. an unclosed "[" of an IPv6 host
        raise SourceError(f"cannot download {redact(url)}: not a valid URL ({exc}); fix it "
                          "in the manifest") from None
    if scheme in ("http", "https"):
        _fetch_http(url, sink, timeout=timeout, policy=policy, on_progress=on_progress,
                    session=session)
    elif scheme == "file":
        _copy_local(_file_url_path(url), sink, on_progress)
    elif not scheme:
        _copy_local(Path(url), sink, on_progress)
    else:
        raise SourceError(
            f"cannot download {redact(url)}: unsupported scheme {scheme!r}; use https://, "
            "http://, file:// or a local path"
        )


def _file_url_path(url: str) -> Path:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise SourceError(
            f"{redact(url)} names a remote host; file:// URLs must be local (file:///path)"
        )
    return Path(url2pathname(parts.path))


def _copy_local(path: Path, sink: _Sink, on_progress: Progress | None) -> None:
    try:
        source = path.open("rb")
    except FileNotFoundError:
        raise SourceError(f"{path} does not exist; check the source path") from None
    except OSError as exc:
        raise SourceError(f"cannot read {path} ({exc.strerror}); check the source path") from None
    with source:
        total = os.fstat(source.fileno()).st_size
        while chunk := source.read(CHUNK_SIZE):
            sink.write(chunk)
            if on_progress is not None:
                on_progress(sink.received, total)


class _Transient(Exception):
    """A failure worth retrying; `reason` is safe to show (no URL, no secrets)."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


@dataclass
class _Transfer:
    """State that survives between attempts, so a broken body can be resumed."""

    url: str
    sink: _Sink
    timeout: tuple[float, float]
    deadline: float
    max_seconds: float
    on_progress: Progress | None
    total: int | None = None
    resumable: bool = False
    validator: str | None = None
    attempts: int = 0


def _fetch_http(
    url: str,
    sink: _Sink,
    *,
    timeout: tuple[float, float],
    policy: RetryPolicy,
    on_progress: Progress | None,
    session: requests.Session | None,
) -> None:
    transfer = _Transfer(
        url=url, sink=sink, timeout=timeout, deadline=time.monotonic() + policy.max_seconds,
        max_seconds=policy.max_seconds, on_progress=on_progress,
    )
    import requests

    retrying = policy.retrying(_Transient, wait=_wait(policy))
    http = session or requests.Session()
    try:
        retrying(_attempt, http, transfer)
    except _Transient as exc:
        raise SourceError(
            f"could not download {redact(url)} after {transfer.attempts} attempt(s): "
            f"{exc.reason}; check the URL and your network, then run again"
        ) from exc
    finally:
        if session is None:
            http.close()


def _wait(policy: RetryPolicy) -> Callable[[RetryCallState], float]:
    from tenacity import wait_random_exponential

    backoff = wait_random_exponential(multiplier=policy.backoff_initial, max=policy.backoff_max)

    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, _Transient) and error.retry_after is not None:
            return min(error.retry_after, policy.retry_after_max)
        return backoff(state)

    return wait


def _attempt(http: requests.Session, transfer: _Transfer) -> None:
    import requests
    import urllib3

    _check_stopped()
    transfer.attempts += 1
    url = transfer.url
    try:
        try:
            with http.get(url, headers=_request_headers(transfer), stream=True,
                          timeout=transfer.timeout) as response, _reading_from(response):
                _check_status(response, transfer)
                _start_body(response, transfer)
                _stream_body(response, transfer)
                # A body cut short by interrupt() reads as a short one: it is a stop.
                _check_stopped()
        except (requests.RequestException, urllib3.exceptions.HTTPError, _Transient):
            # ... or as a broken connection: a stop too, never a retry.
            _check_stopped()
            raise
    except requests.exceptions.SSLError:
        raise SourceError(
            f"TLS verification failed for {redact(url)}; check the host's certificate or use a "
            "mirror"
        ) from None
    except requests.Timeout as exc:
        raise _Transient("the connection timed out") from exc
    except requests.ConnectionError as exc:
        raise _Transient("could not connect") from exc
    except urllib3.exceptions.ReadTimeoutError as exc:
        raise _Transient("the server stopped sending data (read timeout)") from exc
    except (urllib3.exceptions.HTTPError, requests.exceptions.ChunkedEncodingError) as exc:
        raise _Transient(f"the connection broke after {transfer.sink.received} bytes") from exc
    except requests.RequestException as exc:
        raise SourceError(
            f"cannot download {redact(url)} ({type(exc).__name__}); check the URL"
        ) from None


def _request_headers(transfer: _Transfer) -> dict[str, str]:
    # Hash the bytes exactly as served: a transparently decompressed body has another digest.
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if transfer.sink.received and transfer.resumable:
        headers["Range"] = f"bytes={transfer.sink.received}-"
        if transfer.validator:
            headers["If-Range"] = transfer.validator
    return headers


def _check_status(response: requests.Response, transfer: _Transfer) -> None:
    status = response.status_code
    if status in (200, 206):
        return
    reason = f"the server answered {status} {response.reason}"
    if status == 429 or status >= 500:
        raise _Transient(reason, retry_after=_retry_after(response))
    if status == 416 and transfer.sink.received:
        transfer.sink.reset()
        raise _Transient("the server refused to resume the download")
    raise SourceError(
        f"{redact(transfer.url)} answered {status} {response.reason}; check the URL and the "
        "version in the manifest"
    )


def _retry_after(response: requests.Response) -> float | None:
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    # ASCII digits only: str.isdigit() also takes "²", which float() refuses.
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _start_body(response: requests.Response, transfer: _Transfer) -> None:
    if response.status_code == 206:
        _check_content_range(response, transfer)
    else:
        # A 200 carries the whole file, also when the server ignored our Range header.
        transfer.sink.reset()
        transfer.total = _content_length(response)
    accepts = response.headers.get("Accept-Ranges", "").strip().lower() == "bytes"
    transfer.resumable = accepts or response.status_code == 206
    transfer.validator = _validator(response) or transfer.validator


def _check_content_range(response: requests.Response, transfer: _Transfer) -> None:
    match = CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
    start = int(match.group(1)) if match else -1
    total = int(match.group(3)) if match and match.group(3) != "*" else transfer.total
    if start != transfer.sink.received or (transfer.total is not None and total != transfer.total):
        transfer.sink.reset()
        transfer.resumable = False
        raise _Transient("the server resumed at the wrong offset")
    transfer.total = total


def _content_length(response: requests.Response) -> int | None:
    value = response.headers.get("Content-Length", "").strip()
    return int(value) if value.isdigit() else None


def _validator(response: requests.Response) -> str | None:
    """A strong ETag or Last-Modified, so a resumed body provably continues the same file."""
    etag = response.headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return response.headers.get("Last-Modified")


def _stream_body(response: requests.Response, transfer: _Transfer) -> None:
    sink = transfer.sink
    for chunk in response.raw.stream(CHUNK_SIZE, decode_content=False):
        sink.write(chunk)
        if transfer.on_progress is not None:
            transfer.on_progress(sink.received, transfer.total)
        if time.monotonic() > transfer.deadline:
            raise SourceError(
                f"downloading {redact(transfer.url)} took longer than {transfer.max_seconds:g} s; "
                "use a closer mirror or raise the time limit"
            )
    if transfer.total is not None and sink.received < transfer.total:
        raise _Transient(f"the connection closed after {sink.received} of {transfer.total} bytes")

"""The download against real misbehaving servers on 127.0.0.1 (imageforge/sources/download.py): each
failure's full message, TLS, the caller's session, the time limit, backoff, where the partial
file lives and what is left when it is gone, and interrupt() from another thread."""

from __future__ import annotations

import hashlib
import re
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from imageforge.errors import Interrupted, SourceError
from imageforge.sources import download as dl
from tests.servers import ScriptedServer

BODY = bytes(range(256)) * 400  # 100 KiB: two chunks
SHA = hashlib.sha256(BODY).hexdigest()
ONE_ATTEMPT = dl.RetryPolicy(attempts=1, max_seconds=30)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running



@pytest.fixture
def tls_server(certificate: tuple[Path, Path]) -> Iterator[ScriptedServer]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    running = ScriptedServer()
    running.use_tls(context)
    with running:
        yield running


def test_an_untrusted_certificate_is_final_and_names_the_redacted_url(
        tls_server: ScriptedServer, tmp_path: Path) -> None:
    tls_server.route("/f", BODY)
    url = tls_server.https_url("/f") + "?token=s3cret"
    with pytest.raises(SourceError) as info:
        dl.download(url, tmp_path / "f", sha256=SHA)
    assert str(info.value) == (
        f"TLS verification failed for {tls_server.https_url('/f')}?token=***; check the host's "
        "certificate or use a mirror")
    assert tls_server.count("/f") == 0  # refused in the handshake, never asked, never retried
    assert list(tmp_path.iterdir()) == []


def test_https_works_through_the_callers_session(tls_server: ScriptedServer,
                                                 certificate: tuple[Path, Path],
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # requests lets these variables override a session's own `verify`.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    tls_server.route("/f", BODY)
    with requests.Session() as session:
        session.verify = str(certificate[0])  # the caller trusts this certificate
        assert dl.download(tls_server.https_url("/f"), tmp_path / "f", sha256=SHA,
                           session=session) == SHA
    assert (tmp_path / "f").read_bytes() == BODY


def test_the_callers_session_is_used_and_left_open_for_the_next_download(
        server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/a", BODY)
    server.route("/b", BODY[::-1])
    with requests.Session() as session:
        dl.download(server.url("/a"), tmp_path / "a", sha256=SHA, session=session)
        dl.download(server.url("/b"), tmp_path / "b", sha256=None, session=session)
    assert (server.count("/a"), server.count("/b")) == (1, 1)
    assert server.connections == 1  # the second download reused the session's connection
    assert (tmp_path / "b").read_bytes() == BODY[::-1]


def _one_attempt_failure(url: str, dest: Path, timeout: tuple[float, float] = (5, 5)) -> str:
    with pytest.raises(SourceError) as info:
        dl.download(url, dest, sha256=None, timeout=timeout, policy=ONE_ATTEMPT)
    assert list(dest.parent.iterdir()) == []
    return str(info.value)


def _gave_up(url: str, reason: str) -> str:
    return (f"could not download {url} after 1 attempt(s): {reason}; check the URL and your "
            "network, then run again")


def test_no_answer_within_the_read_timeout_is_a_timed_out_connection(
        server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/f", BODY, stall=30, stalls=1)
    message = _one_attempt_failure(server.url("/f"), tmp_path / "f", timeout=(5, 0.05))
    assert message == _gave_up(server.url("/f"), "the connection timed out")


def test_a_body_that_stops_coming_is_a_read_timeout(server: ScriptedServer,
                                                    tmp_path: Path) -> None:
    server.route("/f", BODY, hold_at=1000)
    message = _one_attempt_failure(server.url("/f"), tmp_path / "f", timeout=(5, 0.05))
    assert message == _gave_up(server.url("/f"),
                               "the server stopped sending data (read timeout)")


def test_a_connection_closed_mid_body_names_the_bytes_received(server: ScriptedServer,
                                                               tmp_path: Path) -> None:
    server.route("/f", BODY, truncate_at=1000)
    message = _one_attempt_failure(server.url("/f"), tmp_path / "f")
    assert message == _gave_up(server.url("/f"), "the connection broke after 1000 bytes")


def test_a_url_requests_cannot_use_is_final_and_named(tmp_path: Path) -> None:
    message = _one_attempt_failure("http://u:pw@127.0.0.1:notaport/f", tmp_path / "f")
    assert message == ("cannot download http://***@127.0.0.1:notaport/f (InvalidURL); check "
                       "the URL")


def test_a_url_that_does_not_parse_is_a_source_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(SourceError) as info:
        dl.download("http://[::1/f", tmp_path / "f", sha256=None)
    assert str(info.value) == ("cannot download ***: not a valid URL (Invalid IPv6 URL); "
                               "fix it in the manifest")
    assert not (tmp_path / "f").exists()


def test_the_time_limit_ends_a_transfer_mid_body(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/f", BODY)
    policy = dl.RetryPolicy(attempts=5, max_seconds=1e-6)
    with pytest.raises(SourceError) as info:
        dl.download(server.url("/f") + "?sig=s3cret", tmp_path / "f", sha256=SHA, policy=policy)
    assert str(info.value) == (
        f"downloading {server.url('/f')}?sig=*** took longer than 1e-06 s; use a closer mirror "
        "or raise the time limit")
    assert server.count("/f") == 1  # a time limit is not retried
    assert list(tmp_path.iterdir()) == []


def test_backoff_starts_at_backoff_initial(server: ScriptedServer, tmp_path: Path) -> None:
    # Six failures fit in a 2 s budget only when the waits start at 1 ms (at most 63 ms in
    # all); waits that started at 1 s would outgrow the budget and end the download.
    server.route("/f", BODY, failures=6)
    policy = dl.RetryPolicy(attempts=7, max_seconds=2, backoff_initial=0.001, backoff_max=60)
    assert dl.download(server.url("/f"), tmp_path / "f", sha256=SHA, policy=policy) == SHA
    assert server.count("/f") == 7


def test_backoff_is_capped_at_backoff_max(server: ScriptedServer, tmp_path: Path) -> None:
    # Waits that started at 100 s fit in a 2 s budget only because backoff_max caps them.
    server.route("/f", BODY, failures=3)
    policy = dl.RetryPolicy(attempts=4, max_seconds=2, backoff_initial=100, backoff_max=0.001)
    assert dl.download(server.url("/f"), tmp_path / "f", sha256=SHA, policy=policy) == SHA
    assert server.count("/f") == 4


def test_a_plain_path_reports_progress(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.write_bytes(BODY)
    seen: list[tuple[int, int | None]] = []
    dl.download(str(source), tmp_path / "out", sha256=SHA,
                on_progress=lambda n, total: seen.append((n, total)))
    assert seen == [(dl.CHUNK_SIZE, len(BODY)), (len(BODY), len(BODY))]


def test_missing_parent_folders_are_created(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.write_bytes(BODY)
    dest = tmp_path / "cache" / "efa" / "1.2" / "efa.tar.gz"
    assert dl.download(str(source), dest, sha256=SHA) == SHA
    assert dest.read_bytes() == BODY


def _partials(folder: Path) -> list[Path]:
    return sorted(folder.iterdir())


def test_the_partial_file_is_hidden_beside_the_destination(tmp_path: Path) -> None:
    source = tmp_path / "src" / "efa.tar.gz"
    source.parent.mkdir()
    source.write_bytes(BODY)
    dest = tmp_path / "out" / "efa.tar.gz"
    during: list[list[str]] = []

    def look(_done: int, _total: int | None) -> None:
        during.append([p.name for p in _partials(dest.parent)])

    dl.download(str(source), dest, sha256=SHA, on_progress=look)
    assert len(during) == 2
    (name,) = during[0]
    assert re.fullmatch(r"\.efa\.tar\.gz\.\w{8}\.part", name), name
    assert during[1] == [name]
    assert [p.name for p in _partials(dest.parent)] == ["efa.tar.gz"]


def _removing_the_partial_then(dest: Path, error: BaseException
                               ) -> dl.Progress:
    """A progress callback that deletes the partial file (as a concurrent clean-up would), then
    raises `error`."""
    def report(_done: int, _total: int | None) -> None:
        for partial in _partials(dest.parent):
            partial.unlink()
        raise error

    return report


def test_ctrl_c_after_the_partial_file_vanished_is_still_an_interruption(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.write_bytes(BODY)
    dest = tmp_path / "out" / "f"
    with pytest.raises(Interrupted) as info:
        dl.download(str(source), dest, sha256=SHA,
                    on_progress=_removing_the_partial_then(dest, KeyboardInterrupt()))
    assert str(info.value) == (f"the download of {source} was interrupted and nothing was kept; "
                               "run the command again")
    assert _partials(dest.parent) == []


def test_a_failure_after_the_partial_file_vanished_is_raised_as_it_is(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.write_bytes(BODY)
    dest = tmp_path / "out" / "f"
    stop = Interrupted("fetching sources was stopped; run the command again")
    with pytest.raises(Interrupted) as info:
        dl.download(str(source), dest, sha256=SHA,
                    on_progress=_removing_the_partial_then(dest, stop))
    assert info.value is stop
    assert _partials(dest.parent) == []


def test_interrupt_stops_a_stalled_read_at_once(server: ScriptedServer, tmp_path: Path) -> None:
    # The first chunk arrives, then the server holds the rest back.
    route = server.route("/f", BODY, hold_at=dl.CHUNK_SIZE)
    reading = threading.Event()
    outcome: list[BaseException] = []

    def fetch() -> None:
        try:
            dl.download(server.url("/f"), tmp_path / "f", sha256=SHA, timeout=(5, 30),
                        policy=ONE_ATTEMPT, on_progress=lambda _n, _total: reading.set())
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=fetch)
    worker.start()
    try:
        assert reading.wait(timeout=10)
        dl.interrupt([worker.ident or 0])
        worker.join(timeout=5)  # far below the 30 s read timeout
        stopped_in_time = not worker.is_alive()
    finally:
        route.release.set()
        worker.join()
    assert stopped_in_time
    (error,) = outcome
    assert isinstance(error, Interrupted)
    assert str(error) == "the download was stopped; run the command again"
    assert server.count("/f") == 1  # a stop is never retried
    assert list(tmp_path.iterdir()) == []


def test_a_repeated_stop_finds_the_connection_closed_and_still_stops_once(
        server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/f", BODY)

    def stop_twice_at_the_end(done: int, total: int | None) -> None:
        if done == total:
            me = [threading.get_ident()]
            dl.interrupt(me)  # shuts the connection down; the server then closes its side
            assert server.wait_closed(1, timeout=10)
            dl.interrupt(me)  # as a second Ctrl-C would: the connection is gone by now

    with pytest.raises(Interrupted) as info:
        dl.download(server.url("/f"), tmp_path / "f", sha256=SHA,
                    on_progress=stop_twice_at_the_end)
    assert str(info.value) == "the download was stopped; run the command again"
    assert list(tmp_path.iterdir()) == []
    # The stop was for that download only: the next one on this thread runs.
    assert dl.download(server.url("/f"), tmp_path / "f", sha256=SHA) == SHA


class _Flaky(Exception):
    """The transient failure of the calls below."""


def _failing(times: int) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise _Flaky(f"failure {len(calls)}")
        return "done"
    return calls, call


def test_the_default_backoff_starts_at_backoff_initial() -> None:
    # What repository listings and index pages retry with (no `wait` of their own): six
    # failures fit in a 2 s budget only when the random waits start at 1 ms (63 ms at most in
    # all); windows that started at 1 s would outgrow the budget and re-raise the failure.
    policy = dl.RetryPolicy(attempts=7, max_seconds=2, backoff_initial=0.001, backoff_max=60)
    calls, call = _failing(6)
    assert policy.retrying(_Flaky)(call) == "done"
    assert len(calls) == 7


def test_the_default_backoff_is_capped_at_backoff_max() -> None:
    policy = dl.RetryPolicy(attempts=4, max_seconds=2, backoff_initial=100, backoff_max=0.001)
    calls, call = _failing(3)
    assert policy.retrying(_Flaky)(call) == "done"
    assert len(calls) == 4


def test_the_default_retry_gives_up_after_the_attempts_with_the_last_failure() -> None:
    policy = dl.RetryPolicy(attempts=3, max_seconds=2, backoff_initial=0.001, backoff_max=0.001)
    calls, call = _failing(5)
    with pytest.raises(_Flaky, match=r"^failure 3$"):
        policy.retrying(_Flaky)(call)
    assert len(calls) == 3

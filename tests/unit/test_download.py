from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imageforge.errors import ChecksumError, Interrupted, SourceError
from imageforge.sources.download import RetryPolicy, download
from imageforge.textsafe import redact
from tests.servers import ScriptedServer

BODY = os.urandom(300_000)
DIGEST = hashlib.sha256(BODY).hexdigest()
FAST = RetryPolicy(attempts=5, max_seconds=10, backoff_initial=0.01, backoff_max=0.02)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def leftovers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_http_happy_path(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/efa.tar.gz", BODY)
    dest = tmp_path / "efa.tar.gz"
    seen: list[tuple[int, int | None]] = []

    digest = download(server.url("/efa.tar.gz"), dest, sha256=DIGEST, policy=FAST,
                      on_progress=lambda done, total: seen.append((done, total)))

    assert digest == DIGEST
    assert dest.read_bytes() == BODY
    assert leftovers(tmp_path) == ["efa.tar.gz"]
    assert seen[-1] == (len(BODY), len(BODY))
    assert server.requests_for("/efa.tar.gz")[0].headers["User-Agent"].startswith("imageforge/")


def test_without_pin_returns_digest(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/f", BODY)
    assert download(server.url("/f"), tmp_path / "f", sha256=None, policy=FAST) == DIGEST


def test_file_url_and_plain_path(tmp_path: Path) -> None:
    source = tmp_path / "src" / "a b.bin"
    source.parent.mkdir()
    source.write_bytes(BODY)
    out = tmp_path / "out"

    assert download(source.as_uri(), out / "one", sha256=DIGEST) == DIGEST
    assert download(str(source), out / "two", sha256=DIGEST.upper()) == DIGEST
    assert (out / "one").read_bytes() == (out / "two").read_bytes() == BODY
    assert leftovers(out) == ["one", "two"]


def test_missing_local_file(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        download(str(tmp_path / "nope.tar.gz"), tmp_path / "out" / "x", sha256=None)
    assert leftovers(tmp_path / "out") == []


def test_503_twice_then_ok(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/f", BODY, failures=2)
    assert download(server.url("/f"), tmp_path / "f", sha256=DIGEST, policy=FAST) == DIGEST
    assert server.count("/f") == 3


def test_429_retry_after_is_honoured(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/f", BODY, failures=1, fail_status=429, retry_after="1")
    download(server.url("/f"), tmp_path / "f", sha256=DIGEST, policy=FAST)
    assert server.count("/f") == 2
    # Measured by the server: the retry came no sooner than Retry-After said (FAST's own
    # backoff is at most 0.02 s). A lower bound: a loaded machine only makes the gap longer.
    (gap,) = server.gaps("/f")
    assert gap >= 1.0, gap


def test_retry_after_is_capped(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/f", BODY, failures=1, retry_after="3600")
    policy = RetryPolicy(attempts=3, max_seconds=10, backoff_initial=0.01, backoff_max=0.02,
                         retry_after_max=0.05)
    # An uncapped wait of 3600 s would not fit in max_seconds: tenacity stops before such a
    # delay, so the download would fail after one attempt instead of retrying.
    download(server.url("/f"), tmp_path / "f", sha256=DIGEST, policy=policy)
    assert server.count("/f") == 2
    # The capped wait was still waited (backoff alone is at most 0.02 s).
    (gap,) = server.gaps("/f")
    assert gap >= 0.05, gap


def test_a_retry_after_that_is_no_number_is_ignored(server: ScriptedServer,
                                                      tmp_path: Path) -> None:
    # "²" passes str.isdigit() but not float(): it once ended the download with a traceback.
    server.route("/f", BODY, failures=1, fail_status=429, retry_after="\u00b2")
    assert download(server.url("/f"), tmp_path / "f", sha256=DIGEST, policy=FAST) == DIGEST
    assert server.count("/f") == 2


def test_404_is_not_retried(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/gone", status=404)
    with pytest.raises(SourceError, match=r"answered 404.*check the URL") as caught:
        download(server.url("/gone"), tmp_path / "f", sha256=DIGEST, policy=FAST)
    assert not isinstance(caught.value, ChecksumError)
    assert server.count("/gone") == 1
    assert leftovers(tmp_path) == []


def test_truncated_body_is_resumed_with_range(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/f", BODY, truncate_at=100_000, accept_ranges=True)
    assert download(server.url("/f"), tmp_path / "f", sha256=DIGEST, policy=FAST) == DIGEST
    assert server.ranges("/f") == [None, "bytes=100000-"]
    assert server.requests_for("/f")[1].headers["If-Range"] == '"v1"'
    assert (tmp_path / "f").read_bytes() == BODY


def test_truncated_body_without_range_support_restarts(
    server: ScriptedServer, tmp_path: Path
) -> None:
    server.route("/f", BODY, truncate_at=100_000, truncations=2)
    assert download(server.url("/f"), tmp_path / "f", sha256=DIGEST, policy=FAST) == DIGEST
    assert server.ranges("/f") == [None, None, None]


def test_range_answered_with_200_restarts(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/f", BODY, truncate_at=100_000, accept_ranges=True, honour_ranges=False)
    assert download(server.url("/f"), tmp_path / "f", sha256=DIGEST, policy=FAST) == DIGEST
    assert server.ranges("/f") == [None, "bytes=100000-"]
    assert (tmp_path / "f").read_bytes() == BODY


def test_wrong_content_range_restarts(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/f", BODY, truncate_at=100_000, accept_ranges=True, range_shift=7)
    assert download(server.url("/f"), tmp_path / "f", sha256=DIGEST, policy=FAST) == DIGEST
    assert server.ranges("/f") == [None, "bytes=100000-", None]


def test_wrong_bytes_raise_checksum_error(server: ScriptedServer, tmp_path: Path) -> None:
    wrong = b"not the installer" * 1000
    server.route("/efa.tar.gz", wrong)
    url = server.url("/efa.tar.gz")
    with pytest.raises(ChecksumError) as caught:
        download(url, tmp_path / "efa.tar.gz", sha256=DIGEST, policy=FAST)
    message = str(caught.value)
    assert url in message
    assert DIGEST in message
    assert hashlib.sha256(wrong).hexdigest() in message
    assert leftovers(tmp_path) == []
    assert server.count("/efa.tar.gz") == 1


def test_read_timeout_is_retried_then_fails_in_bounded_time(
    server: ScriptedServer, tmp_path: Path
) -> None:
    # The server would stall for a minute (a safety net: a client without a read timeout
    # gets the file then, and the test fails); the client must give up on each attempt.
    server.route("/slow", BODY, stall=60, stalls=100)
    policy = RetryPolicy(attempts=3, max_seconds=120, backoff_initial=0.01, backoff_max=0.02)
    with pytest.raises(SourceError, match="after 3 attempt"):
        download(server.url("/slow"), tmp_path / "f", sha256=DIGEST, timeout=(1, 0.2),
                 policy=policy)
    seen = server.requests_for("/slow")
    assert len(seen) == 3
    # The server saw every attempt hang up while it stalled, and none get an answer.
    assert all(s.hung_up.wait(timeout=30) for s in seen)
    assert not any(s.answered.is_set() for s in seen)
    assert leftovers(tmp_path) == []


def test_read_timeout_then_success(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/slow", BODY, stall=5, stalls=1)
    assert download(server.url("/slow"), tmp_path / "f", sha256=DIGEST, timeout=(1, 0.2),
                    policy=FAST) == DIGEST
    assert server.count("/slow") == 2


def test_attempts_are_bounded(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/down", failures=1000)
    policy = RetryPolicy(attempts=4, max_seconds=10, backoff_initial=0.01, backoff_max=0.02)
    with pytest.raises(SourceError, match=r"after 4 attempt\(s\): the server answered 503"):
        download(server.url("/down"), tmp_path / "f", sha256=None, policy=policy)
    assert server.count("/down") == 4
    assert leftovers(tmp_path) == []


def test_total_time_is_bounded(server: ScriptedServer, tmp_path: Path) -> None:
    # The server gives in on its 51st request: a client that kept retrying past max_seconds
    # gets the file (after about 2.5 s of backoff) and the test fails. Within 0.5 s the
    # backoff (0.05 s on average once grown) leaves room for about ten attempts, far fewer on
    # a loaded machine, never 51.
    server.route("/down", BODY, failures=50)
    policy = RetryPolicy(attempts=10_000, max_seconds=0.5, backoff_initial=0.05, backoff_max=0.1)
    with pytest.raises(SourceError, match=r"after (\d+) attempt\(s\)") as caught:
        download(server.url("/down"), tmp_path / "f", sha256=None, policy=policy)
    attempts = server.count("/down")
    assert 1 <= attempts < 51
    assert f"after {attempts} attempt(s)" in str(caught.value)
    assert leftovers(tmp_path) == []


def test_connection_refused_is_retried(tmp_path: Path) -> None:
    with ScriptedServer() as stopped:
        url = stopped.url("/f")
    with pytest.raises(SourceError, match=r"after 5 attempt\(s\): could not connect"):
        download(url, tmp_path / "f", sha256=None, policy=FAST)


def test_errors_redact_secrets(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/gone", status=404)
    url = server.url("/gone").replace("http://", "http://alice:hunter2@") + "?token=s3cret"
    with pytest.raises(SourceError) as caught:
        download(url, tmp_path / "f", sha256=None, policy=FAST)
    message = str(caught.value)
    assert "hunter2" not in message
    assert "s3cret" not in message
    assert "http://***@127.0.0.1" in message


def test_interrupt_leaves_nothing(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/f", BODY)

    def press_ctrl_c(_done: int, _total: int | None) -> None:
        raise KeyboardInterrupt

    with pytest.raises(Interrupted, match="interrupted and nothing was kept"):
        download(server.url("/f"), tmp_path / "f", sha256=DIGEST, policy=FAST,
                 on_progress=press_ctrl_c)
    assert leftovers(tmp_path) == []


def test_invalid_pin_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="not 64 hex digits"):
        download("https://example.invalid/f", tmp_path / "f", sha256="abc")


def test_unsupported_scheme(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="unsupported scheme 'ftp'"):
        download("ftp://example.invalid/f", tmp_path / "f", sha256=None)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://user:pass@host/x.tgz", "https://***@host/x.tgz"),
        ("https://token@host:8443/x", "https://***@host:8443/x"),
        ("https://host/x?token=abc&v=1", "https://host/x?token=***&v=1"),
        (
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=AK&X-Amz-Signature=ff&X-Amz-Expires=60",
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***"
            "&X-Amz-Expires=60",
        ),
        (
            "https://acct.blob.core.windows.net/c/f?sv=1&sig=abc%3D",
            "https://acct.blob.core.windows.net/c/f?sv=1&sig=***",
        ),
        ("https://host/plain.tar.gz", "https://host/plain.tar.gz"),
        ("file:///srv/mirror/x.tgz", "file:///srv/mirror/x.tgz"),
        ("/srv/mirror/x.tgz", "/srv/mirror/x.tgz"),
    ],
)
def test_redact(url: str, expected: str) -> None:
    assert redact(url) == expected


@given(secret=st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ0123456789", min_size=6, max_size=20))
def test_redact_never_shows_secrets(secret: str) -> None:
    url = f"https://me:{secret}@mirror.example/f.tgz?sig={secret}&api_key={secret}#frag"
    assert secret not in redact(url)

"""Redaction and the download's smaller decisions (imageforge/sources/download.py): what a shown URL
hides, how a pin is read, how Retry-After, Content-Range, Content-Length and validators are
read, what a resumed request asks for, and local copies; real files and a real HTTP server on
127.0.0.1 where a transfer is involved."""

from __future__ import annotations

import email.utils
import hashlib
import time
from importlib import metadata
from pathlib import Path

import pytest
import requests
from pytest_httpserver import HTTPServer
from requests.structures import CaseInsensitiveDict

from imageforge import textsafe
from imageforge.errors import ChecksumError, SourceError
from imageforge.sources import download as dl

BODY = b"imageforge " * 1000
SHA = hashlib.sha256(BODY).hexdigest()


@pytest.mark.parametrize(("url", "shown"), [
    ("https://a@b@host/x", "https://***@host/x"),
    ("https://h/x?token&v=1", "https://h/x?token&v=1"),
    ("https://h/x?%74oken=abc", "https://h/x?%74oken=***"),
    ("https://h/x?API_KEY=abc&Auth=1", "https://h/x?API_KEY=***&Auth=***"),
    ("https://h/x?password=p#frag", "https://h/x?password=***#frag"),
    ("https://h/x?v=1&secret=", "https://h/x?v=1&secret=***"),
    ("https://h/x?a=1&&b=2", "https://h/x?a=1&&b=2"),
    ("https://h/x?tok=1", "https://h/x?tok=1"),
    ("https://h/x?token=a=b", "https://h/x?token=***"),
    ("https://h/x?v=token=1", "https://h/x?v=token=1"),
])
def test_redact_hides_user_info_and_secret_query_values_only(url: str, shown: str) -> None:
    assert textsafe.redact(url) == shown


def test_redact_of_an_unparseable_url_shows_nothing() -> None:
    assert textsafe.redact("https://[::1/x?token=s3cret") == "***"


def test_a_pin_is_read_in_any_case_with_or_without_its_prefix(tmp_path: Path) -> None:
    source = tmp_path / "f"
    source.write_bytes(BODY)
    for pin in (SHA, SHA.upper(), f"  sha256:{SHA}\n", f"SHA256:{SHA.upper()}"):
        assert dl.download(str(source), tmp_path / "out", sha256=pin) == SHA


@pytest.mark.parametrize("pin", ["", "abc", SHA[:-1], SHA + "0", "md5:" + SHA, SHA[:-1] + "g"])
def test_a_pin_that_is_not_64_hex_digits_is_refused_before_any_fetch(tmp_path: Path,
                                                                      pin: str) -> None:
    with pytest.raises(SourceError) as info:
        dl.download("https://user:pw@nowhere.invalid/f", tmp_path / "out", sha256=pin)
    assert str(info.value) == (f"the pinned sha256 {pin!r} for https://***@nowhere.invalid/f is "
                               "not 64 hex digits; fix the pin or run `invoke lock`")
    assert list(tmp_path.iterdir()) == []


def test_a_mismatch_names_both_digests_and_keeps_nothing(tmp_path: Path) -> None:
    source = tmp_path / "src" / "f"
    source.parent.mkdir()
    source.write_bytes(BODY)
    wrong = "0" * 64
    with pytest.raises(ChecksumError) as info:
        dl.download(str(source), tmp_path / "out" / "f", sha256=wrong)
    assert str(info.value) == (
        f"checksum mismatch for {source}: expected sha256 {wrong} but got {SHA}; the file "
        "changed upstream or was corrupted, so check it and update the pin with `invoke lock "
        "--upgrade` if the new file is trusted")
    assert list((tmp_path / "out").iterdir()) == []


def test_a_local_copy_reports_progress_against_the_file_size(tmp_path: Path) -> None:
    big = bytes(range(256)) * 1024  # 4 chunks
    source = tmp_path / "f"
    source.write_bytes(big)
    seen: list[tuple[int, int | None]] = []
    dl.download(source.as_uri(), tmp_path / "out", sha256=None,
                on_progress=lambda n, total: seen.append((n, total)))
    assert seen == [(dl.CHUNK_SIZE * i, len(big)) for i in range(1, 5)]
    assert (tmp_path / "out").read_bytes() == big


def test_file_urls_must_be_local_and_missing_files_are_named(tmp_path: Path) -> None:
    source = tmp_path / "f"
    source.write_bytes(BODY)
    assert dl.download(f"file://localhost{source}", tmp_path / "a", sha256=SHA) == SHA
    with pytest.raises(SourceError) as info:
        dl.download(f"file://host.example{source}", tmp_path / "b", sha256=None)
    assert str(info.value) == (f"file://host.example{source} names a remote host; file:// URLs "
                               "must be local (file:///path)")
    with pytest.raises(SourceError) as info:
        dl.download(str(tmp_path / "missing"), tmp_path / "c", sha256=None)
    assert str(info.value) == f"{tmp_path / 'missing'} does not exist; check the source path"
    with pytest.raises(SourceError) as info:
        dl.download(str(tmp_path), tmp_path / "d", sha256=None)
    assert str(info.value).startswith(f"cannot read {tmp_path} (")
    assert str(info.value).endswith("); check the source path")


def test_an_unsupported_scheme_is_named_with_the_url_redacted(tmp_path: Path) -> None:
    with pytest.raises(SourceError) as info:
        dl.download("FTP://u:p@h/f", tmp_path / "f", sha256=None)
    assert str(info.value) == ("cannot download ftp://***@h/f: unsupported scheme 'ftp'; use "
                               "https://, http://, file:// or a local path")


def _response(status: int = 200, /, **headers: str) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    response.headers = CaseInsensitiveDict(headers)
    return response


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert dl._retry_after(_response()) is None
    assert dl._retry_after(_response(**{"Retry-After": "  "})) is None
    assert dl._retry_after(_response(**{"Retry-After": " 7 "})) == 7.0
    assert dl._retry_after(_response(**{"Retry-After": "soon"})) is None
    past = email.utils.formatdate(time.time() - 3600, usegmt=True)
    assert dl._retry_after(_response(**{"Retry-After": past})) == 0.0
    future = email.utils.formatdate(time.time() + 100, usegmt=True)
    waited = dl._retry_after(_response(**{"Retry-After": future}))
    assert waited is not None
    assert 95 < waited <= 100


def test_content_length_and_validators() -> None:
    assert dl._content_length(_response(**{"Content-Length": " 42 "})) == 42
    assert dl._content_length(_response(**{"Content-Length": "-1"})) is None
    assert dl._content_length(_response()) is None
    assert dl._validator(_response(ETag='"v1"', **{"Last-Modified": "x"})) == '"v1"'
    assert dl._validator(_response(ETag='W/"weak"', **{"Last-Modified": "lm"})) == "lm"
    assert dl._validator(_response(ETag='W/"weak"')) is None
    assert dl._validator(_response()) is None


def _transfer(tmp_path: Path, received: bytes = b"", total: int | None = None
              ) -> dl._Transfer:
    sink = dl._Sink((tmp_path / "part").open("w+b"))
    sink.write(received)
    return dl._Transfer(url="http://h/f", sink=sink, timeout=(1, 1), deadline=0.0,
                        max_seconds=1.0, on_progress=None, total=total)


def test_request_headers_ask_for_the_rest_only_of_a_resumable_body(tmp_path: Path) -> None:
    fresh = _transfer(tmp_path)
    assert dl._request_headers(fresh) == {"User-Agent": dl.USER_AGENT,
                                          "Accept-Encoding": "identity"}
    partial = _transfer(tmp_path, b"x" * 10)
    assert "Range" not in dl._request_headers(partial)
    partial.resumable = True
    assert dl._request_headers(partial)["Range"] == "bytes=10-"
    assert "If-Range" not in dl._request_headers(partial)
    partial.validator = '"v1"'
    assert dl._request_headers(partial)["If-Range"] == '"v1"'


def test_content_range_must_continue_where_the_body_stopped(tmp_path: Path) -> None:
    ok = _transfer(tmp_path, b"x" * 10, total=100)
    dl._check_content_range(_response(206, **{"Content-Range": " bytes 10-99/100 "}), ok)
    assert ok.total == 100
    assert ok.sink.received == 10
    unknown_total = _transfer(tmp_path, b"x" * 10)
    dl._check_content_range(_response(206, **{"Content-Range": "bytes 10-99/*"}), unknown_total)
    assert unknown_total.total is None
    learnt = _transfer(tmp_path, b"x" * 10)
    dl._check_content_range(_response(206, **{"Content-Range": "bytes 10-99/100"}), learnt)
    assert learnt.total == 100
    for header in ("bytes 0-99/100", "bytes 10-99/200", "garbage", ""):
        wrong = _transfer(tmp_path, b"x" * 10, total=100)
        wrong.resumable = True
        with pytest.raises(dl._Transient) as transient:
            dl._check_content_range(_response(206, **{"Content-Range": header}), wrong)
        assert transient.value.reason == "the server resumed at the wrong offset"
        assert wrong.sink.received == 0
        assert not wrong.resumable
    no_header = _transfer(tmp_path, b"x" * 10, total=100)
    with pytest.raises(dl._Transient, match="the server resumed at the wrong offset"):
        dl._check_content_range(_response(206), no_header)
    one_byte = _transfer(tmp_path, b"x", total=100)  # an unreadable range never matches
    with pytest.raises(dl._Transient, match="the server resumed at the wrong offset"):
        dl._check_content_range(_response(206, **{"Content-Range": "bytes 1-x/100"}), one_byte)


def test_start_body_learns_total_resumability_and_validator(tmp_path: Path) -> None:
    t = _transfer(tmp_path, b"stale")
    dl._start_body(_response(200, **{"Content-Length": "100", "Accept-Ranges": " Bytes ",
                                     "ETag": '"e"'}), t)
    assert (t.sink.received, t.total, t.resumable, t.validator) == (0, 100, True, '"e"')
    t2 = _transfer(tmp_path)
    t2.validator = '"kept"'
    dl._start_body(_response(200, **{"Accept-Ranges": "none"}), t2)
    assert (t2.total, t2.resumable, t2.validator) == (None, False, '"kept"')


def test_status_4xx_is_final_and_names_the_redacted_url(tmp_path: Path) -> None:
    t = _transfer(tmp_path)
    t.url = "https://h/f?token=s3cret"
    response = _response(404)
    response.reason = "Not Found"
    with pytest.raises(SourceError) as info:
        dl._check_status(response, t)
    assert str(info.value) == ("https://h/f?token=*** answered 404 Not Found; check the URL and "
                               "the version in the manifest")
    response.status_code = 416
    with pytest.raises(SourceError):
        dl._check_status(response, t)  # nothing received: nothing to resume
    t.sink.write(b"abc")
    with pytest.raises(dl._Transient, match="refused to resume"):
        dl._check_status(response, t)
    assert t.sink.received == 0
    for status in (429, 500, 503, 599):
        response.status_code = status
        with pytest.raises(dl._Transient) as transient:
            dl._check_status(_with_retry_after(response), t)
        assert transient.value.retry_after == 3.0
        assert transient.value.reason == f"the server answered {status} Not Found"
    for status in (200, 206):
        response.status_code = status
        dl._check_status(response, t)
    response.status_code = 499
    with pytest.raises(SourceError):
        dl._check_status(response, t)


def _with_retry_after(response: requests.Response) -> requests.Response:
    response.headers["Retry-After"] = "3"
    return response


def test_retry_after_is_capped_by_the_policy(httpserver: HTTPServer, tmp_path: Path) -> None:
    httpserver.expect_ordered_request("/f").respond_with_data(
        "busy", status=503, headers={"Retry-After": "3600"})
    httpserver.expect_ordered_request("/f").respond_with_data(BODY)
    policy = dl.RetryPolicy(attempts=2, max_seconds=30, retry_after_max=0.2)
    started = time.monotonic()
    assert dl.download(httpserver.url_for("/f"), tmp_path / "f", sha256=SHA,
                       policy=policy) == SHA
    assert time.monotonic() - started < 5


def test_giving_up_names_the_attempts_and_the_last_reason(httpserver: HTTPServer,
                                                          tmp_path: Path) -> None:
    httpserver.expect_request("/f").respond_with_data("busy", status=503)
    policy = dl.RetryPolicy(attempts=3, max_seconds=30, backoff_initial=0.01,
                            backoff_max=0.02)
    url = httpserver.url_for("/f").replace("http://", "http://u:p@")
    with pytest.raises(SourceError) as info:
        dl.download(url, tmp_path / "f", sha256=None, policy=policy)
    assert str(info.value) == (
        f"could not download {textsafe.redact(url)} after 3 attempt(s): the server answered 503 "
        "SERVICE UNAVAILABLE; check the URL and your network, then run again")
    assert len(httpserver.log) == 3


@pytest.mark.usefixtures("httpserver")
def test_a_short_body_is_retried_from_where_it_stopped(tmp_path: Path) -> None:
    assert dl._user_agent().startswith("imageforge/")
    t = _transfer(tmp_path, total=10)
    t.sink.write(b"12345")

    class Raw:
        @staticmethod
        def stream(size: int, decode_content: bool) -> list[bytes]:
            assert size == dl.CHUNK_SIZE
            assert decode_content is False
            return [b"678"]

    response = _response(200)
    response.raw = Raw()
    seen: list[tuple[int, int | None]] = []
    t.on_progress = lambda n, total: seen.append((n, total))
    t.deadline = time.monotonic() + 60
    with pytest.raises(dl._Transient) as info:
        dl._stream_body(response, t)
    assert info.value.reason == "the connection closed after 8 of 10 bytes"
    assert seen == [(8, 10)]
    t.total = 8
    dl._stream_body(response, t)  # complete: no complaint


def test_the_user_agent_names_the_installed_version(monkeypatch: pytest.MonkeyPatch) -> None:
    assert dl._user_agent() == f"imageforge/{metadata.version('imageforge')}"

    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert dl._user_agent() == "imageforge/unknown"


def test_a_416_to_a_resumed_request_restarts_from_the_first_byte(tmp_path: Path) -> None:
    t = _transfer(tmp_path, b"x" * 10, total=100)
    t.resumable = True
    response = _response(416)
    response.reason = "Range Not Satisfiable"
    with pytest.raises(dl._Transient) as transient:
        dl._check_status(response, t)
    assert transient.value.reason == "the server refused to resume the download"
    assert transient.value.retry_after is None
    assert t.sink.received == 0


def test_a_206_makes_the_body_resumable_without_accept_ranges(tmp_path: Path) -> None:
    t = _transfer(tmp_path, b"x" * 10, total=100)
    dl._start_body(_response(206, **{"Content-Range": "bytes 10-99/100"}), t)
    assert (t.sink.received, t.total, t.resumable) == (10, 100, True)
    t.sink.write(b"y" * 5)
    assert dl._request_headers(t)["Range"] == "bytes=15-"

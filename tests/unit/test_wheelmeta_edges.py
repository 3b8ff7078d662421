"""wheelmeta's smaller decisions, each against a real server on 127.0.0.1 or real zips built
here: the marker environment of an image, which wheel `pick` takes, what an index page says
(PEP 503 HTML and PEP 691 JSON, as servers really write them), how each request is made (the
caller's session, timeouts, retries, identity encoding) and how a zip is read by ranges when its
end record, central directory or local headers are laid out unusually."""

from __future__ import annotations

import contextlib
import email.parser
import hashlib
import io
import json
import re
import ssl
import struct
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from imageforge.errors import ChecksumError, SourceError
from imageforge.sources import wheelmeta
from imageforge.sources.download import RetryPolicy
from imageforge.sources.wheelmeta import Wheel
from tests.unit.test_wheelmeta import Handler, Index, _to_zip64, build_wheel, serve

QUICK = RetryPolicy(attempts=2, max_seconds=10, backoff_initial=0.01, backoff_max=0.02)
NAME = "demo_pkg-1.0-py3-none-any.whl"
INFO = "demo_pkg-1.0.dist-info"
METADATA = b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\nSummary: edges\n"
# The Python a test process runs is not the image's: markers are judged for the image.
AMD64 = {"platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
         "platform_machine": "x86_64", "python_full_version": "3.11.0",
         "python_version": "3.11", "implementation_name": "cpython",
         "platform_python_implementation": "CPython", "extra": ""}


# ---- the marker environment, requirements and pins --------------------------------------


@pytest.mark.parametrize(("python", "platform", "machine", "full", "short"), [
    ("3.11", "linux/amd64", "x86_64", "3.11.0", "3.11"),
    ("3.12.4", "linux/arm64", "aarch64", "3.12.4", "3.12"),
    ("3.13", "linux/riscv64", "linux/riscv64", "3.13.0", "3.13"),  # unknown: kept as given
])
def test_the_marker_environment_is_the_images(python: str, platform: str, machine: str,
                                              full: str, short: str) -> None:
    assert wheelmeta.marker_environment(python, platform) == {
        **AMD64, "platform_machine": machine, "python_full_version": full,
        "python_version": short}


def _message(*requires: str) -> email.message.Message:
    text = "Name: demo\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    return email.parser.Parser().parsestr(text)


def test_pinned_looks_past_requirements_of_other_names() -> None:
    metadata = _message("filelock", "sympy>=1.13", "nvidia-nccl-cu13==2.30.7")
    assert wheelmeta.pinned(metadata, re.compile(r"nvidia-nccl-cu\d+"),
                            environment=AMD64) == ("nvidia-nccl-cu13", "2.30.7")


def test_an_invalid_requirement_names_the_release_and_what_to_do() -> None:
    with pytest.raises(SourceError) as error:
        wheelmeta.requires_dist(_message("filelock", "not a requirement!!"))
    message = str(error.value)
    assert message.startswith("demo 1.0 has an invalid Requires-Dist (")
    assert message.endswith("); pick another release.")


# ---- pick ------------------------------------------------------------------------------


def _wheel(filename: str) -> Wheel:
    return Wheel(filename=filename, url=f"https://x/{filename}", sha256=None, metadata=False)


def _pick(*filenames: str, python: str = "3.11", platform: str = "linux/amd64",
          version: str = "1.0") -> str:
    return wheelmeta.pick([_wheel(f) for f in filenames], project="demo", version=version,
                          python=python, platform=platform).filename


def test_pick_refuses_a_platform_without_wheels_naming_those_it_knows() -> None:
    with pytest.raises(SourceError) as error:
        _pick("demo-1.0-py3-none-any.whl", platform="linux/ppc64le")
    assert str(error.value) == ("platform 'linux/ppc64le' has no wheels here; use one of "
                                "linux/amd64, linux/arm64.")


def test_pick_refuses_what_is_not_a_version() -> None:
    with pytest.raises(SourceError) as error:
        _pick("demo-1.0-py3-none-any.whl", python="three")
    assert str(error.value) == ("demo 1.0 for Python three: not a version; give versions like "
                                "2.14.1 and 3.11.")


def test_pick_takes_a_python_with_its_patch_level() -> None:
    assert _pick("demo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", python="3.11.9") == \
        "demo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"


@pytest.mark.parametrize("glibc", [17, 27, 28])
def test_every_manylinux_from_2_17_to_2_28_installs(glibc: int) -> None:
    wheel = f"demo-1.0-cp311-cp311-manylinux_2_{glibc}_x86_64.whl"
    assert _pick(wheel) == wheel


def test_a_wheel_for_a_newer_glibc_than_2_28_is_not_taken() -> None:
    with pytest.raises(SourceError, match=r"has no wheel for Python 3\.11 on linux/amd64"):
        _pick("demo-1.0-cp311-cp311-manylinux_2_34_x86_64.whl")


def test_the_abi_is_exactly_the_pythons_own() -> None:
    # cp37m is the ABI of a pymalloc build; pick asks for plain cpXY, whatever this host is.
    with pytest.raises(SourceError, match=r"has no wheel for Python 3\.7"):
        _pick("demo-1.0-cp37-cp37m-manylinux_2_17_x86_64.whl", python="3.7")


@pytest.mark.parametrize(("python", "platform", "wheel"), [
    # NCCL's own wheels: any Python 3, one platform.
    ("3.11", "linux/arm64", "demo-1.0-py3-none-manylinux_2_18_aarch64.whl"),
    ("3.13", "linux/amd64", "demo-1.0-cp313-none-any.whl"),
    ("3.13", "linux/amd64", "demo-1.0-py313-none-any.whl"),
])
def test_pure_wheels_are_judged_for_the_images_python_and_platform(python: str, platform: str,
                                                                   wheel: str) -> None:
    assert _pick(wheel, python=python, platform=platform) == wheel


def test_pick_looks_past_files_that_are_not_wheels() -> None:
    assert _pick("demo-1.0.tar.gz", "demo-1.0-py3-none-any.whl") == "demo-1.0-py3-none-any.whl"


def test_a_wheel_with_tags_beyond_the_images_is_ranked_by_those_it_has() -> None:
    both = "demo-1.0-cp311-cp311-manylinux_2_28_x86_64.manylinux_2_34_x86_64.whl"
    assert _pick("demo-1.0-py3-none-any.whl", both) == both


def test_wheels_that_rank_alike_are_taken_in_the_indexs_order() -> None:
    first, second = ("demo-1.0-1-cp311-cp311-manylinux_2_28_x86_64.whl",
                     "demo-1.0-2-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert _pick(first, second) == first
    assert _pick(second, first) == second


@pytest.mark.parametrize(("count", "listed"), [
    (4, "(the index has 1.0-py3-none-manylinux_2_17_a, 1.0-py3-none-manylinux_2_17_b, "
        "1.0-py3-none-manylinux_2_17_c, 1.0-py3-none-manylinux_2_17_d for 1.0)"),
    (5, "(the index has 1.0-py3-none-manylinux_2_17_a, 1.0-py3-none-manylinux_2_17_b, "
        "1.0-py3-none-manylinux_2_17_c, 1.0-py3-none-manylinux_2_17_d and 1 more for 1.0)"),
])
def test_the_refusal_lists_four_releases_and_counts_the_rest(count: int, listed: str) -> None:
    wheels = [f"demo-1.0-py3-none-manylinux_2_17_{arch}.whl" for arch in "abcde"[:count]]
    with pytest.raises(SourceError) as error:
        _pick(*wheels)
    assert listed in str(error.value)


# ---- index pages, as servers write them ------------------------------------------------


@dataclass
class Scripted:
    """A server on 127.0.0.1 answering each path with what `answer` returns (status, headers,
    body), after `delay` seconds when the path is in `slow`; it keeps every request's path,
    headers and client port."""

    answer: Callable[[str, dict[str, str]], tuple[int, dict[str, str], bytes]]
    slow: dict[str, float] = field(default_factory=dict)
    seen: list[tuple[str, dict[str, str], int]] = field(default_factory=list)
    url: str = ""


class ScriptedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script: Scripted

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        headers = dict(self.headers.items())
        self.script.seen.append((self.path, headers, self.client_address[1]))
        if self.path in self.script.slow:  # a server that accepted, then says nothing
            time.sleep(self.script.slow[self.path])
            self.close_connection = True
            return
        status, extra, body = self.script.answer(self.path, headers)
        self.send_response(status)
        for key, value in extra.items():
            self.send_header(key, value)
        if "Content-Length" not in extra:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)


@contextlib.contextmanager
def scripted(script: Scripted) -> Iterator[Scripted]:
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 type("Bound", (ScriptedHandler,), {"script": script}))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                     daemon=True).start()
    script.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield script
    finally:
        server.shutdown()
        server.server_close()


def page(body: str | bytes, kind: str | None = "text/html"
         ) -> Callable[[str, dict[str, str]], tuple[int, dict[str, str], bytes]]:
    """Answers /simple/demo/ with `body` (as `kind`, or with no Content-Type at all)."""
    data = body.encode() if isinstance(body, str) else body

    def answer(path: str, _headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if path != "/simple/demo/":
            return 404, {}, b""
        return 200, {"Content-Type": kind} if kind else {}, data
    return answer


def listing(body: str | bytes, kind: str | None = "text/html") -> list[Wheel]:
    with scripted(Scripted(page(body, kind))) as server:
        return wheelmeta.list_wheels(f"{server.url}/simple", "demo", policy=QUICK)


def json_page(*files: dict[str, object]) -> str:
    return json.dumps({"meta": {"api-version": "1.1"}, "name": "demo", "files": list(files)})


def test_a_json_file_entry_without_hashes_or_metadata_is_a_wheel_without_them() -> None:
    (wheel,) = listing(json_page({"filename": NAME, "url": f"/files/{NAME}"}),
                       "application/vnd.pypi.simple.v1+json")
    assert (wheel.sha256, wheel.metadata) == (None, False)
    assert wheel.url.endswith(f"/files/{NAME}")


@pytest.mark.parametrize(("advertised", "metadata"), [
    ({"sha512": "ab" * 64}, True),  # advertised, but not by a sha256 this reader checks
    ({"sha256": "cd" * 32}, "cd" * 32),
    (None, False),
    (False, False),
])
def test_json_core_metadata_values(advertised: object, metadata: object) -> None:
    (wheel,) = listing(json_page({"filename": NAME, "url": f"/files/{NAME}",
                                  "core-metadata": advertised}),
                       "application/vnd.pypi.simple.v1+json")
    assert wheel.metadata == metadata
    assert type(wheel.metadata) is type(metadata)


def test_a_json_page_that_is_not_a_project_page_is_refused_naming_it() -> None:
    with scripted(Scripted(page('{"projects": []}', "application/vnd.pypi.simple.v1+json"))
                  ) as server, pytest.raises(SourceError) as error:
        wheelmeta.list_wheels(f"{server.url}/simple", "demo", policy=QUICK)
    assert str(error.value) == (f"cannot read {server.url}/simple/demo/ (its PEP 691 JSON is not "
                                "a project page); check the network or the index and retry.")


def test_a_page_without_a_content_type_is_read_as_html() -> None:
    (wheel,) = listing(f'<a href="/files/{NAME}#sha256={"e" * 64}">{NAME}</a>', None)
    assert (wheel.filename, wheel.sha256) == (NAME, "e" * 64)


def test_html_links_resolve_against_a_base_element() -> None:
    (wheel,) = listing(f'<base href="/mirror/files/"><a href="{NAME}">{NAME}</a>')
    assert re.fullmatch(rf"http://127\.0\.0\.1:\d+/mirror/files/{NAME}", wheel.url)


def test_only_anchors_are_files_on_an_html_page() -> None:
    body = (f'<link rel="alternate" href="/other/{NAME}"><base><a name="top"></a>'
            f'<a href="/files/{NAME}">{NAME}</a>')
    assert [w.url.rsplit(":", 1)[1].split("/", 1)[1] for w in listing(body)] == [
        f"files/{NAME}"]


@pytest.mark.parametrize(("fragment", "attribute", "sha256", "metadata"), [
    ("md5=0123", " data-core-metadata", None, True),  # a bare attribute: advertised
    ("sha256=ab=cd", ' data-core-metadata="md5=0123"', "ab=cd", True),
    # A malformed hash is kept, so the file fails its check rather than going unchecked.
    ("", ' data-dist-info-metadata="sha256=ab=cd"', None, "ab=cd"),
    ("", ' data-core-metadata="sha256="', None, True),
])
def test_html_hashes_and_metadata_attributes(fragment: str, attribute: str,
                                             sha256: str | None, metadata: object) -> None:
    (wheel,) = listing(f'<a href="/files/{NAME}#{fragment}"{attribute}>{NAME}</a>')
    assert (wheel.sha256, wheel.metadata) == (sha256, metadata)


def test_an_index_url_with_a_trailing_slash_reads_the_same_page() -> None:
    with scripted(Scripted(page(f'<a href="/files/{NAME}">{NAME}</a>'))) as server:
        (wheel,) = wheelmeta.list_wheels(f"{server.url}/simple/", "Demo", policy=QUICK)
        assert [path for path, _, _ in server.seen] == ["/simple/demo/"]
    assert wheel.filename == NAME


# ---- how requests are made -------------------------------------------------------------


def test_a_429_is_retried_like_a_5xx() -> None:
    answers = iter([(429, {}, b""), (200, {"Content-Type": "text/html"},
                                     f'<a href="/files/{NAME}">x</a>'.encode())])
    with scripted(Scripted(lambda _path, _headers: next(answers))) as server:
        (wheel,) = wheelmeta.list_wheels(f"{server.url}/simple", "demo", policy=QUICK)
    assert wheel.filename == NAME


def test_a_server_that_never_answers_times_out_and_is_retried() -> None:
    with scripted(Scripted(page(""), slow={"/simple/demo/": 3})) as server:
        started = time.monotonic()
        with pytest.raises(SourceError) as error:
            wheelmeta.list_wheels(f"{server.url}/simple", "demo", timeout=0.2, policy=QUICK)
        assert time.monotonic() - started < 2
    assert str(error.value) == (f"cannot read {server.url}/simple/demo/ (it timed out, after 2 "
                                "attempt(s)); check the network or the index and retry.")


def test_a_body_cut_short_is_a_broken_connection_and_retried() -> None:
    def short(_path: str, _headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        return 200, {"Content-Type": "text/html", "Content-Length": "100",
                     "Connection": "close"}, b"<html>"  # then hangs up

    with scripted(Scripted(short)) as server, pytest.raises(SourceError) as error:
        wheelmeta.list_wheels(f"{server.url}/simple", "demo", timeout=0.5, policy=QUICK)
    assert str(error.value) == (f"cannot read {server.url}/simple/demo/ (the connection broke, "
                                "after 2 attempt(s)); check the network or the index and retry.")


def test_a_url_requests_cannot_fetch_is_named_with_the_reason() -> None:
    with pytest.raises(SourceError) as error:
        wheelmeta.list_wheels("ftp://user:pw@127.0.0.1/simple", "demo", policy=QUICK)
    assert str(error.value) == ("cannot read ftp://***@127.0.0.1/simple/demo/ (InvalidSchema); "
                                "check the network or the index and retry.")


def test_an_untrusted_certificate_says_which_setting_to_check(
        certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    with serve(Index(files={}), context) as state, pytest.raises(SourceError) as error:
        wheelmeta.list_wheels(state.url, "demo-pkg", policy=QUICK)
    assert str(error.value) == (
        f"cannot read {state.url}/demo-pkg/ (its certificate is not trusted: is SSL_CERT_FILE "
        "the CA bundle to trust?); check the network or the index and retry.")


class Counting(Handler):
    """The index of tests/unit/test_wheelmeta.py, keeping each request's client port."""

    ports: list[int]

    def do_GET(self) -> None:
        self.ports.append(self.client_address[1])
        super().do_GET()


@contextlib.contextmanager
def counting(state: Index) -> Iterator[tuple[Index, list[int]]]:
    ports: list[int] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 type("Bound", (Counting,), {"index": state, "ports": ports}))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                     daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    try:
        yield state, ports
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    path = build_wheel(tmp_path_factory.mktemp("small"), "1.0", "py3-none-any",
                       requires=("filelock",))
    return {path.name: path.read_bytes()}


@pytest.mark.parametrize("advertise", ["sha256", "no"])
def test_the_callers_session_is_used_and_left_open(small: dict[str, bytes],
                                                   advertise: str) -> None:
    session = requests.Session()
    session.headers["X-Team"] = "ml-infra"
    with counting(Index(files=small, advertise=advertise)) as (index, ports):
        (wheel,) = wheelmeta.list_wheels(index.url, "demo-pkg", session=session, policy=QUICK)
        assert wheelmeta.read_metadata(wheel, session=session, policy=QUICK)["Version"] == "1.0"
        assert wheelmeta.read_metadata(wheel, session=session, policy=QUICK)["Version"] == "1.0"
    assert all(headers.get("X-Team") == "ml-infra" for _, headers in index.seen)
    # One connection throughout: the session was not closed under its owner.
    assert len(ports) >= 3
    assert len(set(ports)) == 1
    session.close()


def test_every_read_of_a_wheel_asks_for_the_bytes_as_stored(small: dict[str, bytes]) -> None:
    # Ranges and hashes are of the file as stored: never of a gzip of it.
    with serve(Index(files=small, serve_metadata=False)) as index:
        (wheel,) = wheelmeta.list_wheels(index.url, "demo-pkg", policy=QUICK)
        wheelmeta.read_metadata(wheel, policy=QUICK)  # .metadata 404, then ranges
        index.ranges = False
        wheelmeta.read_metadata(wheel, policy=QUICK)  # then the whole wheel
    wheel_requests = [h for path, h in index.seen if path.startswith("/files/")]
    assert len(wheel_requests) == 6  # .metadata, tail, METADATA; .metadata, tail, whole
    assert all(h["Accept-Encoding"].lower() == "identity" for h in wheel_requests)


@pytest.mark.parametrize("stage", ["metadata", "ranges", "whole"])
def test_each_way_of_reading_times_out(small: dict[str, bytes], stage: str) -> None:
    """A server that accepts and then says nothing is given `timeout` at each step: the
    .metadata file, the first range, the whole wheel (after a 200 without ranges)."""
    (name, data), = small.items()

    def answer(_path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if stage == "whole" and "Range" in headers:
            return 200, {}, b""  # no ranges here: the whole wheel is asked for next
        time.sleep(3)
        return 200, {}, data

    with scripted(Scripted(answer)) as server:
        late = Wheel(filename=name, url=f"{server.url}/files/{name}", sha256=None,
                     metadata=stage == "metadata")
        started = time.monotonic()
        with pytest.raises(SourceError, match=r"it timed out, after 2 attempt\(s\)"):
            wheelmeta.read_metadata(late, timeout=0.2, policy=QUICK)
        assert time.monotonic() - started < 2.5


def test_a_200_to_a_range_request_is_not_read(small: dict[str, bytes]) -> None:
    """A server without ranges answers the tail request with the whole wheel: its body is left
    unread (a 554 MB wheel would be read twice); here it never ends, and the wheel is read whole
    by the next request."""
    (name, data), = small.items()

    def answer(_path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if "Range" in headers:  # promises the wheel and more, sends a little
            return 200, {"Content-Length": str(len(data) * 100)}, data[:1000]
        return 200, {}, data

    with scripted(Scripted(answer)) as server:
        wheel = Wheel(filename=name, url=f"{server.url}/files/{name}", sha256=None,
                      metadata=False)
        # Reading that body would wait for the rest until the timeout, and fail.
        assert wheelmeta.read_metadata(wheel, timeout=1, policy=QUICK)["Version"] == "1.0"
        assert ["Range" in headers for _, headers, _ in server.seen] == [True, False]


@pytest.mark.parametrize("status", [403, 410])
def test_a_refused_metadata_file_or_wheel_is_an_error(small: dict[str, bytes],
                                                      status: int) -> None:
    (name, _), = small.items()

    def answer(_path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        return (200 if "Range" in headers else status), {}, b""

    with scripted(Scripted(answer)) as server:
        url = f"{server.url}/files/{name}"
        reason = {403: "Forbidden", 410: "Gone"}[status]
        with pytest.raises(SourceError) as error:
            wheelmeta.read_metadata(Wheel(filename=name, url=url, sha256=None, metadata=True),
                                    policy=QUICK)
        assert str(error.value) == (f"cannot read {url}.metadata (it answered {status} "
                                    f"{reason}); check the network or the index and retry.")
        with pytest.raises(SourceError) as error:
            wheelmeta.read_metadata(Wheel(filename=name, url=url, sha256=None, metadata=False),
                                    policy=QUICK)
        assert str(error.value) == (f"cannot read {url} (it answered {status} {reason}); check "
                                    "the network or the index and retry.")


def test_checksum_mismatches_say_what_to_check(small: dict[str, bytes]) -> None:
    with serve(Index(files=small, advertise="wrong")) as index:
        (wheel,) = wheelmeta.list_wheels(index.url, "demo-pkg", policy=QUICK)
        with pytest.raises(ChecksumError) as error:
            wheelmeta.read_metadata(wheel, policy=QUICK)
        actual = hashlib.sha256(_metadata_of(next(iter(small.values())))).hexdigest()
        assert str(error.value) == (f"checksum mismatch for {wheel.url}.metadata: the index says "
                                    f"sha256 {'f' * 64} but it has {actual}; check the index or "
                                    "its proxy and retry.")
        index.ranges, index.advertise, index.wrong_wheel_hash = False, "no", True
        (wheel,) = wheelmeta.list_wheels(index.url, "demo-pkg", policy=QUICK)
        with pytest.raises(ChecksumError) as error:
            wheelmeta.read_metadata(wheel, policy=QUICK)
        actual = hashlib.sha256(next(iter(small.values()))).hexdigest()
        assert str(error.value) == (f"checksum mismatch for {wheel.url}: the index says sha256 "
                                    f"{'0' * 64} but it has {actual}; check the index or its "
                                    "proxy and retry.")


def _metadata_of(wheel: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith("/METADATA")))


# ---- zips laid out unusually, read by ranges -------------------------------------------


def make_zip(members: list[tuple[zipfile.ZipInfo | str, bytes]], comment: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for info, data in members:
            archive.writestr(info, data)
        archive.comment = comment
    return buffer.getvalue()


def member(name: str, *, method: int = zipfile.ZIP_DEFLATED, extra: bytes = b"",
           comment: bytes = b"") -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type, info.extra, info.comment = method, extra, comment
    return info


def plain(**metadata_member: object) -> list[tuple[zipfile.ZipInfo | str, bytes]]:
    """A small wheel's members, METADATA made with `member(**metadata_member)`."""
    return [(member("demo_pkg/__init__.py"), b"VERSION = 1\n"),
            (member(f"{INFO}/METADATA", **metadata_member), METADATA),  # type: ignore[arg-type]
            (member(f"{INFO}/WHEEL"), b"Wheel-Version: 1.0\n")]


@dataclass
class Read:
    metadata: bytes | None
    error: str | None
    ranges: list[str | None]  # each request's Range, None for a whole read


def read(data: bytes, *, index: Index | None = None) -> Read:
    """METADATA of `data` served as a wheel by the index of tests/unit/test_wheelmeta.py
    (ranges honoured), and the requests it took."""
    state = index or Index(files={})
    state.files = {NAME: data}
    with serve(state):
        wheel = Wheel(filename=NAME, url=state.url.removesuffix("/simple") + f"/files/{NAME}",
                      sha256=None, metadata=False)
        try:
            found = wheelmeta.read_metadata(wheel, policy=QUICK)
            got, error = "".join(f"{k}: {v}\n" for k, v in found.items()).encode(), None
        except SourceError as exc:
            got, error = None, str(exc)
    return Read(metadata=got, error=error,
                ranges=[h.get("Range") for h in state.requests_for(NAME)])


def ranged_only(result: Read, count: int = 2) -> bool:
    return len(result.ranges) == count and all(result.ranges)


def test_a_zip_comment_and_member_comments_with_signatures_in_them() -> None:
    # The end record is the last signature; the central entries' comments are skipped whole.
    members = plain(comment=b"not the end: PK\x05\x06 nor an entry PK\x01\x02 " * 3)
    result = read(make_zip(members, comment=b"a zip comment"))
    assert result.metadata == METADATA
    assert ranged_only(result)


def test_an_empty_zip_is_not_a_wheel_and_is_not_downloaded_whole() -> None:
    result = read(make_zip([]))
    assert result.error == (f"{NAME} has no .dist-info/METADATA of its own, so it is not a "
                            "valid wheel; pick another release.")
    assert ranged_only(result, 1)


def test_a_zip_without_metadata_is_not_a_wheel_whether_read_by_ranges_or_whole() -> None:
    data = make_zip([(member("demo_pkg/__init__.py"), b"")])
    expected = (f"{NAME} has no .dist-info/METADATA of its own, so it is not a valid wheel; "
                "pick another release.")
    assert read(data).error == expected
    assert read(data, index=Index(files={}, ranges=False)).error == expected


def test_a_file_that_is_not_a_zip_is_refused_naming_it() -> None:
    result = read(b"<html>no wheel here</html>")
    assert result.error is not None
    assert re.fullmatch(rf"http://127\.0\.0\.1:\d+/files/{NAME} is not a zip file, so not a "
                        r"wheel; check the index and retry\.", result.error)


def _with_comment(data: bytes, length: int) -> bytes:
    """`data` with an end-record comment of `length` bytes."""
    assert data[-2:] == b"\x00\x00"
    return data[:-2] + struct.pack("<H", length) + b"c" * length


@pytest.mark.parametrize(("comment", "requests"), [
    (0, 2),  # tail, METADATA
    # The ZIP64 end record starts the tail: the directory before it is read on its own.
    (wheelmeta.TAIL - 98, 3),
    # The ZIP64 locator is the tail's first bytes, so its end record is read on its own too.
    (0xFFFF, 4),
])
def test_zip64_end_records_wherever_they_lie(comment: int, requests: int) -> None:
    data = _with_comment(_to_zip64(make_zip(plain())), comment)
    with zipfile.ZipFile(io.BytesIO(data)) as check:  # zipfile reads what was built
        assert check.read(f"{INFO}/METADATA") == METADATA
    result = read(data)
    assert result.metadata == METADATA
    assert ranged_only(result, requests)


def test_the_local_header_is_read_with_one_request_of_a_known_size() -> None:
    data = make_zip([*plain()[:1], (member(f"{INFO}/METADATA", method=zipfile.ZIP_STORED),
                                    METADATA * 40)])
    result = read(data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = archive.getinfo(f"{INFO}/METADATA")
    # Its fixed header, 1024 bytes of slack, four times its name and the packed bytes.
    end = info.header_offset + 30 + 1024 + 4 * len(info.filename) + info.compress_size
    assert result.ranges[1] == f"bytes={info.header_offset}-{end - 1}"
    assert result.metadata is not None


def test_a_local_header_longer_than_expected_takes_one_more_request() -> None:
    # An extra field of 2000 bytes (unknown tag 0xCAFE) and 6 KB of METADATA, stored: the
    # first read ends inside METADATA's bytes, the second reads the rest.
    extra = struct.pack("<HH", 0xCAFE, 2000) + bytes(2000)
    text = METADATA + b"".join(b"Requires-Dist: dep-%04d\n" % i for i in range(300))
    data = make_zip([(member(f"{INFO}/METADATA", method=zipfile.ZIP_STORED, extra=extra),
                      text)])
    result = read(data)
    assert result.metadata is not None
    assert result.metadata.count(b"Requires-Dist: dep-") == 300
    assert ranged_only(result, 3)


@pytest.mark.parametrize("method", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_a_local_extra_field_longer_than_the_first_read_is_skipped_not_read_as_data(
        method: int) -> None:
    # 8000 bytes of extra field before a small METADATA: the first read ends inside the
    # header, so the second starts past it (it started at the first read's end, and read the
    # extra field's tail as METADATA: a CRC error when stored, the whole wheel when deflated).
    extra = struct.pack("<HH", 0xCAFE, 8000) + bytes(8000)
    data = make_zip([(member(f"{INFO}/METADATA", method=method, extra=extra), METADATA)])
    result = read(data)
    assert result.error is None
    assert result.metadata == METADATA
    assert ranged_only(result, 3)


def _zip64_fields(data: bytes, fields: tuple[str, ...], before: bytes = b"") -> bytes:
    """`data` with each central entry's `fields` (of size, packed, offset) in a ZIP64 extra
    field after `before`, as a writer sets only those that overflow."""
    at = data.rfind(b"PK\x05\x06")
    count, _, offset = struct.unpack_from("<HIIH", data, at + 10)[:3]
    directory, pos = b"", offset
    for _ in range(count):
        head = list(struct.unpack_from("<4sHHHHHHIIIHHHHHII", data, pos))
        name_len, extra_len, comment_len = head[10:13]
        name = data[pos + 46:pos + 46 + name_len]
        rest = data[pos + 46 + name_len + extra_len:pos + 46 + name_len + extra_len
                    + comment_len]
        values = []
        for key, index in (("size", 9), ("packed", 8), ("offset", 16)):
            if key in fields:
                values.append(head[index])
                head[index] = 0xFFFFFFFF
        big = struct.pack(f"<HH{len(values)}Q", 1, 8 * len(values), *values)
        head[11] = len(before) + len(big)
        directory += struct.pack("<4sHHHHHHIIIHHHHHII", *head) + name + before + big + rest
        pos += 46 + name_len + extra_len + comment_len
    end = bytearray(data[at:])
    struct.pack_into("<I", end, 12, len(directory))
    return data[:offset] + directory + bytes(end)


@pytest.mark.parametrize("fields", [("offset",), ("size", "packed"), ("packed",),
                                    ("size", "packed", "offset")])
def test_a_zip64_field_holds_only_what_overflows(fields: tuple[str, ...]) -> None:
    data = _zip64_fields(make_zip(plain()), fields)
    with zipfile.ZipFile(io.BytesIO(data)) as check:
        assert check.read(f"{INFO}/METADATA") == METADATA
    result = read(data)
    assert result.metadata == METADATA
    assert ranged_only(result)


@pytest.mark.parametrize("before", [
    struct.pack("<HH", 0xCAFE, 8) + b"\x01" * 8 + struct.pack("<HH", 0xBEEF, 8) + b"\x02" * 8,
    struct.pack("<HH", 0xCAFE, 0x8100) + bytes(0x8100),  # a length past 32 KiB
])
def test_a_zip64_field_after_other_extra_fields_is_found(before: bytes) -> None:
    data = _zip64_fields(make_zip(plain()), ("size", "packed", "offset"), before=before)
    result = read(data)
    assert result.metadata == METADATA
    assert all(result.ranges)


@pytest.mark.parametrize("length", [0, 8])
def test_a_zip64_record_too_short_for_its_fields_falls_back_to_the_whole_wheel(
        length: int) -> None:
    # Three fields overflow, the record holds fewer values: this let StopIteration out of
    # read_metadata. The ranges give up; the whole wheel is then read (and refused by zipfile,
    # which cannot read that record either), one sentence naming the file.
    data = _zip64_fields(make_zip(plain()), ("size", "packed", "offset"))
    at = data.find(struct.pack("<HH", 1, 24))
    assert at > 0
    short = data[:at] + struct.pack("<HH", 1, length) + data[at + 4:]
    result = read(short)
    assert len(result.ranges) == 2, result.ranges
    assert result.ranges[0], result.ranges
    assert result.ranges[1] is None, result.ranges
    assert result.error is not None
    assert result.error.endswith("check the index and retry."), result.error


def test_an_empty_zip64_record_at_the_end_of_the_extra_is_still_read() -> None:
    # A zero-length ZIP64 record as the extra field's last four bytes, for an offset that says
    # it overflowed: the record is read (and found short), so no range is asked at the
    # bogus offset 0xFFFFFFFF before the whole wheel is.
    data = _zip64_fields(make_zip(plain()), ())
    name = f"{INFO}/METADATA".encode()
    entry = data.rfind(b"PK\x01\x02", 0, data.rfind(name))
    data = data[:entry + 42] + struct.pack("<I", 0xFFFFFFFF) + data[entry + 46:]
    result = read(data)
    assert len(result.ranges) == 2, result.ranges
    assert result.ranges[0], result.ranges
    assert result.ranges[1] is None, result.ranges
    assert result.error is not None


def test_a_name_flagged_utf8_that_is_not_is_refused_naming_the_wheel() -> None:
    # The range reader and zipfile both decode flagged names as UTF-8: the ranges give up,
    # and the whole wheel's UnicodeDecodeError became a traceback.
    data = make_zip([(member("demo_pkg/Xbad.txt"), b"x"), *plain()])
    data = data.replace(b"demo_pkg/Xbad.txt", b"demo_pkg/\xffbad.txt")
    for entry in (m.start() for m in re.finditer(b"PK\x01\x02|PK\x03\x04", data)):
        at = entry + (8 if data[entry + 2] == 1 else 6)
        flags = struct.unpack_from("<H", data, at)[0]
        data = data[:at] + struct.pack("<H", flags | 0x800) + data[at + 2:]
    result = read(data)
    assert result.error is not None
    assert re.fullmatch(rf"http://127\.0\.0\.1:\d+/files/{NAME} has a member name that is "
                        r"not the UTF-8 its zip flags it as, so it is not a valid wheel; "
                        r"check the index and retry\.", result.error), result.error


def test_a_last_member_without_a_name_ends_the_directory_like_any_other() -> None:
    # Its central entry is the 46 bytes of its header alone.
    result = read(make_zip([*plain(), (member(""), b"")]))
    assert result.metadata == METADATA
    assert ranged_only(result)


def test_member_names_in_utf8_or_cp437_are_both_read() -> None:
    # zipfile flags a non-ASCII name as UTF-8; an old writer's cp437 name (here 0x82, "é",
    # which is not UTF-8) carries no flag, and bit 0 (encryption) is no name flag either.
    data = make_zip([(member("demo_pkg/données.txt"), b"x"),
                     (member("demo_pkg/Xcp437.txt"), b"y"), *plain()])
    data = data.replace(b"demo_pkg/Xcp437.txt", b"demo_pkg/\x82cp437.txt")
    entry = data.rfind(b"PK\x01\x02", 0, data.find(b"demo_pkg/\x82cp437.txt", data.find(
        b"PK\x01\x02")))
    flags = struct.unpack_from("<H", data, entry + 8)[0]
    data = data[:entry + 8] + struct.pack("<H", flags | 1) + data[entry + 10:]
    result = read(data)
    assert result.metadata == METADATA
    assert ranged_only(result)


def test_a_central_directory_that_does_not_start_with_an_entry_is_not_guessed_at() -> None:
    """Four bytes of junk where the directory should begin: the ranges give up and the whole
    wheel is read, which zipfile refuses as well."""
    for members in (plain(), [*plain(), *[(member(f"demo_pkg/mod_{i:04}.py"), b"x")
                                          for i in range(1500)]]):
        data = make_zip(members)
        at = data.rfind(b"PK\x05\x06")
        size, offset = struct.unpack_from("<II", data, at + 12)
        end = data[at:at + 12] + struct.pack("<II", size + 4, offset) + data[at + 20:]
        broken = data[:offset] + b"junk" + data[offset:at] + end
        result = read(broken)
        assert result.error is not None
        assert result.error.endswith("is not a zip file, so not a wheel; check the index and "
                                     "retry.")
        assert result.ranges[-1] is None


def _aligned(members: list[tuple[zipfile.ZipInfo | str, bytes]], name: str | None) -> bytes:
    """A zip whose tail (its last TAIL bytes) starts exactly at the central entry of `name`, or
    at the central directory when `name` is None (by the length of its end comment)."""
    data = make_zip(members)
    at = data.rfind(b"PK\x05\x06")
    start = struct.unpack_from("<I", data, at + 16)[0]
    if name is not None:
        start = data.find(b"PK\x01\x02" + data[start + 4:start + 4], start)
        while data[start + 46:start + 46 + len(name)] != name.encode():
            start = data.find(b"PK\x01\x02", start + 1)
    return _with_comment(data, start + wheelmeta.TAIL - len(data))


def test_a_signature_too_near_the_tails_end_starts_no_entry() -> None:
    """The tail begins inside the last central entry's comment, whose last bytes hold an
    entry's signature with no room for an entry after it: nothing in the tail is an entry,
    so the whole directory is read by one more range."""
    comment = b"c" * 200 + b"PK\x01\x02" + b"z" * 10
    data = make_zip([*plain(), (member("demo_pkg/last.txt", comment=comment), b"")])
    entry = data.rfind(b"PK\x01\x02", 0, data.rfind(b"demo_pkg/last.txt"))
    start = entry + 46 + len("demo_pkg/last.txt") + 50  # 50 bytes into the comment
    result = read(_with_comment(data, start + wheelmeta.TAIL - len(data)))
    assert result.metadata == METADATA
    assert ranged_only(result, 3)


def test_a_broken_directory_that_starts_the_tail_is_not_guessed_at() -> None:
    data = make_zip(plain())
    at = data.rfind(b"PK\x05\x06")
    size, offset = struct.unpack_from("<II", data, at + 12)
    end = data[at:at + 12] + struct.pack("<II", size + 4, offset) + data[at + 20:]
    broken = data[:offset] + b"junk" + data[offset:at] + end
    result = read(_with_comment(broken, offset + wheelmeta.TAIL - len(broken)))
    assert result.error is not None
    assert result.error.endswith("is not a zip file, so not a wheel; check the index and retry.")
    assert result.ranges[-1] is None


def test_a_tail_that_starts_at_metadatas_entry_needs_no_more_of_the_directory() -> None:
    members = [(member(f"demo_pkg/mod_{i:04}.py"), b"x") for i in range(1500)]
    result = read(_aligned([*members, *plain()], f"{INFO}/METADATA"))
    assert result.metadata == METADATA
    assert ranged_only(result)


def test_a_directory_that_starts_the_tail_is_read_whole_from_it() -> None:
    result = read(_aligned(plain(), None))
    assert result.metadata == METADATA
    assert ranged_only(result)
    # Without METADATA there is nothing more to read: the tail held the whole directory.
    result = read(_aligned([(member("demo_pkg/__init__.py"), b"")], None))
    assert result.error is not None
    assert result.error.endswith("has no .dist-info/METADATA of its own, so it is not a valid "
                                 "wheel; pick another release.")
    assert ranged_only(result, 1)


def test_a_metadata_entry_with_a_wrong_crc_is_an_error_to_retry() -> None:
    data = make_zip(plain())
    entry = data.find(f"{INFO}/METADATA".encode(), data.find(b"PK\x01\x02")) - 46
    crc = struct.unpack_from("<I", data, entry + 16)[0]
    result = read(data[:entry + 16] + struct.pack("<I", crc ^ 1) + data[entry + 20:])
    assert result.error is not None
    assert re.fullmatch(rf"METADATA read by ranges from http://127\.0\.0\.1:\d+/files/{NAME} "
                        r"fails its CRC; the file changed while it was read, so retry\.",
                        result.error)


def test_metadata_compressed_another_way_is_left_to_zipfile() -> None:
    result = read(make_zip(plain(method=zipfile.ZIP_BZIP2)))
    assert result.metadata == METADATA
    assert result.ranges[-1] is None  # bzip2: read whole, by zipfile


def test_a_206_without_content_range_is_no_range(small: dict[str, bytes]) -> None:
    (name, data), = small.items()

    def answer(_path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        return (206 if "Range" in headers else 200), {}, data

    with scripted(Scripted(answer)) as server:
        wheel = Wheel(filename=name, url=f"{server.url}/files/{name}", sha256=None,
                      metadata=False)
        assert wheelmeta.read_metadata(wheel, policy=QUICK)["Version"] == "1.0"
        assert ["Range" in headers for _, headers, _ in server.seen] == [True, False]


def test_the_body_of_a_refused_wheel_is_not_read(small: dict[str, bytes]) -> None:
    # A 403 that promises a body and never sends it: the refusal is reported, not waited on.
    (name, _), = small.items()

    def answer(_path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if "Range" in headers:
            return 200, {}, b""
        return 403, {"Content-Length": "10000000"}, b"denied"

    with scripted(Scripted(answer)) as server:
        url = f"{server.url}/files/{name}"
        with pytest.raises(SourceError) as error:
            wheelmeta.read_metadata(Wheel(filename=name, url=url, sha256=None, metadata=False),
                                    timeout=0.3, policy=QUICK)
    assert str(error.value) == (f"cannot read {url} (it answered 403 Forbidden); check the "
                                "network or the index and retry.")


def test_an_index_path_is_kept_as_given_but_for_trailing_slashes() -> None:
    def answer(path: str, _headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if path != "/simpleX/demo/":
            return 404, {}, b""
        return 200, {"Content-Type": "text/html"}, f'<a href="/f/{NAME}">x</a>'.encode()

    with scripted(Scripted(answer)) as server:
        (wheel,) = wheelmeta.list_wheels(f"{server.url}/simpleX//", "demo", policy=QUICK)
    assert wheel.filename == NAME


def test_a_range_answered_from_another_offset_is_not_trusted() -> None:
    """METADATA is the wheel's first member (its local header at offset 0); this server answers
    a range from 0 with the next member's bytes instead, and says so in Content-Range."""
    data = make_zip([plain()[1], plain()[0], plain()[2]])
    second = data.find(b"PK\x03\x04", 1)

    def answer(_path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        span = re.fullmatch(r"bytes=(\d*)-(\d*)", headers.get("Range", ""))
        if span is None:
            return 200, {}, data
        first, last = span.groups()
        start = max(len(data) - int(last), 0) if not first else int(first)
        end = len(data) - 1 if not first else min(int(last), len(data) - 1)
        if first == "0":
            start, end = second, min(end + second, len(data) - 1)
        return 206, {"Content-Range": f"bytes {start}-{end}/{len(data)}"}, data[start:end + 1]

    with scripted(Scripted(answer)) as server:
        wheel = Wheel(filename=NAME, url=f"{server.url}/files/{NAME}", sha256=None,
                      metadata=False)
        assert wheelmeta.read_metadata(wheel, policy=QUICK)["Summary"] == "edges"
        assert [headers.get("Range", "")[:8] for _, headers, _ in server.seen] == [
            "bytes=-6", "bytes=0-", ""]

"""wheelmeta against a real index on 127.0.0.1: PEP 503 HTML and PEP 691 JSON pages, PEP 658
`.metadata` files, byte ranges (or a server without them) into real wheels built here, and
what the server served, counted, to show that a big wheel is not downloaded to read its pins."""

from __future__ import annotations

import base64
import contextlib
import email.parser
import hashlib
import io
import json
import os
import re
import socket
import ssl
import struct
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
import requests

from imageforge.errors import ChecksumError, SourceError
from imageforge.sources import wheelmeta
from imageforge.sources.download import RetryPolicy
from imageforge.sources.wheelmeta import Wheel

FAST = RetryPolicy(attempts=3, max_seconds=10, backoff_initial=0.01, backoff_max=0.02)
NCCL = re.compile(r"nvidia-nccl-cu\d+")
PAYLOAD = os.urandom(2_000_000)  # incompressible: a deflated wheel stays 2 MB
AMD64 = wheelmeta.marker_environment("3.11", "linux/amd64")
PINS = ['nvidia-nccl-cu12==2.21.5; sys_platform == "win32"',  # never on Linux: skipped
        'nvidia-nccl-cu13==2.30.7; platform_system == "Linux"', "filelock",
        'triton==3.5.0; platform_machine == "x86_64"']


def build_wheel(folder: Path, version: str, tag: str, *, requires: tuple[str, ...] = tuple(PINS),
                payload: bytes = b"", modules: int = 0, dist_info_first: bool = False,
                method: int = zipfile.ZIP_DEFLATED, zip64: bool = False,
                project: str = "demo_pkg") -> Path:
    """A wheel laid out as the wheel spec says: the package, then `<project>-<v>.dist-info/`
    with METADATA, WHEEL and RECORD (last, unless `dist_info_first`)."""
    info = f"{project}-{version}.dist-info"
    dist_name = project.replace("_", "-")
    metadata = "".join([f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n",
                        f"Summary: {tag}\n", *(f"Requires-Dist: {r}\n" for r in requires)])
    package = {f"{project}/__init__.py": b"VERSION = 1\n", f"{project}/data.bin": payload,
               **{f"{project}/mod_{i:04}.py": b"x = %d\n" % i for i in range(modules)}}
    dist = {f"{info}/METADATA": metadata.encode(),
            f"{info}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()}
    members = {**dist, **package} if dist_info_first else {**package, **dist}
    record = "".join(f"{name},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}\n"
                     for name, data in members.items()) + f"{info}/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in [*members.items(), (f"{info}/RECORD", record.encode())]:
            meta = name.endswith("/METADATA")
            with archive.open(zipfile.ZipInfo(name) if not meta else _info(name, method), "w",
                              force_zip64=zip64 and meta) as member:
                member.write(data)
    data = _to_zip64(buffer.getvalue()) if zip64 else buffer.getvalue()
    with zipfile.ZipFile(io.BytesIO(data)) as check:  # zipfile reads what was built
        assert check.read(f"{info}/METADATA") == metadata.encode()
    path = folder / f"{project}-{version}-{tag}.whl"
    path.write_bytes(data)
    return path


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _info(name: str, method: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.compress_type = method
    return info


def _to_zip64(data: bytes) -> bytes:
    """The same zip with a ZIP64 end record and locator, and every central entry's sizes and
    offset in a ZIP64 extra field, as a wheel over 4 GiB has them."""
    at = data.rfind(b"PK\x05\x06")
    _, _, _, _, count, _, offset, _ = struct.unpack_from("<4sHHHHIIH", data, at)
    directory, pos = b"", offset
    for _ in range(count):
        head = list(struct.unpack_from("<4sHHHHHHIIIHHHHHII", data, pos))
        name_len, extra_len, comment_len = head[10:13]
        rest = data[pos + 46:pos + 46 + name_len + extra_len + comment_len]
        big = struct.pack("<HHQQQ", 1, 24, head[9], head[8], head[16])
        head[8] = head[9] = head[16] = 0xFFFFFFFF
        head[11] = extra_len + len(big)
        directory += (struct.pack("<4sHHHHHHIIIHHHHHII", *head) + rest[:name_len + extra_len]
                      + big + rest[name_len + extra_len:])
        pos += 46 + name_len + extra_len + comment_len
    record = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count,
                         len(directory), offset)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, offset + len(directory), 1)
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF,
                      0xFFFFFFFF, 0)
    return data[:offset] + directory + record + locator + end


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("wheels")
    built = [
        build_wheel(folder, "2.14.1", "cp311-cp311-manylinux_2_28_x86_64", payload=PAYLOAD),
        build_wheel(folder, "2.14.1+cu130", "cp311-cp311-manylinux_2_28_x86_64"),
        build_wheel(folder, "2.14.1", "cp312-cp312-manylinux_2_28_x86_64"),
        build_wheel(folder, "2.14.1", "cp311-cp311-manylinux_2_28_aarch64",
                    requires=("nvidia-nccl-cu13>=2.30",)),
        build_wheel(folder, "2.14.1", "cp311-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64",
                    modules=1500, method=zipfile.ZIP_STORED),
        build_wheel(folder, "2.14.1", "py3-none-any", requires=("filelock",), modules=1500,
                    dist_info_first=True),
        build_wheel(folder, "2.13.0", "cp311-cp311-manylinux_2_28_x86_64", zip64=True),
    ]
    (folder / "demo_pkg-2.14.1.tar.gz").write_bytes(b"not a wheel")
    return {path.name: path for path in [*built, folder / "demo_pkg-2.14.1.tar.gz"]}


@dataclass
class Index:
    """What the index on 127.0.0.1 serves, and what it saw; tests change it as they go."""

    files: dict[str, bytes]
    project: str = "demo-pkg"
    # Other projects with a page (listing the same files: clients pick by project name).
    also: tuple[str, ...] = ()
    url: str = ""
    speaks_json: bool = True  # answer PEP 691 JSON to a client that asks for it
    ranges: bool = True  # honour Range (else 200 and the whole file)
    advertise: str = "sha256"  # the .metadata file: "sha256", "true", "wrong" hash or "no"
    legacy: bool = False  # advertise it as data-dist-info-metadata / dist-info-metadata
    serve_metadata: bool = True  # False: <wheel>.metadata answers 404
    wrong_wheel_hash: bool = False
    failures: dict[str, int] = field(default_factory=dict)  # path: 500s before answering
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    served: Counter[str] = field(default_factory=Counter)  # body bytes sent, per path
    lock: threading.Lock = field(default_factory=threading.Lock)

    def requests_for(self, name: str) -> list[dict[str, str]]:
        return [headers for path, headers in self.seen if path == f"/files/{name}"]

    def advertised(self, wheel: bytes) -> str | bool:
        """What the page says of a wheel's .metadata file: its sha256, True or False."""
        if self.advertise in ("no", "true"):
            return self.advertise == "true"
        return "f" * 64 if self.advertise == "wrong" else \
            hashlib.sha256(_metadata_of(wheel)).hexdigest()

    def page(self, as_json: bool) -> tuple[bytes, str]:
        """The project's page: PEP 691 JSON with absolute paths, or PEP 503 HTML with hrefs
        relative to the page."""
        key = "dist-info-metadata" if self.legacy else "core-metadata"
        rows = [(name, "0" * 64 if self.wrong_wheel_hash else hashlib.sha256(data).hexdigest(),
                 self.advertised(data) if name.endswith(".whl") else False)
                for name, data in self.files.items()]
        if as_json:
            files = [{"filename": name, "url": f"/files/{quote(name)}", "hashes": {"sha256": sha},
                      key: {"sha256": core} if isinstance(core, str) else core}
                     for name, sha, core in rows]
            page = {"meta": {"api-version": "1.1"}, "name": self.project, "files": files}
            return json.dumps(page).encode(), "application/vnd.pypi.simple.v1+json"
        links = "".join(f'<a href="../../files/{quote(name)}#sha256={sha}"{_data(key, core)}>'
                        f"{name}</a><br/>\n" for name, sha, core in rows)
        return f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode(), "text/html"


def _data(key: str, core: str | bool) -> str:
    """The PEP 658/714 attribute of one link."""
    if core is False:
        return ""
    return f' data-{key}="true"' if core is True else f' data-{key}="sha256={core}"'


def _metadata_of(wheel: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith("/METADATA")))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    index: Index

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        index, path = self.index, unquote(self.path.split("?", 1)[0])
        with index.lock:
            index.seen.append((path, dict(self.headers.items())))
            failing = index.failures.get(path, 0) > 0
            if failing:
                index.failures[path] -= 1
        body, kind = self._find(path)
        if failing or body is None:
            self._answer(500 if failing else 404, b"", "text/plain", path)
            return
        span = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if kind != "application/octet-stream" or not index.ranges or span is None:
            self._answer(200, body, kind, path)
            return
        first, last = span.groups()
        start = len(body) - int(last) if not first else int(first)
        end = len(body) - 1 if not first or not last else min(int(last), len(body) - 1)
        self._answer(206, body[max(start, 0):end + 1], kind, path,
                     f"bytes {max(start, 0)}-{end}/{len(body)}")

    def _find(self, path: str) -> tuple[bytes | None, str]:
        index = self.index
        if path in {f"/simple/{project}/" for project in (index.project, *index.also)}:
            accept = self.headers.get("Accept", "")
            return index.page(index.speaks_json and "vnd.pypi.simple.v1+json" in accept)
        name = path.removeprefix("/files/")
        if name.endswith(".metadata") and name.removesuffix(".metadata") in index.files:
            wheel = index.files[name.removesuffix(".metadata")]
            return (_metadata_of(wheel) if index.serve_metadata else None), "text/plain"
        return index.files.get(name), "application/octet-stream"

    def _answer(self, status: int, body: bytes, kind: str, path: str,
                content_range: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        if content_range:
            self.send_header("Content-Range", content_range)
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client wanted no body
            self.close_connection = True
            return
        with self.index.lock:
            self.index.served[path] += len(body)


@contextlib.contextmanager
def serve(state: Index, tls: ssl.SSLContext | None = None) -> Iterator[Index]:
    handler = type("Bound", (Handler,), {"index": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                              daemon=True)
    thread.start()
    scheme = "https" if tls else "http"
    state.url = f"{scheme}://127.0.0.1:{server.server_address[1]}/simple"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def index(wheels: dict[str, Path]) -> Iterator[Index]:
    with serve(Index(files={name: path.read_bytes() for name, path in wheels.items()})) as state:
        yield state


def listed(index: Index) -> dict[str, Wheel]:
    return {w.filename: w for w in wheelmeta.list_wheels(index.url, "Demo.Pkg", policy=FAST)}


BIG = "demo_pkg-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"
ABI3 = "demo_pkg-2.14.1-cp311-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
ANY = "demo_pkg-2.14.1-py3-none-any.whl"
LOCAL = "demo_pkg-2.14.1+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
ZIP64 = "demo_pkg-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"


@pytest.mark.parametrize("as_json", [True, False], ids=["pep691-json", "pep503-html"])
def test_list_wheels_reads_both_page_formats_alike(index: Index, as_json: bool) -> None:
    index.speaks_json = as_json
    found = listed(index)
    assert sorted(found) == sorted(name for name in index.files if name.endswith(".whl"))
    wheel = found[LOCAL]  # "+" arrives quoted (%2B) in the href
    base = index.url.removesuffix("/simple")
    assert wheel.url == f"{base}/files/{quote(LOCAL)}"
    assert wheel.sha256 == hashlib.sha256(index.files[LOCAL]).hexdigest()
    assert wheel.metadata == hashlib.sha256(_metadata_of(index.files[LOCAL])).hexdigest()
    page = [headers for path, headers in index.seen if path == "/simple/demo-pkg/"]
    assert page[0]["Accept"].startswith("application/vnd.pypi.simple.v1+json")
    assert page[0]["User-Agent"].startswith("imageforge/")


@pytest.mark.parametrize("as_json", [True, False], ids=["pep691-json", "pep503-html"])
@pytest.mark.parametrize(("advertise", "legacy", "expected"),
                         [("no", False, False), ("true", False, True), ("true", True, True),
                          ("sha256", True, "hash")])
def test_metadata_advertisements(index: Index, as_json: bool, advertise: str, legacy: bool,
                                 expected: object) -> None:
    index.speaks_json, index.advertise, index.legacy = as_json, advertise, legacy
    metadata = listed(index)[ANY].metadata
    if expected == "hash":
        expected = hashlib.sha256(_metadata_of(index.files[ANY])).hexdigest()
    assert metadata == expected


@pytest.mark.parametrize(("python", "platform", "local", "expected"), [
    ("3.11", "linux/amd64", None, BIG),  # cp311-cp311 over +cu130, abi3 and py3-none-any
    ("3.11", "linux/amd64", "cu130", LOCAL),
    ("3.12", "linux/amd64", None, "demo_pkg-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl"),
    ("3.13", "linux/amd64", None, ABI3),  # abi3 over py3-none-any
    ("3.11", "linux/arm64", None, "demo_pkg-2.14.1-cp311-cp311-manylinux_2_28_aarch64.whl"),
    ("3.13", "linux/arm64", None, ANY),
])
def test_pick_takes_the_most_specific_wheel(index: Index, python: str, platform: str,
                                            local: str | None, expected: str) -> None:
    found = list(listed(index).values())
    wheel = wheelmeta.pick(found, project="Demo.Pkg", version="2.14.1", python=python,
                           platform=platform, local=local)
    assert wheel.filename == expected


def _wheel(filename: str) -> Wheel:
    return Wheel(filename=filename, url=f"https://x/{filename}", sha256=None, metadata=False)


def test_pick_falls_back_to_a_local_variant_when_no_plain_one_exists() -> None:
    found = [_wheel("torch-2.14.1+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"),
             _wheel("torch-2.14.1+cu130-cp311-cp311-manylinux_2_34_x86_64.whl"),  # glibc 2.34
             _wheel("torch-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl")]
    wheel = wheelmeta.pick(found, project="torch", version="2.14.1", python="3.11",
                           platform="linux/amd64")
    assert wheel is found[0]


def test_pick_without_a_match_names_release_python_and_what_exists(index: Index) -> None:
    found = list(listed(index).values())
    with pytest.raises(SourceError) as error:
        wheelmeta.pick(found, project="demo-pkg", version="2.14.1", python="3.10",
                       platform="linux/arm64", local="cu129")
    message = str(error.value)
    assert message.startswith("demo-pkg 2.14.1+cu129 has no wheel for Python 3.10 on linux/arm64")
    # The aarch64 one first, at most four, and what to do.
    assert "(the index has 2.14.1-cp311-cp311-manylinux_2_28_aarch64, " in message
    assert "and 2 more for 2.14.1); pick another release or variant." in message
    with pytest.raises(SourceError, match=r"has no wheel .* \(the index has no wheels for 9\.9\)"):
        wheelmeta.pick(found, project="demo-pkg", version="9.9", python="3.11",
                       platform="linux/amd64")


@pytest.mark.parametrize("advertise", ["sha256", "true"])
def test_pep658_metadata_file_is_read_and_the_wheel_never_touched(index: Index,
                                                                   advertise: str) -> None:
    index.advertise = advertise
    metadata = wheelmeta.read_metadata(listed(index)[BIG], policy=FAST)
    assert metadata["Summary"] == "cp311-cp311-manylinux_2_28_x86_64"
    assert wheelmeta.pinned(metadata, NCCL, environment=AMD64) == ("nvidia-nccl-cu13", "2.30.7")
    assert index.requests_for(BIG) == []
    assert len(index.requests_for(BIG + ".metadata")) == 1


def test_a_metadata_file_with_another_hash_is_refused(index: Index) -> None:
    index.advertise = "wrong"
    wheel = listed(index)[BIG]
    expected = f"checksum mismatch for {wheel.url}.metadata: the index says sha256 {'f' * 64}"
    with pytest.raises(ChecksumError, match=re.escape(expected)):
        wheelmeta.read_metadata(wheel, policy=FAST)


@pytest.mark.parametrize("advertise", ["no", "true"])
def test_byte_ranges_read_metadata_without_the_whole_wheel(index: Index, advertise: str) -> None:
    index.advertise, index.serve_metadata = advertise, False  # "true": advertised, yet a 404
    metadata = wheelmeta.read_metadata(listed(index)[BIG], policy=FAST)
    assert wheelmeta.pinned(metadata, NCCL, environment=AMD64) == ("nvidia-nccl-cu13", "2.30.7")
    assert len(index.files[BIG]) > 2_000_000
    assert index.served[f"/files/{BIG}"] < 200_000
    # The end of the zip, then METADATA alone: its entry was in the tail of the directory.
    ranges = [headers["Range"] for headers in index.requests_for(BIG)]
    assert ranges[0] == f"bytes=-{wheelmeta.TAIL}"
    assert len(ranges) == 2


def test_a_central_directory_beyond_the_tail_is_read_from_its_tail(index: Index) -> None:
    index.advertise = "no"
    metadata = wheelmeta.read_metadata(listed(index)[ABI3], policy=FAST)  # METADATA stored
    assert metadata["Summary"] == "cp311-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64"
    assert len(index.requests_for(ABI3)) == 2


def test_metadata_early_in_a_long_directory_needs_the_whole_directory(index: Index) -> None:
    index.advertise = "no"
    metadata = wheelmeta.read_metadata(listed(index)[ANY], policy=FAST)
    assert wheelmeta.pinned(metadata, NCCL, environment=AMD64) is None
    assert len(index.requests_for(ANY)) == 3  # tail, the whole directory, METADATA
    assert index.served[f"/files/{ANY}"] < len(index.files[ANY])


def test_zip64_wheel_is_read_by_ranges(index: Index) -> None:
    index.advertise = "no"
    metadata = wheelmeta.read_metadata(listed(index)[ZIP64], policy=FAST)
    assert metadata["Version"] == "2.13.0"
    assert all("Range" in headers for headers in index.requests_for(ZIP64))


def test_a_server_without_ranges_gets_the_whole_wheel_verified(index: Index) -> None:
    index.advertise, index.ranges = "no", False
    metadata = wheelmeta.read_metadata(listed(index)[BIG], policy=FAST)
    assert wheelmeta.pinned(metadata, NCCL, environment=AMD64) == ("nvidia-nccl-cu13", "2.30.7")
    assert index.served[f"/files/{BIG}"] >= len(index.files[BIG])
    assert [("Range" in h) for h in index.requests_for(BIG)] == [True, False]


def test_a_whole_wheel_with_another_hash_is_refused(index: Index) -> None:
    index.advertise, index.ranges, index.wrong_wheel_hash = "no", False, True
    wheel = listed(index)[ANY]
    with pytest.raises(ChecksumError, match=re.escape(f"checksum mismatch for {wheel.url}: ")):
        wheelmeta.read_metadata(wheel, policy=FAST)


def test_transient_failures_are_retried(index: Index) -> None:
    index.advertise = "no"
    index.failures = {"/simple/demo-pkg/": 2, f"/files/{BIG}": 2}
    metadata = wheelmeta.read_metadata(listed(index)[BIG], policy=FAST)
    assert metadata["Name"] == "demo-pkg"
    assert len([path for path, _ in index.seen if path == "/simple/demo-pkg/"]) == 3
    assert len(index.requests_for(BIG)) == 4  # the tail three times, then METADATA


def test_retries_are_bounded(index: Index) -> None:
    index.failures = {"/simple/demo-pkg/": 10}
    with pytest.raises(SourceError) as error:
        listed(index)
    assert str(error.value) == (
        f"cannot read {index.url}/demo-pkg/ (it answered 500 Internal Server Error, after 3 "
        "attempt(s)); check the network or the index and retry.")


def test_an_unknown_project_is_an_error_with_the_url_redacted(index: Index) -> None:
    url = index.url.replace("http://", "http://user:hunter2@")
    with pytest.raises(SourceError) as error:
        wheelmeta.list_wheels(url, "no-such-project", policy=FAST)
    message = str(error.value)
    assert "hunter2" not in message
    assert message.startswith("cannot read http://***@127.0.0.1:")
    assert "/simple/no-such-project/ (it answered 404 Not Found for no-such-project)" in message


def test_an_index_that_does_not_answer_is_an_error() -> None:
    with socket.socket() as probe:  # a port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(SourceError, match=re.escape(
            f"cannot read http://127.0.0.1:{port}/simple/torch/ (could not connect, after 3 "
            "attempt(s)); check the network or the index and retry.")):
        wheelmeta.list_wheels(f"http://127.0.0.1:{port}/simple", "torch", policy=FAST)
    assert time.monotonic() - started < 5



def test_the_ca_bundle_of_ssl_cert_file_is_trusted(certificate: tuple[Path, Path],
                                                   wheels: dict[str, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # requests lets these override a session's own `verify`.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    files = {ANY: wheels[ANY].read_bytes()}
    with serve(Index(files=files), context) as state:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # the system bundle: not trusted
        with pytest.raises(SourceError, match="its certificate is not trusted"):
            wheelmeta.list_wheels(state.url, "demo-pkg", policy=FAST)
        assert state.seen == []  # refused in the handshake, never retried into a request
        monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
        (wheel,) = wheelmeta.list_wheels(state.url, "demo-pkg", policy=FAST)
        assert wheelmeta.read_metadata(wheel, policy=FAST)["Summary"] == "py3-none-any"


def _message(*requires: str) -> email.message.Message:
    text = "Name: demo\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    return email.parser.Parser().parsestr(text)


def test_pinned_skips_requirements_whose_marker_does_not_hold() -> None:
    metadata = _message(*PINS)
    assert [str(r.name) for r in wheelmeta.requires_dist(metadata)] == [
        "nvidia-nccl-cu12", "nvidia-nccl-cu13", "filelock", "triton"]
    assert wheelmeta.pinned(metadata, NCCL, environment=AMD64) == ("nvidia-nccl-cu13", "2.30.7")
    windows = {**AMD64, "sys_platform": "win32"}
    assert wheelmeta.pinned(metadata, NCCL, environment=windows) == ("nvidia-nccl-cu12", "2.21.5")
    arm = wheelmeta.marker_environment("3.11", "linux/arm64")
    assert wheelmeta.pinned(metadata, re.compile("triton"), environment=arm) is None


def test_pinned_is_none_without_such_a_requirement() -> None:
    assert wheelmeta.pinned(_message("filelock", "sympy>=1.13"), NCCL, environment=AMD64) is None


@pytest.mark.parametrize("requirement", ["nvidia-nccl-cu13>=2.30", "nvidia-nccl-cu13==2.30.*",
                                         "nvidia-nccl-cu13<3,>=2.30", "nvidia-nccl-cu13"])
def test_pinned_refuses_a_requirement_that_is_not_one_exact_version(requirement: str) -> None:
    with pytest.raises(SourceError, match=re.escape(
            f"demo 1.0 does not pin nvidia-nccl-cu13 exactly (it requires {requirement})")):
        wheelmeta.pinned(_message(requirement), NCCL, environment=AMD64)


def test_an_invalid_requirement_is_a_source_error() -> None:
    with pytest.raises(SourceError, match="has an invalid Requires-Dist"):
        wheelmeta.requires_dist(_message("not a requirement!!"))


def test_pytorch_2_14_1_on_pypi_pins_nccl_without_downloading_the_wheel() -> None:
    """The real torch wheel (554 MB) on PyPI: its pins are read with well under 1 MB."""
    seen: list[tuple[str, int, int]] = []

    def record(response: requests.Response, *_args: object, **_kwargs: object) -> None:
        length = int(response.headers.get("Content-Length", 0))
        seen.append((response.url, response.status_code, length))

    session = requests.Session()
    session.hooks["response"].append(record)
    found = wheelmeta.list_wheels("https://pypi.org/simple", "torch", session=session)
    wheel = wheelmeta.pick(found, project="torch", version="2.14.1", python="3.11",
                           platform="linux/amd64")
    assert wheel.filename == "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    metadata = wheelmeta.read_metadata(wheel, session=session)
    assert wheelmeta.pinned(metadata, NCCL, environment=AMD64) == ("nvidia-nccl-cu13", "2.30.7")
    answers = [(status, length) for url, status, length in seen if url == wheel.url]
    assert answers
    assert all(status == 206 for status, _ in answers)  # never the whole wheel
    assert sum(length for _, length in answers) < 1_000_000

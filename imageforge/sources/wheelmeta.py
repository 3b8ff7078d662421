"""The core metadata (METADATA: Requires-Dist, ...) of one exact wheel on a package index.

A lock needs what a wheel pins (PyTorch's NCCL, say) before anything is built, and the wheels
that carry those pins are huge (torch is 554 MB), so the file is never downloaded whole where
the index or its file server can avoid it: first the PEP 658 `.metadata` file, then HTTP
ranges into the zip (its end record, the central directory's tail, then METADATA alone), and
only then the whole wheel, verified by the index's sha256.
"""

from __future__ import annotations

import email.message
import hashlib
import re
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import compat32
from html.parser import HTMLParser
from typing import TYPE_CHECKING, BinaryIO, NoReturn
from urllib.parse import unquote, urljoin, urlsplit

from packaging import tags
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from imageforge.errors import ChecksumError, SourceError
from imageforge.sources import cabundle
from imageforge.sources.download import DEFAULT_POLICY, USER_AGENT, RetryPolicy
from imageforge.textsafe import redact

if TYPE_CHECKING:
    import requests

ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, " \
         "text/html;q=0.1"
ARCHES = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
# The newest glibc a wheel may need: the image's pip target (piplock.PLATFORMS, manylinux_2_28).
MANYLINUX_MAX = 28
# The end record with the longest comment a zip may carry, plus a ZIP64 locator before it.
TAIL = 22 + 0xFFFF + 20
EOCD, LOC64, EOCD64 = struct.Struct("<4sHHHHIIH"), struct.Struct("<4sIQI"), \
    struct.Struct("<4sQHHIIQQQQ")
CENTRAL, LOCAL = struct.Struct("<4sHHHHHHIIIHHHHHII"), struct.Struct("<4sHHHHHIIIHH")
CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
# Seconds to wait for the index to connect or send more (requests' connect and read timeouts).
TIMEOUT = 60


@dataclass(frozen=True, kw_only=True)
class Wheel:
    """One wheel file as its index lists it."""

    filename: str
    url: str  # absolute, without the #sha256= fragment
    sha256: str | None
    # PEP 658/714: False when not advertised, True when advertised without a sha256, else it.
    metadata: str | bool


@dataclass(frozen=True, kw_only=True)
class _Entry:
    """A central directory entry: where one member's bytes lie, and how they are packed."""

    name: str
    method: int  # 0 stored, 8 deflated
    crc: int
    packed: int  # bytes as stored
    offset: int  # of its local header


class _Transient(Exception):
    """A failure worth another attempt (no connection, 5xx, 429); the message is safe."""


class _NoRanges(Exception):
    """The server cannot serve this wheel by byte ranges: read it whole instead."""


def _session(session: requests.Session | None) -> requests.Session:
    import requests

    if session is not None:
        return session
    own = requests.Session()
    bundle = cabundle.resolve(None)
    if bundle:  # behind a TLS-intercepting proxy the index needs it, as builds do
        own.verify = str(bundle)
    return own


def _get(http: requests.Session, url: str, *, timeout: float, policy: RetryPolicy,
         headers: Mapping[str, str], body: Callable[[int], bool] = lambda _: True,
         sink: BinaryIO | None = None) -> requests.Response:
    """GET with retries of transient failures; the body is read (into `sink` when given) only
    when `body(status)` says so, so that a 200 to a range request costs no transfer."""
    import requests

    def attempt() -> requests.Response:
        try:
            with http.get(url, headers={"User-Agent": USER_AGENT, **headers}, stream=True,
                          timeout=timeout) as response:
                if response.status_code == 429 or response.status_code >= 500:
                    raise _Transient(f"it answered {response.status_code} {response.reason}")
                if sink is not None and body(response.status_code):
                    sink.seek(0)
                    sink.truncate()
                    for chunk in response.iter_content(1 << 16):
                        sink.write(chunk)
                elif body(response.status_code):
                    _ = response.content
                return response
        except requests.exceptions.SSLError:
            raise _fail(url, "its certificate is not trusted: is SSL_CERT_FILE the CA bundle "
                             "to trust?") from None
        except requests.Timeout as exc:
            raise _Transient("it timed out") from exc
        except requests.ConnectionError as exc:
            raise _Transient("could not connect") from exc
        except requests.exceptions.ChunkedEncodingError as exc:
            raise _Transient("the connection broke") from exc
        except requests.RequestException as exc:
            raise _fail(url, type(exc).__name__) from None

    retrying = policy.retrying(_Transient)
    try:
        return retrying(attempt)
    except _Transient as exc:
        raise _fail(url, f"{exc}, after {retrying.statistics['attempt_number']} attempt(s)") \
            from None


def _fail(url: str, why: str) -> SourceError:
    return SourceError(f"cannot read {redact(url)} ({why}); check the network or the index and "
                       "retry.")


def list_wheels(index_url: str, project: str, *, session: requests.Session | None = None,
                timeout: float = TIMEOUT, policy: RetryPolicy = DEFAULT_POLICY) -> list[Wheel]:
    """The wheels of `project` on a PEP 503/691 simple index (PyPI, download.pytorch.org)."""
    url = f"{index_url.rstrip('/')}/{canonicalize_name(project)}/"
    http = _session(session)
    try:
        response = _get(http, url, timeout=timeout, policy=policy, headers={"Accept": ACCEPT})
    finally:
        if session is None:
            http.close()
    if response.status_code != 200:
        raise _fail(url, f"it answered {response.status_code} {response.reason} for {project}")
    if "json" in response.headers.get("Content-Type", ""):
        try:
            files = response.json()["files"]
            return [_wheel(urljoin(response.url, f["url"]), f["filename"],
                           f.get("hashes", {}).get("sha256"),
                           f.get("core-metadata", f.get("dist-info-metadata", False)))
                    for f in files if f["filename"].endswith(".whl")]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise _fail(url, "its PEP 691 JSON is not a project page") from None
    links = _Links(response.url)
    links.feed(response.text)
    return [wheel for wheel in links.wheels if wheel.filename.endswith(".whl")]


def _wheel(url: str, filename: str, sha256: str | None, metadata: object) -> Wheel:
    if isinstance(metadata, Mapping):
        metadata = metadata.get("sha256", True)
    elif isinstance(metadata, str):  # an HTML attribute: "true" or "sha256=<hex>"
        kind, _, value = metadata.partition("=")
        metadata = value if kind == "sha256" and value else True
    return Wheel(filename=filename, url=url.partition("#")[0], sha256=sha256,
                 metadata=metadata if isinstance(metadata, str) else bool(metadata))


class _Links(HTMLParser):
    """The <a href> of a PEP 503 page, with their hashes and PEP 658/714 attributes."""

    def __init__(self, base: str) -> None:
        super().__init__()
        self.base = base
        self.wheels: list[Wheel] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        href = found.get("href")
        if tag == "base" and href:
            self.base = urljoin(self.base, href)
        elif tag == "a" and href:
            url = urljoin(self.base, href)
            kind, _, digest = urlsplit(url).fragment.partition("=")
            key = next((key for key in ("data-core-metadata", "data-dist-info-metadata")
                        if key in found), None)
            self.wheels.append(_wheel(url, unquote(urlsplit(url).path.rpartition("/")[2]),
                                      digest if kind == "sha256" else None,
                                      False if key is None else found[key] or True))


def pick(wheels: Sequence[Wheel], *, project: str, version: str, python: str, platform: str,
         local: str | None = None) -> Wheel:
    """The wheel of exactly `version` (`+local` when given) that installs on `python` (3.11)
    and `platform` (linux/amd64): the most specific tag, then one without a local label."""
    if platform not in ARCHES:
        raise SourceError(f"platform {platform!r} has no wheels here; use one of "
                          f"{', '.join(ARCHES)}.")
    arch = ARCHES[platform]
    try:
        major, minor = (int(part) for part in python.split(".")[:2])
        wanted = Version(f"{version}+{local}" if local else version)
    except ValueError:
        raise SourceError(f"{project} {version} for Python {python}: not a version; give "
                          "versions like 2.14.1 and 3.11.") from None
    platforms = [f"manylinux_2_{glibc}_{arch}" for glibc in range(MANYLINUX_MAX, 16, -1)]
    platforms += [f"manylinux2014_{arch}", f"linux_{arch}"]
    priority = [*tags.cpython_tags((major, minor), [f"cp{major}{minor}"], platforms),
                *tags.compatible_tags((major, minor), f"cp{major}{minor}", platforms)]
    rank = {tag: index for index, tag in enumerate(priority)}
    release: list[str] = []
    candidates: list[tuple[tuple[bool, int], Wheel]] = []
    for wheel in wheels:
        try:
            name, found, _, wheel_tags = parse_wheel_filename(wheel.filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if name != canonicalize_name(project) or Version(found.public) != Version(wanted.public):
            continue
        release.append(wheel.filename.removesuffix(".whl").split("-", 1)[1])
        if (found == wanted or not local) and wheel_tags & rank.keys():
            key = (found.local is not None, min(rank[tag] for tag in wheel_tags & rank.keys()))
            candidates.append((key, wheel))
    if candidates:
        return min(candidates, key=lambda item: item[0])[1]
    # Those for the platform asked for first: the likeliest to be wanted instead.
    have = sorted(set(release), key=lambda label: (arch not in label, label))
    listed = ", ".join(have[:4]) + (f" and {len(have) - 4} more" if len(have) > 4 else "")
    raise SourceError(f"{project} {wanted} has no wheel for Python {python} on {platform} "
                      f"(the index has {listed or 'no wheels'} for {version}); pick another "
                      "release or variant.")


def read_metadata(wheel: Wheel, *, session: requests.Session | None = None,
                  timeout: float = TIMEOUT, policy: RetryPolicy = DEFAULT_POLICY
                  ) -> email.message.Message:
    """METADATA of `wheel`: its PEP 658 file, else byte ranges, else the whole wheel."""
    http = _session(session)
    try:
        data = _advertised(http, wheel, timeout, policy)
        if data is None:
            try:
                data = _ranged(http, wheel, timeout, policy)
            except (_NoRanges, struct.error, zlib.error, UnicodeDecodeError):
                data = _whole(http, wheel, timeout, policy)  # checked against the index's hash
    finally:
        if session is None:
            http.close()
    return BytesParser(policy=compat32).parsebytes(data)


def _advertised(http: requests.Session, wheel: Wheel, timeout: float,
                policy: RetryPolicy) -> bytes | None:
    if wheel.metadata is False:
        return None
    url = wheel.url + ".metadata"
    response = _get(http, url, timeout=timeout, policy=policy,
                    headers={"Accept-Encoding": "identity"})
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise _fail(url, f"it answered {response.status_code} {response.reason}")
    actual = hashlib.sha256(response.content).hexdigest()
    if isinstance(wheel.metadata, str) and actual != wheel.metadata.lower():
        raise ChecksumError(f"checksum mismatch for {redact(url)}: the index says sha256 "
                            f"{wheel.metadata} but it has {actual}; check the index or its "
                            "proxy and retry.")
    return response.content


def _ranged(http: requests.Session, wheel: Wheel, timeout: float, policy: RetryPolicy) -> bytes:
    """METADATA out of the zip by byte ranges: its end record and the central directory's tail
    (all of the directory only when METADATA is not listed there), then METADATA alone."""
    def read(start: int, end: int | None) -> tuple[bytes, int]:
        """Bytes [start, end) and the file's size; with no end, the last `start` bytes."""
        spec = f"{start}-{end - 1}" if end is not None else f"-{start}"
        response = _get(http, wheel.url, timeout=timeout, policy=policy, body=lambda s: s == 206,
                        headers={"Range": f"bytes={spec}", "Accept-Encoding": "identity"})
        served = CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", ""))
        if response.status_code != 206 or not served or (end is not None
                                                          and int(served[1]) != start):
            raise _NoRanges  # no ranges here (a 200 carries the whole wheel: left unread)
        return response.content, int(served[3])

    tail, size = read(TAIL, None)
    tail_start, at = size - len(tail), tail.rfind(b"PK\x05\x06")
    if at < 0:
        raise _NoRanges
    cd_size, cd_start = EOCD.unpack_from(tail, at)[5:7]
    if at >= LOC64.size and tail[at - LOC64.size:at - 16] == b"PK\x06\x07":  # ZIP64's record
        where = LOC64.unpack_from(tail, at - LOC64.size)[2]
        record = tail[where - tail_start:] if where >= tail_start else \
            read(where, where + EOCD64.size)[0]
        cd_size, cd_start = EOCD64.unpack_from(record)[8:]
    directory = tail[max(cd_start - tail_start, 0):max(cd_start + cd_size - tail_start, 0)]
    entries = _entries(directory, whole=cd_start >= tail_start)
    if _find(entries, wheel) is None and cd_start < tail_start:
        entries = _entries(read(cd_start, cd_start + cd_size)[0], whole=True)
    entry = entries[_find(entries, wheel) or _not_a_wheel(wheel)]
    # The local header's name and extra field are about as long as the central ones.
    local = read(entry.offset, entry.offset + LOCAL.size + 1024 + 4 * len(entry.name)
                 + entry.packed)[0]
    name_len, extra_len = LOCAL.unpack_from(local)[9:]
    begin = LOCAL.size + name_len + extra_len
    packed = local[begin:begin + entry.packed]
    if len(packed) < entry.packed:  # the rest, from past the header when it too was cut short
        packed += read(entry.offset + max(len(local), begin),
                       entry.offset + begin + entry.packed)[0]
    if local[:4] != b"PK\x03\x04" or entry.method not in (0, 8):
        raise _NoRanges  # bzip2, lzma: left to zipfile
    data = zlib.decompress(packed, -15) if entry.method == 8 else packed
    if zlib.crc32(data) != entry.crc:
        raise SourceError(f"METADATA read by ranges from {redact(wheel.url)} fails its CRC; the "
                          "file changed while it was read, so retry.")
    return data


def _entries(directory: bytes, *, whole: bool) -> dict[str, _Entry]:
    """The entries of a central directory, or of its tail: there the first signature that
    starts an unbroken chain of entries up to the end is taken as the first whole entry."""
    for start in [0] if whole else [m.start() for m in re.finditer(b"PK\x01\x02", directory)]:
        entries: dict[str, _Entry] = {}
        at = start
        while at + CENTRAL.size <= len(directory) and directory[at:at + 4] == b"PK\x01\x02":
            fields = CENTRAL.unpack_from(directory, at)
            flags, method, crc, packed, size, offset = fields[3:5] + fields[7:10] + fields[16:]
            name_end = at + CENTRAL.size + fields[10]
            extra, pos = directory[name_end:name_end + fields[11]], 0
            while pos + 4 <= len(extra):
                tag, length = struct.unpack_from("<HH", extra, pos)
                if tag == 1:  # ZIP64: the 64-bit values of the fields that are 0xFFFFFFFF
                    values = iter(struct.unpack_from(f"<{length // 8}Q", extra, pos + 4))
                    try:
                        size = next(values) if size == 0xFFFFFFFF else size
                        packed = next(values) if packed == 0xFFFFFFFF else packed
                        offset = next(values) if offset == 0xFFFFFFFF else offset
                    except StopIteration:  # a record too short for the fields it stands for
                        raise _NoRanges from None
                pos += 4 + length
            name = directory[at + CENTRAL.size:name_end].decode(
                "utf-8" if flags & 0x800 else "cp437")
            entries[name] = _Entry(name=name, method=method, crc=crc, packed=packed,
                                   offset=offset)
            at = name_end + fields[11] + fields[12]
        if at == len(directory):
            return entries
        if whole:
            raise _NoRanges  # a central directory this reader does not understand
    return {}


def _find(names: Iterable[str], wheel: Wheel) -> str | None:
    """`<name>-<version>.dist-info/METADATA` of the wheel's own distribution (wheel spec)."""
    project = parse_wheel_filename(wheel.filename)[0]
    for name in names:
        found = re.fullmatch(r"([^/]+)-[^/-]+\.dist-info/METADATA", name)
        if found and canonicalize_name(found[1]) == project:
            return name
    return None


def _not_a_wheel(wheel: Wheel) -> NoReturn:
    raise SourceError(f"{wheel.filename} has no .dist-info/METADATA of its own, so it is not a "
                      "valid wheel; pick another release.")


def _whole(http: requests.Session, wheel: Wheel, timeout: float, policy: RetryPolicy) -> bytes:
    """The last resort: the whole wheel into a temporary file, checked, then read by zipfile."""
    with tempfile.TemporaryFile() as file:
        response = _get(http, wheel.url, timeout=timeout, policy=policy, sink=file,
                        body=lambda status: status == 200, headers={"Accept-Encoding": "identity"})
        if response.status_code != 200:
            raise _fail(wheel.url, f"it answered {response.status_code} {response.reason}")
        file.seek(0)
        actual = hashlib.file_digest(file, "sha256").hexdigest()
        if wheel.sha256 and actual != wheel.sha256.lower():
            raise ChecksumError(f"checksum mismatch for {redact(wheel.url)}: the index says "
                                f"sha256 {wheel.sha256} but it has {actual}; check the index or "
                                "its proxy and retry.")
        try:
            with zipfile.ZipFile(file) as archive:
                return archive.read(_find(archive.namelist(), wheel) or _not_a_wheel(wheel))
        except zipfile.BadZipFile:
            raise SourceError(f"{redact(wheel.url)} is not a zip file, so not a wheel; check "
                              "the index and retry.") from None
        except UnicodeDecodeError:
            raise SourceError(f"{redact(wheel.url)} has a member name that is not the UTF-8 its "
                              "zip flags it as, so it is not a valid wheel; check the index and "
                              "retry.") from None


def requires_dist(metadata: email.message.Message) -> list[Requirement]:
    """Every Requires-Dist of `metadata`, parsed."""
    try:
        return [Requirement(value) for value in metadata.get_all("Requires-Dist") or []]
    except InvalidRequirement as exc:
        raise SourceError(f"{metadata.get('Name')} {metadata.get('Version')} has an invalid "
                          f"Requires-Dist ({exc}); pick another release.") from None


def marker_environment(python: str, platform: str) -> dict[str, str]:
    """The marker environment of an image (Linux, its machine, its Python 3.11 or 3.11.9), not
    of the host that locks it."""
    full = python if python.count(".") >= 2 else f"{python}.0"
    return {"platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
            "platform_machine": ARCHES.get(platform, platform), "python_full_version": full,
            "python_version": ".".join(python.split(".")[:2]), "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "extra": ""}


def pinned(metadata: email.message.Message, pattern: re.Pattern[str], *,
           environment: Mapping[str, str]) -> tuple[str, str] | None:
    """(canonical name, version) of the first requirement named like `pattern` whose marker
    holds in `environment`; it must pin exactly one version with ==, as a lock needs it."""
    for requirement in requires_dist(metadata):
        name = canonicalize_name(requirement.name)
        if not pattern.fullmatch(name):
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        specs = list(requirement.specifier)
        if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
            return name, specs[0].version
        raise SourceError(f"{metadata.get('Name')} {metadata.get('Version')} does not pin {name} "
                          f"exactly (it requires {requirement}); pin it in the manifest instead.")
    return None

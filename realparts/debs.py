"""Debian packages pinned by a lock: resolve the closure, fetch and verify, index as a repository.

The lock names every .deb by package, version, pool path, size and the sha256 of Debian's
signed index, so a generator run is reproducible for as long as the mirror serves those
versions. A Debian point release drops superseded versions from the mirror; the download
then fails with one sentence saying to re-lock.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import requests
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

DEFAULT_MIRROR = "http://deb.debian.org/debian"
RESOLVER = Path(__file__).with_name("resolve_closure.py")


class DebError(Exception):
    """A lock or a download that cannot be used; the message says what to do."""


@dataclass(frozen=True)
class Deb:
    package: str
    version: str
    architecture: str
    path: str  # pool path under the mirror
    size: int
    sha256: str

    @property
    def filename(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def read_lock(path: Path) -> list[Deb]:
    return [Deb(**entry) for entry in json.loads(path.read_text())["debs"]]


def write_lock(path: Path, packages: Sequence[str], debs: Sequence[Deb], image: str) -> None:
    lock = {"packages": list(packages),
            "resolved_on": f"{image} (Debian 12), baseline: required + important + build-essential",
            "debs": [asdict(deb) for deb in debs]}
    path.write_text(json.dumps(lock, indent=1) + "\n")


def resolve(packages: Sequence[str], image: str) -> list[Deb]:
    """The closure of ``packages`` on Debian 12 with build-essential, resolved by apt in
    ``image`` against Debian's current index (needs Docker and Debian's mirror)."""
    result = subprocess.run(
        ["docker", "run", "--rm", "-v", f"{RESOLVER}:/resolve_closure.py:ro", image,
         "python3", "/resolve_closure.py", *packages],
        capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DebError(f"resolving {' '.join(packages)} in {image} failed: "
                       f"{result.stderr.strip()[-400:]}")
    return [Deb(**entry) for entry in json.loads(result.stdout)]


@retry(retry=retry_if_exception_type((requests.ConnectionError, requests.Timeout)),
       stop=stop_after_attempt(4), wait=wait_exponential(multiplier=1, max=8), reraise=True)
def _download(url: str) -> bytes:
    response = requests.get(url, timeout=60)
    if response.status_code == 404:
        raise DebError(f"{url} is gone from the mirror (a Debian point release replaced it); "
                       "re-lock with `python -m realparts lock-efa-debs`")
    response.raise_for_status()
    return response.content


def fetch(deb: Deb, mirror: str, cache: Path) -> bytes:
    """The .deb's bytes, verified against the lock; kept in ``cache`` by sha256."""
    kept = cache / deb.sha256 / deb.filename
    if kept.is_file():
        data = kept.read_bytes()
        if hashlib.sha256(data).hexdigest() == deb.sha256:
            return data
    data = _download(f"{mirror.rstrip('/')}/{deb.path}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != deb.sha256 or len(data) != deb.size:
        raise DebError(f"{deb.filename} from {mirror} has sha256 {digest}, the lock says "
                       f"{deb.sha256}: use a mirror that serves Debian's bytes")
    kept.parent.mkdir(parents=True, exist_ok=True)
    partial = kept.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(kept)
    return data


def _control(data: bytes) -> str:
    """The control file of a .deb (an ar archive holding control.tar.{xz,gz,zst})."""
    if not data.startswith(b"!<arch>\n"):
        raise DebError("not a Debian package (no ar header)")
    offset = 8
    while offset + 60 <= len(data):
        header = data[offset:offset + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = data[offset + 60:offset + 60 + size]
        if name.startswith("control.tar"):
            raw = lzma.decompress(body) if name.endswith(".xz") else body
            # tarfile opens .gz itself; Debian 12's dpkg writes control.tar.xz.
            with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
                for member in tar.getmembers():
                    if member.name in ("./control", "control"):
                        extracted = tar.extractfile(member)
                        if extracted is not None:
                            return extracted.read().decode()
        offset += 60 + size + (size & 1)  # ar members are 2-byte aligned
    raise DebError("no control file in the package")


def packages_index(debs: Sequence[tuple[Deb, bytes]]) -> bytes:
    """A flat repository's Packages file (what dpkg-scanpackages writes, without needing
    dpkg-dev): each package's control stanza plus Filename, Size and SHA256."""
    stanzas = []
    for deb, data in debs:
        control = _control(data).rstrip("\n")
        stanzas.append(f"{control}\nFilename: ./{deb.filename}\nSize: {deb.size}\n"
                       f"SHA256: {deb.sha256}\n")
    return "\n".join(stanzas).encode()

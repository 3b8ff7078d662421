"""The EFA installer stand-in: `aws-efa-installer/efa_installer.sh` plus the Debian 12 .debs
it installs, in a tarball shaped like AWS's `aws-efa-installer-<version>.tar.gz`.

The bytes depend only on the version, the installer text and the locked .debs (sample's
reproducible tar: sorted entries, fixed mtime, root ownership, gzip without name or mtime).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from realparts.debs import Deb, fetch, packages_index, read_lock
from sample.archive import make_tar_gz
from sample.templates import SourceFile

HERE = Path(__file__).with_name("efa")
LOCK = HERE / "debs.lock.json"
DEB_DIR = "DEBS/DEBIAN12/x86_64"
# What the installer installs; apt adds their dependencies, all of them in the lock.
PACKAGES = ("rdma-core", "ibverbs-providers", "libibverbs1", "libibverbs-dev", "librdmacm1",
            "librdmacm-dev", "libfabric1", "libfabric-bin", "libfabric-dev", "openmpi-bin",
            "libopenmpi-dev")


@dataclass(frozen=True)
class Generated:
    path: Path
    sha256: str
    size: int


def tarball_name(version: str) -> str:
    return f"aws-efa-installer-{version}.tar.gz"


def build(version: str, debs: list[Deb], mirror: str, cache: Path) -> bytes:
    installer = (HERE / "efa_installer.sh").read_text().replace("@@EFA_VERSION@@", version)
    fetched = [(deb, fetch(deb, mirror, cache)) for deb in debs]
    files = [
        SourceFile("efa_installer.sh", installer.encode(), 0o755),
        SourceFile("README.md", (HERE / "README.md").read_bytes(), 0o644),
        SourceFile(f"{DEB_DIR}/Packages", packages_index(fetched), 0o644),
        *(SourceFile(f"{DEB_DIR}/{deb.filename}", data, 0o644) for deb, data in fetched),
    ]
    return make_tar_gz(files, "aws-efa-installer")


def generate(version: str, out: Path, mirror: str, cache: Path) -> Generated:
    """Writes ``out/aws-efa-installer-<version>.tar.gz`` and its ``.sha256`` beside it."""
    data = build(version, read_lock(LOCK), mirror, cache)
    digest = hashlib.sha256(data).hexdigest()
    out.mkdir(parents=True, exist_ok=True)
    path = out / tarball_name(version)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")
    return Generated(path, digest, len(data))

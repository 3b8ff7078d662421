"""Deterministic tarballs and wheels.

The sha256 of every artifact is pinned in a committed manifest, so the bytes must depend only
on the inputs: entries sorted, one fixed timestamp, root ownership, and no gzip file name or
mtime in the header.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import tarfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sample.templates import SourceFile

# 2022-02-18T00:00:00Z, the date in the SMDDP 1.4.0 wheel URL of the seed recipe.
FIXED_EPOCH = 1645142400
FIXED_DATE_TIME = (2022, 2, 18, 0, 0, 0)


@dataclass(frozen=True)
class WheelSpec:
    """What a wheel's .dist-info says about it."""

    distribution: str  # normalised with underscores, as in the file name
    project_name: str  # as in METADATA's Name
    version: str
    tag: str  # e.g. cp311-cp311-linux_x86_64
    summary: str
    requires_python: str
    top_level: Sequence[str]

    @property
    def filename(self) -> str:
        return f"{self.distribution}-{self.version}-{self.tag}.whl"

    @property
    def dist_info(self) -> str:
        return f"{self.distribution}-{self.version}.dist-info"


def _parent_dirs(paths: Iterable[str]) -> set[str]:
    dirs: set[str] = set()
    for path in paths:
        parts = path.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:depth]))
    return dirs


def _tar_info(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.mtime = FIXED_EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def make_tar_gz(files: Sequence[SourceFile], prefix: str) -> bytes:
    """A .tar.gz of ``files`` under the top directory ``prefix``, byte-for-byte reproducible."""
    members = {f"{prefix}/{f.path}": f for f in files}
    names = set(members) | _parent_dirs(members) | {prefix}
    raw = io.BytesIO()
    # GNU format: no PAX headers, which would carry extra (and variable) attributes.
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(names):
            source = members.get(name)
            if source is None:
                tar.addfile(_tar_info(name, tarfile.DIRTYPE, 0o755))
            else:
                info = _tar_info(name, tarfile.REGTYPE, source.mode, len(source.data))
                tar.addfile(info, io.BytesIO(source.data))
    compressed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, compresslevel=9, mtime=0) as gz:
        gz.write(raw.getvalue())
    return compressed.getvalue()


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _wheel_metadata(spec: WheelSpec) -> dict[str, bytes]:
    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {spec.project_name}\n"
        f"Version: {spec.version}\n"
        f"Summary: {spec.summary}\n"
        f"Requires-Python: {spec.requires_python}\n"
    )
    wheel = (
        f"Wheel-Version: 1.0\nGenerator: sample.generate\nRoot-Is-Purelib: false\nTag: {spec.tag}\n"
    )
    top_level = "".join(f"{name}\n" for name in spec.top_level)
    return {
        f"{spec.dist_info}/METADATA": metadata.encode(),
        f"{spec.dist_info}/WHEEL": wheel.encode(),
        f"{spec.dist_info}/top_level.txt": top_level.encode(),
    }


def _zip_entry(zf: zipfile.ZipFile, name: str, data: bytes, mode: int) -> None:
    info = zipfile.ZipInfo(name, date_time=FIXED_DATE_TIME)
    info.create_system = 3  # unix, so that external_attr carries the permission bits
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data, compresslevel=9)


def make_wheel(spec: WheelSpec, files: Sequence[SourceFile]) -> bytes:
    """An installable wheel: package files first, then .dist-info with RECORD last (PEP 427)."""
    entries = {f.path: (f.data, f.mode) for f in files}
    entries.update({path: (data, 0o644) for path, data in _wheel_metadata(spec).items()})
    record_path = f"{spec.dist_info}/RECORD"
    record_lines = [
        f"{path},{_record_hash(data)},{len(data)}"
        for path, (data, _mode) in sorted(entries.items())
    ]
    record_lines.append(f"{record_path},,")
    record = ("\n".join(record_lines) + "\n").encode()

    def order(path: str) -> tuple[bool, str]:
        return (path.startswith(spec.dist_info + "/"), path)

    out = io.BytesIO()
    with zipfile.ZipFile(out, mode="w") as zf:
        for path in sorted(entries, key=order):
            data, mode = entries[path]
            _zip_entry(zf, path, data, mode)
        _zip_entry(zf, record_path, record, 0o644)
    return out.getvalue()

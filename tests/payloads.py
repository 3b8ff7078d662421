"""Bodies for served test files. Sources named like tarballs are scanned before they are
kept (imageforge/sources/tarcheck.py), so they must really be tarballs."""

from __future__ import annotations

import io
import os
import tarfile


def random_tarball(size: int, *, name: str = "payload.bin") -> bytes:
    """A gzipped tarball holding `size` random bytes (so about that big: they do not
    compress), different on every call."""
    payload = os.urandom(size)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()

"""A directory of the build host handed to BuildKit (a stage's `local_dirs`, e.g. the user's
training code), keyed by its content.

A stage keys such a directory by the sha256 of its tree (relative paths, executable bits and
bytes), never its location, so the same tree gives the same key from any checkout and any edit
rebuilds that stage. The build reads a content-addressed snapshot, so an edit made while
BuildKit runs cannot slip into an image keyed otherwise.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from imageforge.errors import ManifestError

# Files that are never training code and would only make keys differ between checkouts.
IGNORED = frozenset({".git", "__pycache__", ".ipynb_checkpoints", ".DS_Store"})


def tree_digest(root: Path) -> str:
    """sha256 over every file's relative path, executable bit and content, in path order."""
    digest = hashlib.sha256()
    for relative, path in _files(root):
        mode = "x" if os.access(path, os.X_OK) else "-"
        digest.update(f"{relative}\0{mode}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def _files(root: Path) -> Iterator[tuple[str, Path]]:
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED)
        # os.walk lists a symlink to a directory among the directories, and skips it.
        names = files + [d for d in dirs if (Path(directory) / d).is_symlink()]
        for name in sorted(names):
            if name in IGNORED or name.endswith(".pyc"):
                continue
            path = Path(directory) / name
            relative = path.relative_to(root).as_posix()
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                raise ManifestError(f"{root}: {relative} is a symlink; the training code must "
                                    "be plain files (copy what it points to instead).")
            if not stat.S_ISREG(info.st_mode):
                raise ManifestError(f"{root}: {relative} is not a regular file; remove it "
                                    "from the training code directory.")
            yield relative, path


def snapshot(root: Path, digest: str, cache: Path) -> Path:
    """A read-only copy of `root` under `cache`, named by `digest`; refuses a tree that no
    longer has that digest (it changed after planning)."""
    target = cache / digest.removeprefix("sha256:")
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cache, prefix=".tmp-"))
    try:
        for relative, path in _files(root):
            dest = staging / relative
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        if tree_digest(staging) != digest:
            raise ManifestError(f"{root} changed while this build was starting; run it again.")
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


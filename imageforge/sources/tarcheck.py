"""Refuse hostile tarballs on the host, before they enter the source cache.

imageforge unpacks nothing itself (tar runs inside BuildKit), but `lock --upgrade` and the
nightly pin new upstream tarballs with no person reading them first. So every tarball source
is scanned once, after its sha256 checks out and before it is kept: a member that would land
outside the directory it is unpacked in (a `..` component, an absolute path, a link that
points out, also through the archive's own symlinks) or that is a device or a fifo refuses
the whole archive. tarfile's `data` filter (PEP 706) runs on every member as well; the
checks here are stricter where it is lenient (it strips leading slashes, and allows `..`
that stays inside).
"""

from __future__ import annotations

import lzma
import tarfile
import tempfile
import zlib
from collections.abc import Iterable
from pathlib import Path

from imageforge.errors import SourceError

SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
# Symlinks followed while resolving one path before it counts as a loop (Linux's limit).
MAX_HOPS = 40


def is_tarball(filename: str) -> bool:
    return filename.lower().endswith(SUFFIXES)


def check(path: Path, *, source: str, origin: str) -> None:
    """Raise SourceError naming `source` (its name), `origin` (its URL, redacted) and the
    first bad member when the tarball at `path` could write outside its directory."""
    try:
        bad = first_problem(path)
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
        raise SourceError(f"source {source} ({origin}) is not a readable tar archive ({exc}); "
                          "it was not kept, check the file upstream and its pin.") from None
    if bad is not None:
        member, why = bad
        raise SourceError(f"source {source} ({origin}) was refused: member {member!r} {why}, "
                          "so unpacking it could write outside its directory; nothing was "
                          "kept, check where this release came from before pinning it.")


def first_problem(path: Path) -> tuple[str, str] | None:
    """(member name, what is wrong with it) for the first hostile member, or None."""
    with tarfile.open(path, mode="r:*") as archive, \
            tempfile.TemporaryDirectory(prefix="imageforge-tarcheck-") as dest:
        bad = _scan(archive, dest)
        # tarfile takes a stream that stops mid-header for the end of the archive; reading
        # on makes a truncated compressed stream an error (GNU tar would fail on it later).
        assert archive.fileobj is not None
        while archive.fileobj.read(1 << 20):
            pass
        return bad


def _scan(members: Iterable[tarfile.TarInfo], dest: str) -> tuple[str, str] | None:
    # Symlinks seen so far, by where they really are (their directory resolved through the
    # symlinks before them) -> target.
    links: dict[str, str] = {}
    for member in members:
        # tarfile extracts "a/b/" as "a/b": a trailing slash must not move a symlink one
        # directory down (a link "a/b/" -> "../.." was judged from inside a/b, so allowed).
        parts = member.name.rstrip("/").split("/")
        why = _problem(member)
        parent = _resolve(parts[:-1], links) if why is None else None
        if why is None and parent is None:
            why = "lies behind a symlink that leads outside the archive's tree (or loops)"
        if why is None and (member.issym() or member.islnk()):
            why = _link_problem(member, parent or [], links)
        if why is None:
            try:
                tarfile.data_filter(member, dest)
            except tarfile.FilterError as exc:
                why = f"is refused by tarfile's data filter ({exc})"
        if why is not None:
            return member.name, why
        if member.issym() and parts[-1] != ".":
            links["/".join([*(parent or []), parts[-1]])] = member.linkname
    # A link made harmless only by the order of members (a directory on its way became a
    # symlink later) still points out once everything is unpacked.
    for where, target in links.items():
        if _resolve([*where.split("/")[:-1], *target.split("/")], links) is None:
            return where, f"is a symlink to {target!r}, outside the archive's tree"
    return None


def _problem(member: tarfile.TarInfo) -> str | None:
    name = member.name
    if name.startswith("/"):
        return "has an absolute path"
    if ".." in name.split("/"):
        return "has a '..' path component"
    if member.ischr() or member.isblk():
        return "is a device file"
    if member.isfifo():
        return "is a fifo"
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        return "is a special file"
    return None


def _link_problem(member: tarfile.TarInfo, parent: list[str], links: dict[str, str]
                  ) -> str | None:
    kind = "symlink" if member.issym() else "hard link"
    target = member.linkname
    if target.startswith("/"):
        return f"is a {kind} to the absolute path {target!r}"
    # A symlink's target is relative to its directory, a hard link's to the archive root.
    base = parent if member.issym() else []
    if _resolve([*base, *target.split("/")], links) is None:
        return f"is a {kind} to {target!r}, outside the archive's tree"
    return None


def _resolve(parts: list[str], links: dict[str, str]) -> list[str] | None:
    """Where `parts` (relative to the archive root) lands once the archive's own symlinks
    are followed; None when it leaves the root (or loops)."""
    out: list[str] = []
    queue = list(parts)
    hops = 0
    while queue:
        part = queue.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                return None
            out.pop()
            continue
        out.append(part)
        target = links.get("/".join(out))
        if target is None:
            continue
        hops += 1
        if hops > MAX_HOPS or target.startswith("/"):
            return None
        out.pop()
        queue = target.split("/") + queue
    return out

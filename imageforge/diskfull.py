"""A full disk under the cache, said as one sentence naming the place (exit 9).

Without this a full disk surfaced as a traceback (a write in Python), as "check the
repository URL and your network" (git ran out of space) or as a failed build (BuildKit
could not export an artifact).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from imageforge.errors import CacheError, SourceError

_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_TEXT = re.compile(r"no space left on device|disk quota exceeded", re.I)
# "write /cache/artifacts/tmp/1-x/efa/ingest/.../data: no space left on device"
_FULL_PATH = re.compile(r"(/[^\s:\"']+):? no space left on device", re.I)


def is_full(exc: BaseException) -> bool:
    """Whether `exc` is a write that ran out of space (or quota), also as git told it."""
    if isinstance(exc, OSError) and exc.errno in _NO_SPACE_ERRNOS:
        return True
    return isinstance(exc, SourceError) and mentions_full(str(exc))


def mentions_full(text: str) -> bool:
    return _NO_SPACE_TEXT.search(text) is not None


def full_path(text: str) -> Path | None:
    """The path a program's "no space left on device" message names, if it names one."""
    match = _FULL_PATH.search(text)
    return Path(match.group(1)) if match else None


def nearly_full(place: Path, *, below: int = 64 << 20) -> bool:
    """Whether the disk holding `place` has less than `below` bytes free (for a message
    that says a disk filled up but not which)."""
    try:
        stat = os.statvfs(place)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < below


def error(place: Path) -> CacheError:
    return CacheError(f"the disk holding {place} is full; free space there (e.g. `invoke "
                      "cache.prune --max-size 20G`) or point INVOKE_IMAGEFORGE_CACHE_DIR at a "
                      "bigger disk, then run again.")


@contextmanager
def guard(place: Path) -> Iterator[None]:
    """Turn running out of space inside the block into `error(place)`."""
    try:
        yield
    except (OSError, SourceError) as exc:
        if is_full(exc):
            raise error(place) from None
        raise

"""Per-key reader/writer locks on files (flock): builders of a key hold it exclusively,
builds that read a cached key hold it shared, prune takes it exclusively. The kernel drops
a lock when its process dies, so a killed build never leaves a key locked."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from imageforge import log
from imageforge.errors import CacheError


@contextmanager
def locked(path: Path, *, shared: bool, timeout: float = 3600, what: str = "") -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told and what:
                    log.note(f"waiting for another imageforge process using {what}")
                    told = True
                if time.monotonic() > deadline:
                    raise CacheError(f"gave up after {timeout:.0f} s waiting for the lock of "
                                     f"{what or path}; is another build stuck?") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


@contextmanager
def locked_all(items: Sequence[tuple[Path, bool, str]], timeout: float = 3600) -> Iterator[None]:
    """Lock many keys; always in path order, so two processes can never deadlock."""
    with ExitStack() as stack:
        for path, shared, what in sorted(items, key=lambda item: str(item[0])):
            stack.enter_context(locked(path, shared=shared, timeout=timeout, what=what))
        yield

"""The source cache: pinned files and git checkouts, content-addressed, one directory each.

Each entry directory is handed to BuildKit as a named build context, so it holds only the source
itself. Beside it live ``<entry>.lock`` (so processes never fetch the same entry twice) and
``<entry>.complete`` (written last; an entry without it is treated as absent and replaced).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from filelock import FileLock

if TYPE_CHECKING:
    import requests
    from rich.progress import Progress, TaskID

from imageforge import diskfull
from imageforge.errors import Interrupted, LockError
from imageforge.jsonfile import write_json
from imageforge.model.sourcetypes import GitSource, Source, UrlSource
from imageforge.sources import tarcheck
from imageforge.sources.download import Progress as ProgressCallback
from imageforge.sources.download import download, interrupt
from imageforge.sources.gitsource import checkout
from imageforge.sources.signature import verify
from imageforge.textsafe import redact, shown

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
COMMIT_SHA = re.compile(r"[0-9a-f]{40}")


class Locator(Protocol):
    """Where sources are really fetched from (rewrite rules, a mirror) and how to sign in
    there. Markers and locks keep recording the original locations."""

    def source(self, source: Source) -> Source: ...

    def url(self, url: str) -> str: ...

    def session(self) -> requests.Session | None: ...

    def git_config(self) -> Mapping[str, str]: ...


class SourceCache:
    """Fetches sources into ``root`` (normally ``<cache dir>/sources``) and finds them again."""

    def __init__(self, root: Path, locator: Locator | None = None) -> None:
        self.root = root
        self.locator = locator

    def locate(self, source: Source) -> Source:
        """`source` as it is fetched: moved by the locator, same pins."""
        return self.locator.source(source) if self.locator else source

    def locate_url(self, url: str) -> str:
        """Where to read `url` while resolving pins (rewrite rules only)."""
        return self.locator.url(url) if self.locator else url

    def path_for(self, source: Source) -> Path:
        """The context directory of `source`, whether or not it has been fetched yet."""
        if isinstance(source, UrlSource):
            return self.root / "sha256" / _pinned_digest(source)
        return self.root / "git" / _checkout_name(source)

    def materialize(self, source: Source, on_progress: ProgressCallback | None = None) -> Path:
        """Fetch `source` unless a complete entry exists; return its context directory."""
        entry = self.path_for(source)
        if self._is_complete(source, entry):
            return entry
        with diskfull.guard(self.root):
            entry.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(_beside(entry, ".lock")):
                # Another process may have completed it while we waited for the lock.
                if self._is_complete(source, entry):
                    return entry
                if isinstance(source, UrlSource) and _add_file_name(source, entry):
                    return entry
                _clear(entry)
                try:
                    _fetch(self.locate(source), entry, on_progress, self.locator)
                    _write_marker(entry, _marker(source, entry))
                except BaseException:
                    # Without its marker the entry counts as absent, but it would still take
                    # space, maybe on the disk that just filled up.
                    _clear(entry)
                    raise
        return entry

    def materialize_all(
        self,
        sources: Sequence[Source],
        *,
        jobs: int = 4,
        progress: bool | None = None,
    ) -> dict[str, Path]:
        """Materialise `sources` in parallel; return context directories by source name.

        `progress`: True for progress bars, False for plain lines, None for bars on a terminal.
        The first failure stops the downloads still running and is raised.
        """
        for source in sources:
            self.path_for(source)  # refuse unlocked sources before any download starts
        bars = sys.stderr.isatty() if progress is None else progress
        cancel = threading.Event()
        workers: set[int] = set()
        with _reporter(bars) as reporter, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [pool.submit(self._reported, source, reporter, cancel, workers)
                       for source in sources]
            try:
                wait(futures, return_when=FIRST_EXCEPTION)
            except KeyboardInterrupt:
                _stop(futures, cancel)
                # A download stalled in a read would hold the pool (and so Ctrl-C) until its
                # read timeout: its socket is shut down now.
                interrupt(workers)
                raise Interrupted(
                    "fetching sources was interrupted; unfinished downloads were discarded, run "
                    "the command again"
                ) from None
            for future in futures:
                error = future.exception() if future.done() else None
                if error is not None and not isinstance(error, _NotStarted):
                    _stop(futures, cancel)
                    interrupt(workers)
                    raise error
            return {source.name: future.result() for source, future in zip(sources, futures,
                                                                             strict=True)}

    def _reported(self, source: Source, reporter: _Reporter, cancel: threading.Event,
                  workers: set[int]) -> Path:
        if cancel.is_set():
            raise _NotStarted   # another source failed first: this one is not fetched
        workers.add(threading.get_ident())
        entry = self.path_for(source)
        if self._is_complete(source, entry):
            reporter.cached(source)
            return entry
        # Say where the bytes really come from: a rewrite target or the mirror.
        on_progress = _cancellable(reporter.started(self.locate(source)), cancel)
        try:
            path = self.materialize(source, on_progress)
        except BaseException:
            # Before the pool starts a queued source: with one worker, the next one would
            # otherwise begin before the caller sees this failure.
            cancel.set()
            reporter.finished(source, ok=False)
            raise
        reporter.finished(source, ok=True)
        return path

    def _is_complete(self, source: Source, entry: Path) -> bool:
        marker = _read_marker(entry)
        if marker is None or not entry.is_dir():
            return False
        if isinstance(source, GitSource):
            return marker.get("commit") == source.commit
        stored = entry / source.filename
        return (
            marker.get("sha256") == source.sha256
            and _signed_as_required(source, marker)
            and stored.is_file()
            and stored.stat().st_size == marker.get("size")
        )


class _NotStarted(Exception):
    """A source left alone because another one failed first."""


def _signed_as_required(source: UrlSource, marker: dict[str, Any]) -> bool:
    # An entry fetched before the manifest asked for a signature has not been checked yet.
    return source.signature is None or marker.get("signed_by") == source.signature.fingerprint


def _pinned_digest(source: UrlSource) -> str:
    if source.sha256 is None:
        raise LockError(
            f"source {source.name} ({redact(source.url)}) has no pinned sha256; run `invoke lock`"
        )
    if not SHA256_HEX.fullmatch(source.sha256):
        raise LockError(
            f"source {source.name} has an invalid sha256 {shown(source.sha256)}; run `invoke lock`"
        )
    return source.sha256


def _checkout_name(source: GitSource) -> str:
    if source.commit is None:
        raise LockError(
            f"source {source.name} ({redact(source.repo)} {source.ref}) has no locked commit; run "
            "`invoke lock`"
        )
    if not COMMIT_SHA.fullmatch(source.commit):
        raise LockError(
            f"source {source.name} has an invalid commit {shown(source.commit)}; run `invoke lock`"
        )
    if source.submodules is False or source.submodules == ():
        return source.commit
    # The same commit with other submodules is another tree, so another entry.
    spec = "*" if source.submodules is True else "\n".join(sorted(source.submodules))
    return f"{source.commit}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"


def _beside(entry: Path, suffix: str) -> Path:
    return entry.with_name(entry.name + suffix)


def _read_marker(entry: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads(_beside(entry, ".complete").read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _write_marker(entry: Path, marker: dict[str, Any]) -> None:
    path = _beside(entry, ".complete")
    write_json(path, marker, sort_keys=True)


def _marker(source: Source, entry: Path) -> dict[str, Any]:
    fetched_at = datetime.now(UTC).isoformat(timespec="seconds")
    if isinstance(source, UrlSource):
        return {
            "url": redact(source.url),
            "sha256": source.sha256,
            "filename": source.filename,
            "size": (entry / source.filename).stat().st_size,
            "signed_by": source.signature.fingerprint if source.signature else None,
            "fetched_at": fetched_at,
        }
    return {
        "repo": redact(source.repo),
        "ref": source.ref,
        "commit": source.commit,
        "submodules": source.submodules,
        "size": _tree_size(entry),
        "fetched_at": fetched_at,
    }


def _tree_size(root: Path) -> int:
    return sum(
        os.lstat(os.path.join(folder, name)).st_size
        for folder, _, files in os.walk(root)
        for name in files
    )


def _add_file_name(source: UrlSource, entry: Path) -> bool:
    """Serve a complete entry under one more file name (same bytes pinned by two sources).

    Replacing the entry instead would pull the file away from whoever uses the other name.
    """
    marker = _read_marker(entry)
    if marker is None or marker.get("sha256") != source.sha256:
        return False
    if not _signed_as_required(source, marker):
        return False
    existing = entry / str(marker.get("filename"))
    if not existing.is_file() or existing.stat().st_size != marker.get("size"):
        return False
    os.link(existing, entry / source.filename)
    return True


def _clear(entry: Path) -> None:
    """Remove an incomplete entry and anything a crashed fetch of it left behind."""
    _beside(entry, ".complete").unlink(missing_ok=True)
    shutil.rmtree(entry, ignore_errors=True)
    for leftover in entry.parent.glob(f".{entry.name}.*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def _fetch(source: Source, entry: Path, on_progress: ProgressCallback | None,
           locator: Locator | None) -> None:
    if isinstance(source, GitSource):
        assert source.commit is not None  # path_for refused unlocked sources
        checkout(source.repo, source.commit, entry, submodules=source.submodules,
                 config=locator.git_config() if locator else {})
        return
    scratch = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}."))
    session = locator.session() if locator else None
    try:
        download(source.url, scratch / source.filename, sha256=source.sha256,
                 on_progress=on_progress, session=session)
        if source.signature is not None:
            verify(source.signature, scratch / source.filename, origin=source.url,
                   session=session)
        if tarcheck.is_tarball(source.filename):
            tarcheck.check(scratch / source.filename, source=source.name,
                           origin=redact(source.url))
        scratch.rename(entry)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    finally:
        if session is not None:
            session.close()


def _cancellable(callback: ProgressCallback | None, cancel: threading.Event) -> ProgressCallback:
    def report(done: int, total: int | None) -> None:
        if cancel.is_set():
            raise Interrupted("fetching sources was stopped; run the command again")
        if callback is not None:
            callback(done, total)

    return report


def _stop(futures: Sequence[Future[Path]], cancel: threading.Event) -> None:
    cancel.set()
    for future in futures:
        future.cancel()


def _origin(source: Source) -> str:
    return redact(source.url if isinstance(source, UrlSource) else source.repo)


class _Reporter(Protocol):
    def cached(self, source: Source) -> None: ...

    def started(self, source: Source) -> ProgressCallback | None: ...

    def finished(self, source: Source, *, ok: bool) -> None: ...


class _Lines:
    """Plain lines on stderr, for logs and CI."""

    def cached(self, source: Source) -> None:
        _say(f"{source.name}: cached")

    def started(self, source: Source) -> ProgressCallback | None:
        _say(f"{source.name}: fetching {_origin(source)}")
        return None

    def finished(self, source: Source, *, ok: bool) -> None:
        _say(f"{source.name}: {'ready' if ok else 'failed'}")


_SAY_LOCK = threading.Lock()


def _say(line: str) -> None:
    # Fetch threads report concurrently; one write per whole line keeps lines apart.
    with _SAY_LOCK:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


class _Bars:
    """One live bar per source being fetched; finished ones become a line above the bars."""

    def __init__(self, bars: Progress) -> None:
        self._bars = bars
        self._tasks: dict[str, TaskID] = {}

    def cached(self, source: Source) -> None:
        self._bars.console.print(f"{source.name}: cached")

    def started(self, source: Source) -> ProgressCallback | None:
        task = self._bars.add_task(source.name, total=None)
        self._tasks[source.name] = task

        def update(done: int, total: int | None) -> None:
            self._bars.update(task, completed=done, total=total)

        return update

    def finished(self, source: Source, *, ok: bool) -> None:
        self._bars.remove_task(self._tasks.pop(source.name))
        self._bars.console.print(f"{source.name}: {'ready' if ok else 'failed'}")


@contextmanager
def _reporter(bars: bool) -> Iterator[_Reporter]:
    if not bars:
        yield _Lines()
        return
    # rich only for a terminal's bars: CI and pipes never pay for its import.
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        yield _Bars(progress)

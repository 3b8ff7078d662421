"""Read a manifest, a manifest it inherits or a matrix file: bounded, and only from something
that ends.

A manifest path is whatever a flag, a setting or another file says. `--manifest /dev/zero`
used to be read until memory ran out, deaf to SIGTERM (a read that always returns data never
gives Python a moment to run a signal handler), and a FIFO nobody writes to blocked forever.
So a file is read only when it is a regular file or a pipe (`--manifest /dev/stdin < x.toml`,
`cat x.toml | ... --manifest /dev/stdin`), opened without waiting for a writer, and never
more than MAX_BYTES + 1 bytes of it.

TOML is UTF-8: a UTF-8 byte-order mark at the start (some editors write one) is dropped, and
anything else that is not UTF-8 is named by line, column and byte offset.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from imageforge.errors import ManifestError
from imageforge.textsafe import escaped

# Shipped manifests are a few KiB; a matrix of a hundred images is well under 100 KiB.
MAX_BYTES = 1 << 20
MAX_TEXT = "1 MiB"
_CHUNK = 1 << 16
_NOT_FILES = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
# A pipe gives its bytes once, but a command may read its manifest twice (build and fetch
# look again for moved pins): what each pipe gave, by its (device, inode), is kept for the
# process's next reading.
_PIPED: dict[tuple[int, int], str] = {}


def read_text(path: Path, *, what: str, context: str = "") -> str:
    """The text of `path`, a `what` ("manifest", "matrix file"). FileNotFoundError for a
    missing file (each caller says where to find one); ManifestError, naming `path` and
    `context` ("inherited by ..."), for anything else."""
    where = escaped(str(path), None) + (f" ({context})" if context else "")
    try:
        info = os.stat(path)
        _refuse_endless(info, where, what)
        pipe = (info.st_dev, info.st_ino) if stat.S_ISFIFO(info.st_mode) else None
        if pipe in _PIPED:
            return _PIPED[pipe]
        data = _read_bounded(path, where, what)
    except FileNotFoundError:
        raise
    except ValueError:
        raise ManifestError(f"{where}: not a path (it holds a NUL character); name a {what} "
                            "file.") from None
    except OSError as exc:
        raise ManifestError(f"{where}: cannot read the {what} ({exc.strerror or exc}); check "
                            "that path and its permissions.") from None
    if pipe is not None and not data:
        raise ManifestError(f"{where}: a pipe with nothing written to it; write the {what} "
                            "into it, or name a file.")
    text = _decoded(data, where, what)
    if pipe is not None:
        _PIPED[pipe] = text
    return text


def parse(text: str) -> dict[str, Any]:
    """tomllib.loads, whose every refusal is a TOMLDecodeError: tomllib lets int()'s refusal
    of a number of more than 4300 digits through as a bare ValueError."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raise
    except ValueError:
        raise tomllib.TOMLDecodeError("a number of more than 4300 digits") from None


def _refuse_endless(info: os.stat_result, where: str, what: str) -> None:
    """Refuse what never ends (/dev/zero, /dev/urandom, a terminal) or is no text at all,
    before it is opened: opening some devices is an action of its own."""
    for test, kind in _NOT_FILES:
        if test(info.st_mode):
            raise ManifestError(f"{where}: {kind}, not a file; a {what} is read from a file "
                                "(or a pipe): name one.")


def _read_bounded(path: Path, where: str, what: str) -> bytes:
    """At most MAX_BYTES of `path`."""
    # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        # What was opened is what was checked (the path may have been replaced since).
        _refuse_endless(os.fstat(fd), where, what)
        # Then wait for a writer's data like any reader: Ctrl-C and SIGTERM interrupt that.
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, min(_CHUNK, MAX_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    if size > MAX_BYTES:
        raise ManifestError(f"{where}: larger than {MAX_TEXT}, the most a {what} may be; name "
                            f"the right file (a {what} is a few KiB of TOML).")
    return b"".join(chunks)


def _decoded(data: bytes, where: str, what: str) -> str:
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise ManifestError(f"{where}: starts with a UTF-16 byte-order mark; a {what} must be "
                            "UTF-8: save it as UTF-8.")
    # Dropped, and still counted in the offset: line and column are what an editor shows.
    skipped = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    data = data[skipped:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        line = data.count(b"\n", 0, exc.start) + 1
        column = len(data[line_start:exc.start].decode("utf-8")) + 1
        raise ManifestError(f"{where}: byte 0x{data[exc.start]:02x} at line {line}, column "
                            f"{column} (offset {exc.start + skipped}) is not UTF-8; a {what} "
                            "must be UTF-8: save it as UTF-8.") from None

"""Small JSON files imageforge keeps (records, reports, metadata)."""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path
from typing import Any

# Far more than any lock, record or report imageforge writes: a file beyond it is not one of
# them, and a link to /dev/zero would otherwise be read until memory ran out.
MAX_BYTES = 16 << 20


def read_bounded(path: Path) -> str:
    """The UTF-8 text of `path`, a regular file of at most MAX_BYTES. Raises OSError when it
    cannot be read (FileNotFoundError when missing) and ValueError for anything else: not a
    regular file, too large, not UTF-8."""
    # Stat before opening: opening a FIFO for reading would wait for a writer.
    if not stat.S_ISREG(path.stat().st_mode):
        raise ValueError("not a regular file")
    with path.open("rb") as data:
        raw = data.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES >> 20} MiB")
    return raw.decode("utf-8")


def load(path: Path) -> Any:
    """The JSON value in `path`, read as read_bounded reads; raises as it does (a syntax error
    is a ValueError too)."""
    return json.loads(read_bounded(path))


def read_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when it is missing, unreadable or not an object."""
    try:
        data = load(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_text(path: Path, text: str) -> None:
    """`text` into `path`, which readers see whole or not at all.

    A regular file (or a new one) is written to a temporary file of its own beside it (mode
    0666 less the umask, as open() makes files), flushed to the disk and renamed over it: two
    writers never share a temporary name, a reader never sees half, and a crash leaves the
    old file or the new one.
    A symlink is followed, so the link stays a link. Anything else that is not a directory (a
    device such as /dev/stdout, a FIFO such as a shell's >(jq .)) is written in place, since
    a rename would replace it with a plain file. A directory raises IsADirectoryError."""
    target = path.resolve()
    if target.is_dir():
        raise IsADirectoryError(21, "Is a directory", str(path))
    if target.exists() and not target.is_file():
        with target.open("w", encoding="utf-8") as stream:
            stream.write(text)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(scratch, target)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any, *, sort_keys: bool = False) -> None:
    """`data` as indented JSON, written as write_text writes."""
    write_text(path, json.dumps(data, indent=2, sort_keys=sort_keys) + "\n")

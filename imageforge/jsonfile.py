"""Small JSON files imageforge keeps (records, reports, metadata)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def read_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_text(path: Path, text: str) -> None:
    """`text` into `path`, which readers see whole or not at all.

    A regular file (or a new one) is written to a temporary file of its own beside it and
    renamed over it: two writers never share a temporary name, and a reader never sees half.
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
    fd, scratch = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(scratch, target)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    """`data` as indented JSON, written as write_text writes."""
    write_text(path, json.dumps(data, indent=2) + "\n")

"""Where a command's reports go: the file a flag names, checked before any work."""

from __future__ import annotations

import os
from pathlib import Path

from imageforge import diskfull, jsonfile
from imageforge.errors import UsageError


def write_output(flag: str, path: str, text: str, *, append: bool = False) -> None:
    """Write (or append to) the file a flag names; refusing a path names that flag. A
    regular file is replaced whole through a temporary file beside it (a reader, or a crash,
    never sees half of it); a device, a FIFO or /dev/stdout is written in place."""
    try:
        if append:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(text)
        else:
            if not Path(path).resolve().parent.is_dir():
                # As open() would: an output never creates directories nobody named.
                raise FileNotFoundError(2, "No such file or directory", path)
            jsonfile.write_text(Path(path), text)
    except OSError as exc:
        if diskfull.is_full(exc):
            raise
        raise UsageError(f"{flag} {path}: cannot write it ({exc.strerror or exc}); give a file "
                         "in an existing, writable directory.") from None


def output_file(flag: str, path: str | None) -> Path | None:
    """The report file a flag names, refused before any work when it could not be written:
    a directory, a missing directory, or one this user cannot write to."""
    if not path:
        return None
    target = Path(path).resolve()
    if target.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file path.")
    if not target.parent.is_dir():
        raise UsageError(f"{flag} {path}: its directory {target.parent} does not exist; create "
                         "it or give another path.")
    writable = os.access(target, os.W_OK) if target.exists() else \
        os.access(target.parent, os.W_OK | os.X_OK)
    if not writable:
        raise UsageError(f"{flag} {path}: cannot write it (permission denied); give a file in a "
                         "directory you can write to.")
    return Path(path)


def stdout_or_file(flag: str, path: str | None, text: str) -> str:
    """`text` written to the file `flag` names; what is left for standard output."""
    if path:
        write_output(flag, path, text)
        return ""
    return text

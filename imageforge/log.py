"""The one logger: warnings and notes as `imageforge: warning: ...` and `imageforge: note: ...`
lines on stderr, and the commands imageforge runs (`+ docker buildx bake ...`) at debug level.
The one sentence a fatal error ends a command with is `imageforge: error: ...` (error_line),
so the three are told apart by their prefix.

`IMAGEFORGE_LOG=debug` shows every command; `IMAGEFORGE_LOG=warning` hides the notes.
Standard output is left to what a command is asked for (plans, tables, JSON)."""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

LOGGER = logging.getLogger("imageforge")


def _line(level: str, message: str) -> str:
    return f"imageforge: {level}: {message}"


def error_line(message: str) -> str:
    """The line a command that fails ends with, before its exit code."""
    return _line("error", message)


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "note" if record.levelno == logging.INFO else record.levelname.lower()
        return _line(level, record.getMessage())


class _Stderr(logging.StreamHandler[TextIO]):
    """Writes to the sys.stderr of the moment, which tests and callers may replace."""

    def emit(self, record: logging.LogRecord) -> None:
        # Not setStream: that flushes the previous stream, which may be closed by now.
        self.stream = sys.stderr
        super().emit(record)


def _setup() -> None:
    if any(isinstance(h, _Stderr) for h in LOGGER.handlers):
        return
    handler = _Stderr(sys.stderr)
    handler.setFormatter(_Format())
    LOGGER.addHandler(handler)
    LOGGER.propagate = False
    name = os.environ.get("IMAGEFORGE_LOG", "info").upper()
    LOGGER.setLevel(getattr(logging, name, logging.INFO))


# How many warnings this process gave: a build that warned is never answered from a record
# (imageforge/uptodate.py), so the next one warns again.
warned = 0


def warning(message: str) -> None:
    global warned  # noqa: PLW0603 - a process-wide count
    warned += 1
    LOGGER.warning(message)


def note(message: str) -> None:
    LOGGER.info(message)


def debug(message: str) -> None:
    LOGGER.debug(message)


_setup()

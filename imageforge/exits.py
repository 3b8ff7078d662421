"""How a command ends where no FatalError can say it: the reader of its output gone, its
output's own device full, or invoke's configuration file broken before any task runs."""

from __future__ import annotations

import os
import stat
import sys
from types import TracebackType

from invoke.vendor.yaml import YAMLError

from imageforge import log

# 128 + SIGPIPE: what a shell pipeline's writer exits with when its reader went away.
EXIT_PIPE = 141


def output_full() -> bool:
    """Whether standard output is what ran out of space: a device such as /dev/full, or a
    file on a disk with next to nothing left (not the cache's disk, which gets its own
    message)."""
    try:
        info = os.fstat(sys.stdout.fileno())
        if stat.S_ISCHR(info.st_mode):
            return not os.isatty(sys.stdout.fileno())
        room = os.fstatvfs(sys.stdout.fileno())
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(info.st_mode) and room.f_bavail * room.f_frsize < 1 << 20


def config_file_error(kind: type[BaseException], exc: BaseException,
                      trace: TracebackType | None) -> None:
    """sys.excepthook for tasks.py: invoke reads invoke.yaml (and `-f FILE`) after importing
    the tasks and before any task runs, outside the tasks' error boundary, so broken YAML there
    is one sentence naming the file and line (exit 1), not invoke's traceback."""
    if isinstance(exc, YAMLError):
        mark = getattr(exc, "problem_mark", None)
        where = f"{mark.name}, line {mark.line + 1}" if mark else "the invoke configuration"
        why = " ".join(str(getattr(exc, "problem", None) or exc).split())
        print(log.error_line(f"{where}: not valid YAML ({why}); fix the file."), file=sys.stderr)
        return
    sys.__excepthook__(kind, exc, trace)

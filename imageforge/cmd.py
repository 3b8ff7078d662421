"""The one place imageforge starts other programs: argv lists, never shell strings.

Every command is echoed as `+ argv` at debug level (`IMAGEFORGE_LOG=debug`, URLs redacted),
and a missing program (or, when the caller says how to word it, a command that ran out of
time) raises the caller's error type with one sentence instead of FileNotFoundError."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from imageforge import log
from imageforge.errors import DockerError, FatalError

ErrorType = Callable[[str], Exception]


def docker_binary() -> str:
    path = shutil.which("docker")
    if path is None:
        raise DockerError("docker is not installed; run `scripts/setup-host.sh` (Debian) or "
                          "install Docker with buildx, then retry.")
    return path


def echo(args: Sequence[str]) -> None:
    from imageforge.textsafe import redact

    log.debug("+ " + shlex.join(redact(a) if "://" in a else a for a in args))


def run(args: Sequence[str], *, timeout: float | None = 120, input: bytes | str | None = None,
        env: Mapping[str, str] | None = None, cwd: Path | None = None, text: bool = False,
        own_session: bool = False, error: ErrorType = FatalError, missing: str = "",
        timed_out: str | None = None) -> subprocess.CompletedProcess[Any]:
    """Run a command, capture its output, never raise on a non-zero exit. `env` adds to
    (not replaces) the environment: e.g. a private DOCKER_CONFIG with credentials. A missing
    program raises `error` naming it plus `missing` (what to install); running past
    `timeout` raises `error(timed_out)`, or TimeoutExpired for a caller that gives none."""
    argv = list(args)
    echo(argv)
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout, input=input,
                              check=False, env={**os.environ, **env} if env else None, cwd=cwd,
                              text=text, stdin=None if input is not None else subprocess.DEVNULL,
                              start_new_session=own_session)
    except FileNotFoundError:
        raise error(f"{Path(argv[0]).name} is not installed or not on PATH; "
                    f"{missing or 'install it and run again'}") from None
    except subprocess.TimeoutExpired:
        if timed_out is None:
            raise       # the caller handles it (e.g. a registry that may be down)
        raise error(timed_out) from None


def popen(args: Sequence[str], *, env: Mapping[str, str] | None = None,
          stdout: int | IO[bytes] | None = subprocess.DEVNULL,
          stderr: int | IO[bytes] | None = subprocess.PIPE, own_session: bool = False,
          error: ErrorType = FatalError, missing: str = "",
          stdin: int | IO[bytes] | None = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """Start a command whose output the caller streams (BuildKit's progress, a container's
    log), or whose input is another's output (a tar stream)."""
    argv = list(args)
    echo(argv)
    try:
        return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr,
                                env={**os.environ, **env} if env else None,
                                start_new_session=own_session)
    except FileNotFoundError:
        raise error(f"{Path(argv[0]).name} is not installed or not on PATH; "
                    f"{missing or 'install it and run again'}") from None


def docker(*args: str, timeout: float | None = 120,
           env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return run([docker_binary(), *args], timeout=timeout, env=env)

"""`imageforge build` with nothing to do, answered before invoke or the engine is imported.

A build whose every stage came from the artifact cache and whose image already carried every
label it would get (build._unchanged) reads the same files and asks Docker the same things
each time. `imageforge` (cli.py) watches which files a build reads, through a Python audit
hook installed before anything else is imported; a build that ends in that state records:

- every file it opened and every directory it listed, with its stat (size, mtime, inode),
  and each file it looked for that was not there;
- what the subprocesses it ran read: the checkout's git HEAD (the revision label) and the
  docker CLI's config (the engine it talks to);
- the image ID of the tag, of a local base image and of the target's artifact;
- the whole environment, the arguments and the working directory (the record's name).

The same command later is answered from the record, ninja-style, when every stat, every
image ID and the environment are unchanged: the same summary and a new report are written,
the entries' use is recorded, and no Python module of the engine, no docker CLI and no
BuildKit runs. Anything else, or any doubt, runs the full build: the record only ever
skips work, never decides an outcome.

Only the standard library is imported here: this runs on every `imageforge` start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from imageforge import cachedir, engineapi, jsonfile

VERSION = 1
# Variables a shell changes between identical commands; every other one is in the key.
_VOLATILE_ENV = frozenset({"_", "OLDPWD", "SHLVL", "PWD"})
# Never what a build is made of. (Temporary directories are: a manifest may live there.)
_NOT_INPUTS = ("/proc/", "/sys/", "/dev/")
# A target names the report file: a stage or image name, never a path.
_TARGET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class Watch:
    """Every path the process opens for reading and every directory it lists."""

    def __init__(self) -> None:
        self.opened: set[str] = set()
        self.listed: set[str] = set()

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int) or path is None:
                return
            if isinstance(mode, str) and any(c in mode for c in "wax+"):
                return
            if isinstance(flags, int) and flags & _WRITING:
                return
            self.opened.add(os.path.abspath(os.fsdecode(path)))
        elif event in ("os.listdir", "os.scandir"):
            path = args[0]
            if isinstance(path, int):
                return
            self.listed.add(os.path.abspath(os.fsdecode(path if path is not None else ".")))


WATCH: Watch | None = None


def start_watching() -> None:
    """Called first thing by `imageforge`: only a process watched from its start records."""
    global WATCH  # noqa: PLW0603 - one watch per process, installed once
    if WATCH is None:
        WATCH = Watch()
        sys.addaudithook(WATCH.hook)


def records_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "imageforge" / "uptodate"


def record_name(argv: Sequence[str]) -> str:
    env = sorted((k, v) for k, v in os.environ.items() if k not in _VOLATILE_ENV)
    data = [VERSION, list(argv), os.getcwd(), env, sys.executable, sys.stdout.isatty()]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()


def _stat(path: str) -> list[int] | None:
    try:
        info = os.stat(path)
    except (OSError, ValueError):   # ValueError: a NUL in a path read from a record
        return None
    return [info.st_size, info.st_mtime_ns, info.st_ino]


def _git_files(checkout: Path) -> list[str]:
    """What `git rev-parse HEAD` reads: HEAD, the branch it names, the packed refs."""
    git = checkout / ".git"
    files = [str(git / "HEAD"), str(git / "packed-refs")]
    with contextlib.suppress(OSError):
        head = (git / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            files.append(str(git / head[5:]))
    return files


def image_ids(refs: Iterable[str]) -> dict[str, str | None]:
    """Each image's ID from the engine's API (no docker CLI: it costs more than the rest of
    an up-to-date answer); None for one that is not there. Raises OSError when the engine
    cannot be asked this way."""
    return engineapi.image_ids(list(refs))


def remember(argv: Sequence[str], *, cache_dir: Path, checkout: Path, images: Sequence[str],
             entries: Sequence[Path], files: Sequence[Path], report: Mapping[str, Any],
             stdout: str) -> None:
    """Record this up-to-date build for the same command next time (see the module doc).
    Nothing is recorded for a process that was not watched from its start, or when the
    engine cannot be asked without the docker CLI."""
    if WATCH is None:
        return
    try:
        ids = image_ids(images)
    except (OSError, ValueError, KeyError):
        return
    if any(v is None for v in ids.values()):
        return
    skip = (str(cache_dir.resolve()) + "/", str(records_dir()) + "/", *_NOT_INPUTS)
    watched = [p for p in {*WATCH.opened, *_git_files(checkout), str(engineapi.docker_config())}
               if not p.startswith(skip)]
    # The cache's own files that matter (the target's blobs) are named by the build.
    watched += [str(f) for f in files]
    record = {
        "version": VERSION,
        "files": [[p, _stat(p)] for p in sorted(set(watched))],
        "dirs": [[p, _stat(p)] for p in sorted(WATCH.listed) if not p.startswith(skip)],
        "images": ids,
        "entries": [str(e) for e in entries],
        "cache_dir": str(cache_dir.resolve()),
        "report": {**report, "image_digest": ids[images[0]]},
        "stdout": stdout,
    }
    directory = records_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{record_name(argv)}.json"
    jsonfile.write_text(path, json.dumps(record))


def answer(argv: Sequence[str]) -> bool:
    """Answer `argv` from its record when nothing it depends on changed: True when it was
    answered (summary printed, report written), False to run the full build."""
    if argv[:1] != ["build"]:
        return False
    try:
        record = jsonfile.load(records_dir() / f"{record_name(argv)}.json")
    except (OSError, ValueError):
        return False
    try:
        if not _well_formed(record) or not _unchanged(record):
            return False
        save_report(Path(record["cache_dir"]), record["report"])
    except (OSError, ValueError, KeyError):
        # The engine could not be asked, or the cache cannot take the report: the full
        # build runs, and says so in its own words.
        return False
    for entry in record["entries"]:
        _touch(Path(entry) / "meta.json")
    print(record["stdout"])
    return True


def _well_formed(record: Any) -> bool:
    """Whether `record` has the shape `remember` writes: a record is a file like any other,
    and one that is not imageforge's answers nothing (the full build runs)."""
    def stats(value: Any) -> bool:
        return isinstance(value, list) and all(
            isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
            and (item[1] is None or (isinstance(item[1], list)
                                     and all(type(n) is int for n in item[1])))
            for item in value)

    return (isinstance(record, dict) and record.get("version") == VERSION
            and stats(record.get("files")) and stats(record.get("dirs"))
            and isinstance(record.get("images"), dict)
            and all(isinstance(k, str) and isinstance(v, str)
                    for k, v in record["images"].items())
            and isinstance(record.get("entries"), list)
            and all(isinstance(e, str) and os.path.isabs(e) for e in record["entries"])
            and isinstance(record.get("cache_dir"), str)
            and os.path.isabs(record["cache_dir"])
            and isinstance(record.get("report"), dict)
            and isinstance(record["report"].get("target"), str)
            and _TARGET.fullmatch(record["report"]["target"]) is not None
            and isinstance(record.get("stdout"), str)
            and record["stdout"].replace("\n", "").isprintable())


def _unchanged(record: Mapping[str, Any]) -> bool:
    for path, stat in (*record["files"], *record["dirs"]):
        if _stat(path) != stat:
            return False
    # The report goes to the cache directory: one that holds no artifact store is not the
    # one this build used.
    if not Path(record["cache_dir"], "artifacts").is_dir():
        return False
    if not all(Path(e, "meta.json").is_file() for e in record["entries"]):
        return False
    wanted: dict[str, str | None] = record["images"]
    return image_ids(wanted) == wanted


def save_report(cache_dir: Path, report: Mapping[str, Any]) -> Path:
    """cache/reports/<timestamp>-<target>.json, written whole (a rename); the one writer of
    build reports, here because this module may import nothing of the engine."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    reports = cachedir.reports(cache_dir)
    reports.mkdir(parents=True, exist_ok=True)
    path = reports / f"{stamp}-{report['target']}.json"
    jsonfile.write_json(path, report)
    return path


def _touch(meta: Path) -> None:
    """As ArtifactStore.touch: one more use, now. An entry of another shape is left as it is:
    it is input, and the answer must not fail on it."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        data = json.loads(meta.read_text())
        data["last_used"] = time.time()
        data["hits"] = int(data.get("hits", 0)) + 1
        jsonfile.write_json(meta, data, sort_keys=True)

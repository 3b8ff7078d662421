"""What a test session starts that outlives a kill of the session, and how to remove it.

A session killed half-way (SIGKILL of pytest: a CI timeout, Ctrl-C twice) runs no fixture's
teardown: its second dockerd keeps running (in a session of its own), and its bridge, tagged
iptables rules, containerd namespaces, docker context and tmpfs mounts stay on the host.

So each of them is recorded here BEFORE it is made: one JSON file in `directory()` naming the
thing and its owner, the pytest process (an xdist worker) that made it, by pid and start
time (a pid alone may be reused by an unrelated process once the owner is gone). The owner
removes the record after its normal clean-up. `sweep()`, called when a session starts,
removes what the records of owners no longer alive name, and never touches the things of an
owner still running (another session, another xdist worker).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from bench.engine import forget_namespaces, mounts_under

# Overridable so that a test of the sweep works on records of its own and never sweeps (or
# is swept by) the sessions running beside it.
ENV = "IMAGEFORGE_TEST_LEFTOVERS"
DEFAULT_DIRECTORY = "/tmp/imageforge-test-leftovers"
# A dockerd with no containers stops in about a second; with containers it waits up to 15 s
# for them (its default shutdown timeout) before it exits.
TERM_GRACE_S = 30.0
KILL_GRACE_S = 10.0
COMMAND_TIMEOUT_S = 60.0


def directory() -> Path:
    """Read at each call: a child session gets its directory through the environment."""
    return Path(os.environ.get(ENV, DEFAULT_DIRECTORY))


# --- records -------------------------------------------------------------------------------


def register(kind: str, key: str, **details: str) -> None:
    """Record a thing about to be made (again: a record is rewritten in place)."""
    owner = os.getpid()
    record = {"kind": kind, "key": key, "owner": {"pid": owner, "start": start_time(owner)},
              **details}
    path = record_path(kind, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed: a sweep never reads half a record.
    partial = path.with_name(f".{path.name}.{owner}.partial")
    partial.write_text(json.dumps(record, indent=1))
    partial.replace(path)


def unregister(kind: str, key: str) -> None:
    """The thing is gone: its owner removed it."""
    record_path(kind, key).unlink(missing_ok=True)


def record_path(kind: str, key: str, where: Path | None = None) -> Path:
    """One file per thing; the key (a path, a name) is hashed into a plain file name."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return (where or directory()) / f"{kind}-{digest}.json"


def records(where: Path | None = None) -> list[Path]:
    return sorted((where or directory()).glob("*.json"))


# --- owners --------------------------------------------------------------------------------


def start_time(pid: int) -> int | None:
    """When the process started (field 22 of /proc/<pid>/stat, in clock ticks since boot);
    None when there is no such process or only its zombie is left."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after it are
    # counted from its last ")". Field 3 is the state, field 22 the start time.
    fields = stat.rpartition(")")[2].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def alive(owner: dict[str, Any]) -> bool:
    """The very process that made the record still runs (not a later one with its pid)."""
    start = start_time(int(owner["pid"]))
    return start is not None and start == owner["start"]


# --- the sweep -----------------------------------------------------------------------------


def sweep(where: Path | None = None) -> list[str]:
    """Remove what the records of owners no longer alive name, and those records; returns
    the keys of what it swept. Safe beside other sessions sweeping at the same time (a
    record is swept by whoever locks it first) and again after a sweep (what is already gone
    is skipped). Never raises for a thing already gone."""
    swept: list[str] = []
    for path in records(where):
        with claimed(path) as record:
            if record is None or alive(record["owner"]):
                continue
            remove(record)
            path.unlink(missing_ok=True)
            swept.append(str(record["key"]))
    return swept


@contextlib.contextmanager
def claimed(path: Path) -> Iterator[dict[str, Any] | None]:
    """The record, locked for this sweep alone; None when another sweep holds it, has just
    removed it, or it is not a record of ours."""
    try:
        handle = path.open()
    except FileNotFoundError:
        yield None
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield read(handle) if still_there(handle, path) else None


def still_there(handle: IO[str], path: Path) -> bool:
    """The locked file is still the record at `path`: a sweep that locked it first may have
    removed it between our open and our lock."""
    try:
        return os.fstat(handle.fileno()).st_ino == path.stat().st_ino
    except FileNotFoundError:
        return False


def read(handle: IO[str]) -> dict[str, Any] | None:
    """The record, or None for a file register() did not write (it renames whole records
    into place): a damaged or foreign file is left alone rather than make the sweep fail."""
    try:
        record = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if well_formed(record) else None


def well_formed(record: Any) -> bool:
    """A dict of a kind the sweep removes, with its owner and the fields its remover reads."""
    if not isinstance(record, dict) or record.get("kind") not in FIELDS:
        return False
    owner = record.get("owner")
    return (isinstance(owner, dict) and isinstance(owner.get("pid"), int)
            and all(isinstance(record.get(f), str) for f in ("key", *FIELDS[record["kind"]])))


def remove(record: dict[str, Any]) -> None:
    REMOVERS[record["kind"]](record)


def remove_dockerd(record: dict[str, Any]) -> None:
    """Stop the engine, then what it leaves: the mounts under its root (of its data-root and
    of build steps; deepest first, lazily, as a mount may still be busy), its bridge, its
    tagged iptables rules and its containerd namespaces (about 1 GB with its base image)."""
    root, name = Path(record["root"]), str(record["name"])
    for pid in dockerd_pids(str(record["socket"]), Path(record["pidfile"])):
        stop_process(pid)
    for target in sorted(mounts_under(root), reverse=True):
        run("umount", "-l", target)
    run("ip", "link", "del", str(record["bridge"]))
    for table, chain, spec in tagged_rules(name):
        run("iptables", "-t", table, "-D", chain, *spec)
    remove_tasks(name)
    with contextlib.suppress(OSError):  # no ctr: no containerd, so no namespaces either
        forget_namespaces(name)


def remove_context(record: dict[str, Any]) -> None:
    run("docker", "context", "rm", "-f", str(record["name"]))


def remove_mount(record: dict[str, Any]) -> None:
    target = str(record["path"])
    for inner in [*sorted(mounts_under(Path(target)), reverse=True), target]:
        if inner in mounted():
            run("umount", "-l", inner)


REMOVERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "dockerd": remove_dockerd, "context": remove_context, "mount": remove_mount}
# What each remover reads from its record (given to register() as details).
FIELDS: dict[str, tuple[str, ...]] = {
    "dockerd": ("name", "root", "socket", "pidfile", "bridge"), "context": ("name",),
    "mount": ("path",)}


# --- the things ----------------------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (as mount's size= option takes it: "2m") mounted at `mount` while
    the block runs; a session killed inside it leaves a record for the next sweep."""
    mount.mkdir(parents=True, exist_ok=True)
    register("mount", str(mount), path=str(mount))
    try:
        # Not captured: should mount fail, its reason shows in the test's output.
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                       check=True)
        yield mount
    finally:
        run("umount", "-l", str(mount))
        unregister("mount", str(mount))


def dockerd_pids(socket: str, pidfile: Path) -> list[int]:
    """The dockerd serving `socket`: the pid its pidfile names if that process really is it
    (the pid may since have gone to another process), else any found in /proc."""
    host = f"unix://{socket}"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text().strip())
        if serves(pid, host):
            return [pid]
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and serves(int(p.name), host)]


def serves(pid: int, host: str) -> bool:
    """Process `pid` is a dockerd started with `--host <host>`."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return (Path(argv[0]).name == "dockerd"
            and (f"--host={host}" in argv or given(argv, "--host", host)))


def stop_process(pid: int) -> None:
    """SIGTERM (dockerd stops its containers and unmounts), then SIGKILL if it hangs."""
    start = start_time(pid)
    for signum, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        if start is None or start_time(pid) != start:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        deadline = time.monotonic() + grace
        while start_time(pid) == start and time.monotonic() < deadline:
            time.sleep(0.1)


def remove_tasks(namespace: str) -> None:
    """Containers still running in containerd (an engine killed with SIGKILL stops none):
    `ctr containers rm` refuses a container whose task runs."""
    for task in run("ctr", "-n", namespace, "tasks", "ls", "-q").split():
        run("ctr", "-n", namespace, "tasks", "rm", "-f", task)


def tagged_rules(tag: str) -> list[tuple[str, str, list[str]]]:
    """(table, chain, rule) of each iptables rule carrying the comment `tag`, as
    iptables-save prints them (`-A CHAIN <rule>`): `iptables -t table -D chain <rule>`
    deletes one."""
    found: list[tuple[str, str, list[str]]] = []
    table = ""
    for line in run("iptables-save").splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
            continue
        if not line.startswith("-A "):
            continue
        words = shlex.split(line)
        if given(words, "--comment", tag):
            found.append((table, words[1], words[2:]))
    return found


def given(words: list[str], option: str, value: str) -> bool:
    """`option value` appears in `words` (a command line, a rule) as two words."""
    return any(a == option and b == value for a, b in itertools.pairwise(words))


def mounted() -> set[str]:
    with open("/proc/self/mounts") as table:
        return {line.split()[1].encode().decode("unicode_escape") for line in table}


def run(*command: str) -> str:
    """Run a clean-up command; its stdout, or "" when it failed, as it does for what is
    already gone (or for a tool this host lacks)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""

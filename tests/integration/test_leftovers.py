"""A test session killed half-way leaves its second engine behind (process, bridge, iptables
rules, containerd namespaces, docker context) and its tmpfs mounts; the next session's start
removes them, and a sweep beside a session still running removes nothing of it.

Real pytest sessions of their own (child processes, with the suite's SecondDockerd and
second_builder, and a record directory of their own, so the sessions running beside these
tests neither sweep nor are swept by them) make the things and hold them until told to end
or killed."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.engine import mounts_under
from tests import leftovers
from tests.integration.conftest import process_table

ROOT = Path(__file__).resolve().parents[2]

CHILD_CONFTEST = '''
from collections.abc import Iterator

import pytest

from tests.integration.conftest import (  # noqa: F401 (fixtures)
    SecondDockerd,
    leftovers_swept,
    second_builder,
)


@pytest.fixture(scope="session")
def second_dockerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecondDockerd]:
    """The suite's second engine without its base image: nothing here builds."""
    engine = SecondDockerd(tmp_path_factory.mktemp("dockerd2"))
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()
'''

CHILD_TEST = '''
import io
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

from tests import leftovers
from tests.integration.conftest import SecondDockerd

SIGNALS = Path("{signals}")


def import_one_file(engine: SecondDockerd) -> None:
    """An image of one small file in the engine: that makes its namespace in containerd (an
    engine without images has none), without the suite's base image to copy in."""
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as archive:
        archive.addfile(tarfile.TarInfo("empty"), io.BytesIO())
    subprocess.run(["docker", "import", "-", "imageforge-test/leftovers:one-file"],
                   input=tar.getvalue(), env={{**os.environ, **engine.env}},
                   capture_output=True, check=True)


def test_holds_an_engine_and_a_mount(second_dockerd: SecondDockerd, second_builder: str,
                                     tmp_path: Path) -> None:
    import_one_file(second_dockerd)
    with leftovers.tmpfs(tmp_path / "disk", "1m") as disk:
        made = {{"name": second_dockerd.name, "socket": str(second_dockerd.socket),
                 "bridge": second_dockerd.bridge, "context": second_builder,
                 "mount": str(disk)}}
        (SIGNALS / "ready.partial").write_text(json.dumps(made))
        (SIGNALS / "ready.partial").rename(SIGNALS / "ready")
        deadline = time.monotonic() + 300
        while not (SIGNALS / "release").exists():
            assert time.monotonic() < deadline, "never released"
            time.sleep(0.1)
'''

# A session that only starts: its autouse fixture sweeps.
NEXT_SESSION_TEST = '''
def test_nothing() -> None:
    pass
'''


class ChildSession:
    """A child pytest session in a process group of its own, holding a second engine, its
    docker context and a tmpfs mount until released (or killed)."""

    def __init__(self, where: Path, base: Path) -> None:
        self.records = where / "records"
        self.signals = where / "signals"
        self.signals.mkdir(parents=True)
        tests = where / "session"
        tests.mkdir()
        (tests / "conftest.py").write_text(CHILD_CONFTEST)
        (tests / "test_child.py").write_text(CHILD_TEST.format(signals=self.signals))
        self.log = where / "log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                pytest_command(base, tests), cwd=ROOT, env=child_env(self.records),
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def ready(self, timeout: float = 180) -> dict[str, str]:
        """What the child made, once it holds all of it."""
        deadline = time.monotonic() + timeout
        while not (self.signals / "ready").exists():
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.output}"
            assert time.monotonic() < deadline, f"not ready after {timeout} s:\n{self.output}"
            time.sleep(0.1)
        made: dict[str, str] = json.loads((self.signals / "ready").read_text())
        return made

    def release(self, timeout: float = 180) -> int:
        """Let the test end: the session cleans up as it normally does."""
        (self.signals / "release").touch()
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the whole process group, as a CI timeout does; the engine, in a session of
        its own, survives it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)

    @property
    def output(self) -> str:
        return self.log.read_text()


def pytest_command(base: Path, tests: Path) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
            str(base), str(tests)]


def child_env(records: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), leftovers.ENV: str(records)}


def next_session(where: Path, records: Path) -> None:
    """A new session started with the same records: its start sweeps them."""
    tests = where / "next"
    tests.mkdir()
    (tests / "conftest.py").write_text(
        "from tests.integration.conftest import leftovers_swept  # noqa: F401\n")
    (tests / "test_next.py").write_text(NEXT_SESSION_TEST)
    done = subprocess.run(pytest_command(where / "next-base", tests), cwd=ROOT,
                          env=child_env(records), capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def child(tmp_path: Path) -> Iterator[ChildSession]:
    """The child session; whatever a failed test left of it is killed and swept, so no run
    of these tests leaves an engine or a mount on the host.

    Its basetemp is short: the engine's sockets lie under it, and a unix socket's path has
    at most 107 bytes (under this test's tmp_path, libnetwork's did not fit)."""
    base = Path(tempfile.mkdtemp(prefix="iflo-"))
    session = ChildSession(tmp_path, base)
    try:
        yield session
    finally:
        session.kill()
        leftovers.sweep(session.records)
        if not mounts_under(base):  # never delete through a mount left by a failed sweep
            shutil.rmtree(base, ignore_errors=True)


# --- what is left on the host, seen with the host's own tools ----------------------------


def dockerd_runs(socket: str) -> bool:
    """A dockerd (not its zombie: a zombie's command line is empty) serves `socket`."""
    return any(argv and Path(argv[0]).name == "dockerd" and f"unix://{socket}" in argv
               for _, argv in process_table().values())


def bridge_exists(bridge: str) -> bool:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           check=True).stdout
    return f": {bridge}:" in links or f": {bridge}@" in links


def tagged_rules(name: str) -> int:
    saved = subprocess.run(["iptables-save"], capture_output=True, text=True,
                           check=True).stdout
    return len(re.findall(rf'--comment "?{re.escape(name)}"?(?:\s|$)', saved, re.MULTILINE))


def namespaces(name: str) -> list[str]:
    listed = subprocess.run(["ctr", "namespaces", "ls", "-q"], capture_output=True,
                            text=True, check=True).stdout.split()
    return sorted(n for n in listed if n.startswith(name))


def context_exists(context: str) -> bool:
    listed = subprocess.run(["docker", "context", "ls", "--format", "{{.Name}}"],
                            capture_output=True, text=True, check=True).stdout.split()
    return context in listed


def mounted(path: str) -> bool:
    return path in leftovers.mounted()


def left_on_host(made: dict[str, str]) -> dict[str, Any]:
    return {"dockerd": dockerd_runs(made["socket"]), "bridge": bridge_exists(made["bridge"]),
            "rules": tagged_rules(made["name"]), "namespaces": namespaces(made["name"]),
            "context": context_exists(made["context"]), "mount": mounted(made["mount"])}


def all_of(made: dict[str, str]) -> dict[str, Any]:
    """Everything the child makes: its engine's three rules (masquerade, forward in and
    out) and the namespace of its images (the one a session's base image fills)."""
    return {"dockerd": True, "bridge": True, "rules": 3, "namespaces": [made["name"]],
            "context": True, "mount": True}


NOTHING = {"dockerd": False, "bridge": False, "rules": 0, "namespaces": [], "context": False,
           "mount": False}


@pytest.mark.usefixtures("docker_ready")
def test_a_killed_sessions_leftovers_are_removed_when_the_next_session_starts(
        child: ChildSession, tmp_path: Path) -> None:
    made = child.ready()
    child.kill()
    assert left_on_host(made) == all_of(made)
    assert len(leftovers.records(child.records)) == 3  # engine, context, mount
    next_session(tmp_path, child.records)
    assert left_on_host(made) == NOTHING
    assert leftovers.records(child.records) == []


@pytest.mark.usefixtures("docker_ready")
def test_a_sweep_beside_a_running_session_leaves_its_things_alone(
        child: ChildSession) -> None:
    made = child.ready()
    assert leftovers.sweep(child.records) == []
    assert left_on_host(made) == all_of(made)
    assert len(leftovers.records(child.records)) == 3
    # Its normal end removes its things and its records.
    assert child.release() == 0, child.output
    assert left_on_host(made) == NOTHING
    assert leftovers.records(child.records) == []


def test_a_record_whose_pid_another_process_took_is_swept_and_sweeps_repeat_harmlessly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner's pid alone is not enough: once the owner is gone, its pid may go to an
    unrelated process (here, this one) that must not keep the owner's things."""
    records = tmp_path / "records"
    monkeypatch.setenv(leftovers.ENV, str(records))
    with leftovers.tmpfs(tmp_path / "disk", "1m") as disk:
        (path,) = leftovers.records(records)
        record = json.loads(path.read_text())
        record["owner"]["start"] -= 1  # the same pid, started at another time
        path.write_text(json.dumps(record))
        assert leftovers.sweep(records) == [str(disk)]
        assert not mounted(str(disk))
        assert leftovers.sweep(records) == []
    assert leftovers.records(records) == []

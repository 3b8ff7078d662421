"""Real Docker + BuildKit, a real sample upstream served on 127.0.0.1.

Under CI=true a missing Docker daemon fails these tests; elsewhere they are skipped with
the reason, so unit work stays possible on a laptop without Docker.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import requests

from bench.engine import forget_namespaces, mounts_under
from tests import leftovers
from tests.engine_cleanup import engine_left_as_found  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_PORT = "127.0.0.1:8741"


def docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "docker is not installed"
    info = subprocess.run(["docker", "info"], capture_output=True, check=False)
    if info.returncode != 0:
        return "the Docker daemon is not running"
    if subprocess.run(["docker", "buildx", "version"], capture_output=True,
                      check=False).returncode != 0:
        return "docker buildx is missing"
    if subprocess.run(["docker", "image", "inspect", "imageforge/base:bookworm"],
                      capture_output=True, check=False).returncode != 0:
        return "the base image imageforge/base:bookworm is missing (make docker)"
    return None


@pytest.fixture(scope="session")
def docker_ready() -> None:
    problem = docker_problem()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"Docker tests need Docker under CI: {problem}; run `make docker`.")
    pytest.skip(f"{problem} (set CI=true to make this a failure)")


@pytest.fixture(scope="session")
def upstream(tmp_path_factory: pytest.TempPathFactory, docker_ready: None) -> Iterator[str]:
    """The sample upstream, generated and served; yields its base URL."""
    del docker_ready  # requested for its Docker check only (usefixtures is for tests)
    out = tmp_path_factory.mktemp("upstream")
    subprocess.run([sys.executable, "-m", "sample", "generate", "--out", str(out)], check=True,
                   cwd=ROOT)
    with served(out) as url:
        yield url


@contextlib.contextmanager
def served(root: Path) -> Iterator[str]:
    """`root` (its files/ and git/) served on 127.0.0.1 while the block runs; its base URL."""
    from sample.serve import start_server

    server = start_server(root)
    try:
        yield server.url.rstrip("/")
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sample_manifest(tmp_path_factory: pytest.TempPathFactory, upstream: str) -> Path:
    """manifests/sample.toml pointing at this session's server, locked (with a cache of the
    lock's own, so no module's cache starts with its sources). Shared read-only: a test that
    edits the manifest or its lock works on a copy."""
    text = (ROOT / "manifests/sample.toml").read_text()
    path = tmp_path_factory.mktemp("manifests") / "sample.toml"
    path.write_text(text.replace(f"http://{SAMPLE_PORT}", upstream))
    result = invoke("lock", "--manifest", str(path), cache=tmp_path_factory.mktemp("lock-cache"))
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture
def sample_manifest_copy(sample_manifest: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of the shared sample manifest and its lock, since the nightly's `lock --upgrade`
    rewrites the lock beside the manifest it is given."""
    lock = sample_manifest.with_name("sample.lock.json")
    shared = (sample_manifest.read_bytes(), lock.read_bytes())
    copy = tmp_path / "manifest" / sample_manifest.name
    copy.parent.mkdir()
    shutil.copy(sample_manifest, copy)
    shutil.copy(lock, copy.with_name(lock.name))
    yield copy
    # The session's manifest and lock, which other modules read, are as they were.
    assert (sample_manifest.read_bytes(), lock.read_bytes()) == shared


@pytest.fixture(scope="module")
def cache_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An imageforge cache (sources, artifacts, reports, test records) of this module's own:
    no module passes or fails because of what another module's builds left there, and the
    modules pass in any order or alone. Within a module the tests share it on purpose (the
    module-scoped images of test_build and test_checks are built once into it).

    What stays shared across modules: BuildKit's layer cache in the host engine's builder
    (content-addressed: a step's cache key is the hash of its inputs, so a hit gives the very
    bytes a rebuild would; it only makes builds faster, never different), the sample upstream
    and registry (tests push under names of their own), and the second engine (test_faults
    prunes its build cache itself before each test that needs BuildKit to really work)."""
    return tmp_path_factory.mktemp("cache-" + request.module.__name__.rpartition(".")[2])


def invoke(*args: str, cache: Path | None = None, env: dict[str, str] | None = None,
           timeout: float = 900) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    if cache is not None:
        full_env["INVOKE_IMAGEFORGE_CACHE_DIR"] = str(cache)
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], cwd=ROOT,
                          capture_output=True, text=True, env=full_env, check=False,
                          timeout=timeout)


class Running:
    """An `invoke` command running in its own process group, its stderr read as it comes
    (so a test can act when a line appears)."""

    def __init__(self, *args: str, cache: Path, env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, "PYTHONPATH": str(ROOT),
                    "INVOKE_IMAGEFORGE_CACHE_DIR": str(cache), **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "invoke", "-r", str(ROOT), *args],
                                     cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: list[str] = []
        self.out: list[str] = []
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        self._readers = [threading.Thread(target=self._read, args=(pipe, into), daemon=True)
                         for pipe, into in ((self.proc.stderr, self.lines),
                                            (self.proc.stdout, self.out))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(pipe: IO[str], into: list[str]) -> None:
        for line in pipe:
            into.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        """Until a line of stderr matches the regular expression `pattern`."""
        deadline = time.monotonic() + timeout
        while not any(re.search(pattern, line) for line in self.lines):
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.stderr}"
            assert time.monotonic() < deadline, f"no {pattern!r} in:\n{self.stderr}"
            time.sleep(0.02)

    def wait_until(self, check: Callable[[], bool], what: str, timeout: float = 120,
                   poll: float = 0.02) -> None:
        """Until `check()` holds (an event outside this process: a file, a process of the
        build); `timeout` is only a safety net."""
        deadline = time.monotonic() + timeout
        while not check():
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {what}:\n" \
                                             f"{self.stderr}"
            assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{self.stderr}"
            time.sleep(poll)

    def signal(self, signum: int, *, group: bool = False) -> None:
        """`group`: the whole process group, as Ctrl-C in a terminal does."""
        if group:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)

    def finish(self, timeout: float = 120) -> int:
        """Wait (bounded) for the exit code; the process group is killed if it hangs."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"still running after {timeout} s:\n{self.stderr}") from None
        for reader in self._readers:
            reader.join(timeout=10)
        return code

    @property
    def last_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""


def process_table() -> dict[int, tuple[int, list[str]]]:
    """Every process of this host (build steps of every engine included): pid -> (parent
    pid, argument vector)."""
    table: dict[int, tuple[int, list[str]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone meanwhile
        table[int(entry.name)] = (int(stat.rpartition(")")[2].split()[1]), argv[:-1])
    return table


def process_with(token: str) -> bool:
    """Some process (a build step too) has `token` in its command line: give the step a
    token of the test's own (a flag, a path) to know it really runs."""
    return any(token in arg for _, argv in process_table().values() for arg in argv)


def assert_engine_clean(engine: SecondDockerd, builders: list[str]) -> None:
    """No build step still running, no container, no builder beyond those there before."""
    deadline = time.monotonic() + 20
    while engine.executor_processes():
        assert time.monotonic() < deadline, f"build steps still run: {engine.executor_processes()}"
        time.sleep(0.2)
    assert engine.docker("ps", "-aq").stdout.split() == []
    assert engine.builders() == builders


def docker_out(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True,
                          check=True).stdout.strip()


CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def derive(context: Path, tag: str, dockerfile: str) -> str:
    """`tag`, built by the engine's own builder from `dockerfile` (the host's CA bundle
    as the ca-bundle secret, for steps that reach PyPI)."""
    # dedent, not a strip of every line: a heredoc's script keeps its indentation.
    text = textwrap.dedent(dockerfile).strip() + "\n"
    result = subprocess.run(["docker", "build", "--quiet", "--tag", tag, "--file", "-",
                             "--secret", f"id=ca-bundle,src={CA_BUNDLE}", str(context)],
                            input=text, text=True, capture_output=True, check=False,
                            timeout=1800)
    assert result.returncode == 0, result.stderr[-4000:]
    return tag


def untag_run(run: str) -> None:
    """Untag every imageforge-test/ image whose tag ends with `run` (a module's own; the
    layers stay in BuildKit's cache)."""
    tags = docker_out("image", "ls", "--format", "{{.Repository}}:{{.Tag}}").splitlines()
    ours = [t for t in tags if t.startswith("imageforge-test/") and t.endswith(run)]
    if ours:
        subprocess.run(["docker", "image", "rm", "--force", *ours], capture_output=True,
                       check=False)


def untagging(run: str) -> Callable[[], Iterator[None]]:
    """A module's autouse fixture (`remove_tags = untagging(RUN)`) that untags its images
    once the module is done."""
    @pytest.fixture(scope="module", autouse=True)
    def remove_tags() -> Iterator[None]:
        yield
        untag_run(run)
    return remove_tags


# The test registry's password: chosen per session, handed to compose through the
# environment, and searched for in outputs by the secret tests.
REGISTRY_USER = "imageforge"
REGISTRY_PASSWORD = os.environ.setdefault("IMAGEFORGE_TEST_REGISTRY_PASSWORD",
                                          "pw-" + secrets.token_hex(12))


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    return str(Path(__file__).parent / "docker-compose.yml")


@pytest.fixture(scope="session")
def docker_compose_project_name() -> str:
    return f"imageforge-test-{os.getpid()}"


@pytest.fixture(scope="session")
def registry(docker_ready: None, docker_services: Any) -> str:
    """A real registry (distribution, htpasswd auth) on 127.0.0.1; returns host:port."""
    del docker_ready  # requested for its Docker check only (usefixtures is for tests)
    port = docker_services.port_for("registry", 5000)
    url = f"http://127.0.0.1:{port}/v2/"

    def up() -> bool:
        try:
            # 401 is "up": the registry answers and wants credentials.
            return requests.get(url, timeout=2).status_code in (200, 401)
        except requests.RequestException:
            return False

    docker_services.wait_until_responsive(check=up, timeout=60, pause=0.5)
    return f"127.0.0.1:{port}"


def registry_env() -> dict[str, str]:
    return {"IMAGEFORGE_REGISTRY_USER": REGISTRY_USER,
            "IMAGEFORGE_REGISTRY_PASSWORD": REGISTRY_PASSWORD}


@pytest.fixture(scope="session", autouse=True)
def leftovers_swept() -> None:
    """What sessions killed half-way left (their second engines, tmpfs mounts), removed
    before this session makes its own. Beside another session or xdist worker this removes
    nothing of theirs: only the things of owners no longer alive are swept."""
    leftovers.sweep()


class SecondDockerd:
    """A second Docker engine on its own socket, data-root, exec-root and bridge (sharing
    this host's containerd under its own namespace), with the base image. Tests may stop it
    (`kill`) and start it again (`start`); nobody else uses it, so its containers,
    builders and build cache are the tests' alone. The host's own daemon is never touched.

    It outlives a session killed half-way (it runs in a session of its own), and so do its
    bridge, rules, namespaces and mounts: `start` records it in tests/leftovers.py first,
    `stop` removes the record, and the next session's sweep removes a dead session's."""

    def __init__(self, root: Path) -> None:
        run = uuid.uuid4().hex[:8]
        self.root = root
        self.name = f"imageforge-second-{run}"
        self.socket = root / "docker.sock"
        # Its own bridge: an engine started with `--bridge none` deletes the first one's
        # docker0.
        self.bridge = f"ifbr{run}"
        self.subnet = f"10.213.{int(run[:2], 16)}.1/24"
        self.process: subprocess.Popen[bytes] | None = None
        (root / "daemon.json").write_text('{"features": {"containerd-snapshotter": true}}')
        self.rules: list[list[str]] = []

    @property
    def env(self) -> dict[str, str]:
        """What makes docker (and imageforge) talk to this engine."""
        return {"DOCKER_HOST": f"unix://{self.socket}"}

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", *args], env={**os.environ, **self.env},
                              capture_output=True, text=True, check=check, timeout=120)

    def answers(self) -> bool:
        return self.docker("info", check=False).returncode == 0

    def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        self.register()
        if not Path(f"/sys/class/net/{self.bridge}").exists():
            for command in (["ip", "link", "add", "name", self.bridge, "type", "bridge"],
                            ["ip", "addr", "add", self.subnet, "dev", self.bridge],
                            ["ip", "link", "set", self.bridge, "up"]):
                subprocess.run(command, check=True, capture_output=True)
        if not self.rules:
            self.route_out()
        log = (self.root / "log").open("a")
        self.process = subprocess.Popen(
            ["dockerd", "--host", f"unix://{self.socket}", "--data-root",
             str(self.root / "data"), "--exec-root", str(self.root / "exec"),
             "--pidfile", str(self.root / "docker.pid"),
             "--config-file", str(self.root / "daemon.json"),
             "--containerd", "/run/containerd/containerd.sock",
             "--containerd-namespace", self.name,
             "--containerd-plugins-namespace", f"{self.name}-plugins",
             "--bridge", self.bridge, "--iptables=false", "--ip6tables=false"],
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while not self.answers():
            assert self.process.poll() is None, (self.root / "log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the second dockerd did not start"
            time.sleep(0.3)

    def register(self) -> None:
        """Recorded before anything is made: a kill right after the bridge appears still
        leaves a record naming it. The sweep finds the engine's rules by their tag and its
        process by its pidfile or socket, so the record needs no update afterwards."""
        leftovers.register("dockerd", self.name, name=self.name, root=str(self.root),
                           socket=str(self.socket), pidfile=str(self.root / "docker.pid"),
                           bridge=self.bridge)

    def route_out(self) -> None:
        """NAT for its bridge, as the host engine has for docker0 (this one runs with
        --iptables=false so that it never rewrites the host's chains): its build steps reach
        Debian's mirror and PyPI like any CI runner's. Only these rules, tagged with its name,
        are added, and `stop` deletes them (or, after a kill, the next session's sweep, which
        finds them by the tag)."""
        self.register()
        network = self.subnet.rsplit(".", 1)[0] + ".0/24"
        tag = ["-m", "comment", "--comment", self.name]
        for table, chain, rule in (
                ("nat", "POSTROUTING", ["-s", network, "!", "-o", self.bridge,
                                        "-j", "MASQUERADE"]),
                ("filter", "FORWARD", ["-i", self.bridge, "-j", "ACCEPT"]),
                ("filter", "FORWARD", ["-o", self.bridge, "-m", "conntrack", "--ctstate",
                                       "RELATED,ESTABLISHED", "-j", "ACCEPT"])):
            subprocess.run(["iptables", "-t", table, "-I", chain, *rule, *tag], check=True,
                           capture_output=True)
            self.rules.append(["iptables", "-t", table, "-D", chain, *rule, *tag])

    def kill(self, signum: int = signal.SIGKILL) -> None:
        """Stop the engine like a crash (SIGKILL) or `systemctl stop` (SIGTERM)."""
        assert self.process is not None
        self.process.send_signal(signum)
        self.process.wait(timeout=60)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill(signal.SIGTERM)
        # An engine stopped mid-build leaves its build steps' mounts behind; so does the
        # data-root's own mount.
        for target in sorted(self.mounts(), reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        for rule in self.rules:
            subprocess.run(rule, capture_output=True, check=False)
        self.rules = []
        self.forget()
        leftovers.unregister("dockerd", self.name)

    def forget(self) -> None:
        """Empty and remove this engine's namespaces in the host's containerd: its unpacked
        base image alone is about 1 GB that would otherwise stay after every session."""
        forget_namespaces(self.name)

    def mounts(self) -> list[str]:
        """Mount points under this engine's directories."""
        return mounts_under(self.root)

    def step_mounts(self) -> list[str]:
        """Root file systems of build steps, mounted while a step runs."""
        return [t for t in self.mounts() if "/buildkit/executor/" in t]

    def builders(self) -> list[str]:
        return sorted(self.docker("buildx", "ls", "--format", "{{.Name}}").stdout.split())

    def step_commands(self) -> list[list[str]]:
        """The argument vectors of the processes this engine's build steps run now: every
        process with an ancestor of this engine's (its dockerd and the runc it starts, or a
        containerd shim in its namespace), never one of the host engine's builds."""
        table = process_table()
        marks = (str(self.root), self.name)

        def ours(pid: int) -> bool:
            parent, hops = table[pid][0], 0
            while parent in table and parent > 1 and hops < 64:
                if any(mark in arg for arg in table[parent][1] for mark in marks):
                    return True
                parent, hops = table[parent][0], hops + 1
            return False

        return [argv for pid, (_, argv) in table.items() if argv and ours(pid)]

    def runs(self, program: str, *args: str) -> bool:
        """A build step of this engine runs `program` (its basename) with all of `args`."""
        return any(Path(argv[0]).name == program and all(a in argv[1:] for a in args)
                   for argv in self.step_commands())

    def executor_processes(self) -> list[str]:
        """Build steps (runc) this engine's BuildKit still runs."""
        found = subprocess.run(["pgrep", "-af", str(self.root / "data" / "buildkit")],
                               capture_output=True, text=True, check=False).stdout
        return [line for line in found.splitlines() if "runc" in line]


@pytest.fixture(scope="session")
def second_dockerd(docker_ready: None, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[SecondDockerd]:
    """The second engine, started once per session with the base image loaded; every test
    gets it running (a test that stopped it has started it again)."""
    del docker_ready  # requested for its Docker check only (usefixtures is for tests)
    engine = SecondDockerd(tmp_path_factory.mktemp("dockerd2"))
    try:
        engine.start()
        save = subprocess.Popen(["docker", "save", "imageforge/base:bookworm"],
                                stdout=subprocess.PIPE)
        subprocess.run(["docker", "load"], stdin=save.stdout, env={**os.environ, **engine.env},
                       capture_output=True, check=True)
        save.wait()
        yield engine
    finally:
        engine.stop()


@pytest.fixture
def dockerd2(second_dockerd: SecondDockerd) -> SecondDockerd:
    second_dockerd.start()
    return second_dockerd


@pytest.fixture(scope="session")
def second_builder(second_dockerd: SecondDockerd) -> Iterator[str]:
    """The second engine as a docker context: the buildx builder of that name is its own.
    Recorded before it is made, as the context outlives a killed session too."""
    leftovers.register("context", second_dockerd.name, name=second_dockerd.name)
    try:
        subprocess.run(["docker", "context", "create", second_dockerd.name, "--docker",
                        f"host=unix://{second_dockerd.socket}"], capture_output=True,
                       check=True)
        second_dockerd.start()
        yield second_dockerd.name
    finally:
        subprocess.run(["docker", "context", "rm", "-f", second_dockerd.name],
                       capture_output=True, check=False)
        leftovers.unregister("context", second_dockerd.name)

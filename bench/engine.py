"""A Docker engine of the benchmark's own, so that pruning it for a cold start empties no
other project's BuildKit cache.

A second dockerd on its own socket, data-root, exec-root and bridge, sharing this host's
containerd under its own namespaces (as the integration tests' second engine does). Build
steps reach PyPI through the engine's bridge: dockerd runs with `--iptables=false` so it
never rewrites the host engine's chains, and the engine adds only its own three rules
(masquerade and forward for its subnet, each tagged with a comment naming it) and removes
them when it stops. Everything it made (containerd namespaces, bridge, mounts) goes with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO

from imageforge.errors import FatalError

START_TIMEOUT_S = 60


class EngineError(FatalError):
    """The benchmark's own Docker engine could not be started or prepared."""


class Engine:
    """`with Engine(dir) as engine:` a running dockerd; `engine.env` reaches it."""

    def __init__(self, root: Path, *, label: str = "imageforge-bench",
                 own_containerd: bool = False) -> None:
        run = uuid.uuid4().hex[:8]
        self.root = root
        # A containerd of its own: an engine that shares the host's containerd (in its own
        # namespaces) is handed any blob the host's engine holds by digest, without a byte
        # moving (containerd's shared content policy), which no runner that starts empty has.
        self.own_containerd = own_containerd
        self.containerd: subprocess.Popen[bytes] | None = None
        self.name = f"{label}-{run}"
        self.socket = root / "docker.sock"
        self.bridge = f"ifbb{run}"
        self.subnet = f"10.214.{int(run[:2], 16)}.0/24"
        self.process: subprocess.Popen[bytes] | None = None
        self.rules: list[list[str]] = []

    @property
    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": f"unix://{self.socket}"}

    def docker(self, *args: str, check: bool = True, timeout: float = 600
               ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["docker", *args], env={**os.environ, **self.env},
                              capture_output=True, text=True, check=False, timeout=timeout)
        if check and proc.returncode != 0:
            raise EngineError(f"docker {' '.join(args)} on the benchmark's engine failed: "
                              f"{proc.stderr.strip()[-500:]}")
        return proc

    def __enter__(self) -> Engine:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "daemon.json").write_text('{"features": {"containerd-snapshotter": true}}')
        gateway = self.subnet.replace(".0/24", ".1/24")
        for command in (["ip", "link", "add", "name", self.bridge, "type", "bridge"],
                        ["ip", "addr", "add", gateway, "dev", self.bridge],
                        ["ip", "link", "set", self.bridge, "up"]):
            _must(command)
        tag = ["-m", "comment", "--comment", self.name]
        for table, chain, rule in (
                ("nat", "POSTROUTING", ["-s", self.subnet, "!", "-o", self.bridge,
                                        "-j", "MASQUERADE"]),
                ("filter", "FORWARD", ["-i", self.bridge, "-j", "ACCEPT"]),
                ("filter", "FORWARD", ["-o", self.bridge, "-m", "conntrack", "--ctstate",
                                       "RELATED,ESTABLISHED", "-j", "ACCEPT"])):
            _must(["iptables", "-t", table, "-I", chain, *rule, *tag])
            self.rules.append(["iptables", "-t", table, "-D", chain, *rule, *tag])
        log = (self.root / "dockerd.log").open("a")
        containerd = self._start_containerd(log) if self.own_containerd \
            else "/run/containerd/containerd.sock"
        self.process = subprocess.Popen(
            ["dockerd", "--host", f"unix://{self.socket}", "--data-root",
             str(self.root / "data"), "--exec-root", str(self.root / "exec"),
             "--pidfile", str(self.root / "docker.pid"),
             "--config-file", str(self.root / "daemon.json"),
             "--containerd", containerd,
             "--containerd-namespace", self.name,
             "--containerd-plugins-namespace", f"{self.name}-plugins",
             "--bridge", self.bridge, "--iptables=false", "--ip6tables=false"],
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.docker("info", check=False, timeout=30).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "dockerd.log").read_text()[-1500:]
                raise EngineError(f"the benchmark's dockerd did not start:\n{tail}")
            time.sleep(0.3)

    def _start_containerd(self, log: IO[str]) -> str:
        """A containerd with its own root, state and socket; returns its socket."""
        base = self.root / "containerd"
        socket = base / "containerd.sock"
        config = self.root / "containerd.toml"
        config.write_text(f'version = 2\nroot = "{base}/root"\nstate = "{base}/state"\n'
                          'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
                          f'[grpc]\n  address = "{socket}"\n'
                          f'[ttrpc]\n  address = "{socket}.ttrpc"\n')
        self.containerd = subprocess.Popen(["containerd", "--config", str(config)],
                                           stdout=subprocess.DEVNULL, stderr=log,
                                           start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while subprocess.run(["ctr", "--address", str(socket), "version"], capture_output=True,
                             check=False).returncode != 0:
            if self.containerd.poll() is not None or time.monotonic() > deadline:
                raise EngineError("the benchmark's containerd did not start:\n"
                                  + (self.root / "dockerd.log").read_text()[-1500:])
            time.sleep(0.2)
        return str(socket)

    def load(self, images: Sequence[str]) -> None:
        """Copy images from the host's engine (the benchmark's base images) into this one."""
        for image in images:
            save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
            assert save.stdout is not None
            load = subprocess.run(["docker", "load", "--quiet"], stdin=save.stdout,
                                  env={**os.environ, **self.env}, capture_output=True,
                                  check=False, timeout=600)
            save.stdout.close()
            saved = save.wait(timeout=600)
            if saved != 0 or load.returncode != 0:
                why = (save.stderr.read().decode(errors="replace") if save.stderr else "")
                raise EngineError(f"could not copy {image} into the benchmark's engine: "
                                  f"{why.strip() or load.stderr.decode(errors='replace')}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        if self.containerd is not None and self.containerd.poll() is None:
            self.containerd.send_signal(signal.SIGTERM)
            try:
                self.containerd.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.containerd.kill()
                self.containerd.wait(timeout=30)
        for target in sorted(self._mounts(), reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)
        for rule in self.rules:
            subprocess.run(rule, capture_output=True, check=False)
        self.rules = []
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        if self.own_containerd:
            # Its images and snapshots go with its root, now, not when the run ends.
            shutil.rmtree(self.root / "containerd", ignore_errors=True)
        else:
            self._forget()

    def _mounts(self) -> list[str]:
        return mounts_under(self.root)

    def _forget(self) -> None:
        forget_namespaces(self.name)


@contextmanager
def serving(root: Path, images: Sequence[str], *, label: str = "imageforge-bench",
            own_containerd: bool = False) -> Iterator[Engine]:
    """A new engine at `root` with `images` copied in from the current one, and every docker
    command of the block (this process's and its children's) on it, through DOCKER_HOST."""
    before = os.environ.get("DOCKER_HOST")
    with Engine(root, label=label, own_containerd=own_containerd) as engine:
        engine.load(images)
        os.environ.update(engine.env)
        try:
            yield engine
        finally:
            if before is None:
                os.environ.pop("DOCKER_HOST", None)
            else:
                os.environ["DOCKER_HOST"] = before


def mounts_under(root: Path) -> list[str]:
    """Mount points under `root` (an engine's data and exec roots)."""
    inside = str(root) + "/"
    with open("/proc/self/mounts") as table:
        targets = [line.split()[1].encode().decode("unicode_escape") for line in table]
    return [t for t in targets if t.startswith(inside)]


def forget_namespaces(name: str) -> None:
    """Empty and remove an engine's namespaces in the host's containerd (its images,
    snapshots and content would otherwise stay there).

    Each kind goes in one `ctr` call: with --sync, ctr waits for containerd's garbage
    collection only after the last of them, where one call per lease collected once per
    lease (100 leases: 7.3 s one by one, 0.14 s in one call), which made most of each test
    worker's teardown. What one call leaves (ctr stops at an error) goes one by one."""
    for namespace in (name, f"{name}_history", f"{name}-plugins"):
        ctr = ["ctr", "-n", namespace]

        def listed(*args: str, ctr: list[str] = ctr) -> list[str]:
            found = subprocess.run([*ctr, *args], capture_output=True, text=True, check=False)
            return found.stdout.split() if found.returncode == 0 else []

        def rm(*args: str, ctr: list[str] = ctr) -> None:
            subprocess.run([*ctr, *args], capture_output=True, check=False)

        def rm_all(kind: str, *flags: str) -> None:
            found = listed(kind, "ls", "-q")
            if found:
                rm(kind, "rm", *flags, *found)
            for left in listed(kind, "ls", "-q"):
                rm(kind, "rm", *flags, left)

        rm_all("containers")
        rm_all("images", "--sync")
        rm_all("leases", "--sync")
        # Children before parents: each pass removes the snapshots nothing builds on (none
        # are left once the images and leases are gone, unless the collection missed some).
        for _ in range(50):
            table = subprocess.run([*ctr, "snapshots", "ls"], capture_output=True,
                                   text=True, check=False).stdout.splitlines()[1:]
            if not table:
                break
            for row in table:
                rm("snapshots", "rm", row.split()[0])
        rm_all("content")
        subprocess.run(["ctr", "namespaces", "rm", namespace], capture_output=True,
                       check=False)


def _must(command: list[str]) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise EngineError(f"{' '.join(command)} failed: {proc.stderr.strip()}")

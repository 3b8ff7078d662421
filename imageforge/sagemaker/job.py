"""Running a run-local job with Docker: one container per host on a private network, SSH
keys, the time limit, and clean-up whatever happens."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, TextIO

from imageforge import cmd
from imageforge.cmd import docker_binary
from imageforge.docker import ensure_daemon
from imageforge.errors import DockerError, TrainingJobError
from imageforge.sagemaker.contract import (
    LABEL,
    SSH_CHANNEL,
    HostResult,
    JobResult,
    JobSpec,
    failure_reason,
    host_dir,
    host_names,
    last_log_line,
    model_dir,
    mount_value,
    mounts,
    write_layout,
)

# --- running --------------------------------------------------------------------------------

def ensure_image(image: str) -> None:
    ensure_daemon()
    if _quiet("image", "inspect", image).returncode != 0:
        raise DockerError(f"image {image} is not in the local Docker image store; build it "
                          "(invoke build) or load it first: run-local never pulls.")


def _quiet(*args: str) -> subprocess.CompletedProcess[bytes]:
    # Own session: a second Ctrl-C on the terminal must not kill the clean-up's calls.
    return cmd.run([docker_binary(), *args], timeout=120, own_session=True, error=DockerError,
               timed_out=f"`docker {args[0]}` did not answer within 120 s; check the Docker "
                         "daemon (docker info) and retry.")


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Hold SIGINT/SIGTERM off while cleaning up, so removal finishes; a signal that arrived
    before still ends the run (the caller's KeyboardInterrupt keeps propagating)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _Job:
    """The job's Docker objects: made by keygen() and create(), removed by remove()."""

    def __init__(self, spec: JobSpec, log: TextIO) -> None:
        self.spec = spec
        self.log = log
        self.lock = threading.Lock()
        self.hosts = [HostResult(host=h, container=f"{spec.job_name}-{h}")
                      for h in host_names(spec.hosts)]
        self.clients: dict[str, subprocess.Popen[bytes]] = {}
        self.readers: list[threading.Thread] = []

    def say(self, line: str) -> None:
        # A reader that went away (`| head`) must not stop the draining of the containers'
        # output: a full pipe would stall them. log.txt still gets every line.
        with self.lock, contextlib.suppress(OSError, ValueError):
            self.log.write(line + "\n")
            self.log.flush()

    def labels(self) -> list[str]:
        return ["--label", f"{LABEL}={self.spec.job_name}"]

    def keygen(self) -> None:
        """One ed25519 key pair per job, made with the image's own ssh-keygen (the host may
        have none): every host gets it read-only as input channel `ssh`."""
        result = _quiet("run", "--rm", "--pull", "never", "--name",
                        f"{self.spec.job_name}-ssh-keygen", *self.labels(), "--network", "none",
                        "--mount", mount_value(self.spec.output / SSH_CHANNEL, "/ssh"),
                        "--entrypoint", "ssh-keygen", self.spec.image,
                        "-q", "-t", "ed25519", "-N", "", "-C", self.spec.job_name,
                        "-f", "/ssh/id_ed25519")
        if result.returncode != 0:
            detail = _last_line(result.stderr)
            raise TrainingJobError(f"could not make the job's SSH key with ssh-keygen in image "
                             f"{self.spec.image} ({detail}); install openssh-client in the "
                             "image.")

    def create(self) -> None:
        network = _quiet("network", "create", "--internal", *self.labels(), self.spec.job_name)
        if network.returncode != 0:
            raise DockerError(f"docker network create {self.spec.job_name} failed "
                              f"({_last_line(network.stderr)}).")
        for h in self.hosts:
            result = _quiet(
                "create", "--pull", "never", "--name", h.container, *self.labels(),
                "--hostname", h.host, "--network", self.spec.job_name,
                "--network-alias", h.host, "--env", f"TRAINING_JOB_NAME={self.spec.job_name}",
                *mounts(self.spec, h.host), self.spec.image, "train")
            if result.returncode != 0:
                raise DockerError(f"docker create {h.container} failed "
                                  f"({_last_line(result.stderr)}).")

    def start(self) -> None:
        for h in self.hosts:
            # Attached start: its output is the container's log, its end the container's.
            client = cmd.popen([docker_binary(), "start", "--attach", h.container],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               own_session=True, error=DockerError)
            self.clients[h.host] = client
            assert client.stdout is not None
            reader = threading.Thread(target=self._stream, args=(h.host, client.stdout),
                                      daemon=True)
            reader.start()
            self.readers.append(reader)

    def _stream(self, host: str, stream: IO[bytes]) -> None:
        with (host_dir(self.spec, host) / "log.txt").open("ab") as saved:
            for raw in stream:
                saved.write(raw)
                if self.spec.verbose:
                    self.say(f"[{host}] {raw.decode(errors='replace').rstrip()}")

    def wait(self) -> bool:
        """Until every host ended, one failed, or the time limit; False on the time limit."""
        deadline = time.monotonic() + self.spec.timeout
        while True:
            for h in self.hosts:
                if h.status == "pending" and self.clients[h.host].poll() is not None:
                    self._finished(h)
            if any(h.status == "failed" for h in self.hosts):
                return True
            if all(h.status != "pending" for h in self.hosts):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def _finished(self, h: HostResult) -> None:
        state = _container_state(h.container)
        code = state.get("ExitCode")
        h.exit_code = code if isinstance(code, int) else self.clients[h.host].returncode
        h.oom_killed = bool(state.get("OOMKilled"))
        h.status = "completed" if h.exit_code == 0 else "failed"

    def remove(self) -> None:
        label = f"label={LABEL}={self.spec.job_name}"

        def attempt(*args: str) -> str:
            # One docker call that hangs must not keep the others from removing the rest.
            with contextlib.suppress(DockerError):
                return _quiet(*args).stdout.decode(errors="replace")
            return "?"

        with _uninterrupted():
            names = {h.container for h in self.hosts} | {f"{self.spec.job_name}-ssh-keygen"}
            found = attempt("ps", "-aq", "--filter", label).split()
            attempt("rm", "--force", "--volumes", *sorted(names), *found)
            for client in self.clients.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    client.wait(timeout=30)
            for reader in self.readers:
                reader.join(timeout=10)
            attempt("network", "rm", self.spec.job_name)
            left = attempt("ps", "-aq", "--filter", label)
            nets = attempt("network", "ls", "-q", "--filter", label)
            if left.strip() or nets.strip():
                self.say(f"run-local: could not remove every container or network of job "
                         f"{self.spec.job_name}; remove them with `docker rm -f` / "
                         f"`docker network rm` (label {LABEL}={self.spec.job_name}).")


def _container_state(name: str) -> dict[str, Any]:
    result = _quiet("container", "inspect", "--format", "{{json .State}}", name)
    try:
        state = json.loads(result.stdout or b"{}")
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def _last_line(output: bytes) -> str:
    lines = output.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "no message"


def run(spec: JobSpec, log: TextIO) -> JobResult:
    """Run the job; the result says how each host ended. Docker objects never outlive it."""
    ensure_image(spec.image)
    created = not spec.output.exists()
    job = _Job(spec, log)
    ran = False
    try:
        write_layout(spec)
        job.keygen()
        job.create()
        ran = True
        job.say(f"run-local: job {spec.job_name}, {spec.hosts} host(s), image {spec.image}, "
                f"output {spec.output}")
        if not spec.verbose:
            job.say("run-local: each host's output goes to <output>/algo-N/log.txt "
                    "(--verbose shows it here as it runs)")
        started = time.monotonic()
        job.start()
        in_time = job.wait()
        duration = time.monotonic() - started
    finally:
        job.remove()
        if not ran:
            # Nothing ran: leave no half-made output behind (it was new or empty before).
            _clear(spec.output, remove_dir=created)
    for h in job.hosts:
        if h.status == "pending":
            h.status = "stopped" if in_time else "timed out"
        if h.status == "failed":
            # Read after the log readers finished: without a failure file (the toolkit never
            # ran, e.g. no `train` in the image) the log's last line is the reason.
            h.failure = (failure_reason(host_dir(spec, h.host) / "output" / "failure")
                         or last_log_line(host_dir(spec, h.host) / "log.txt"))
        model = model_dir(spec, h.host)
        h.model_files = sorted(str(p.relative_to(model)) for p in model.rglob("*") if p.is_file())
    return JobResult(spec=spec, hosts=job.hosts, duration=duration, timed_out=not in_time)


def _clear(path: Path, *, remove_dir: bool) -> None:
    if remove_dir:
        shutil.rmtree(path, ignore_errors=True)
        return
    for child in path.iterdir() if path.is_dir() else ():
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink()


def require_success(result: JobResult) -> None:
    job = result.spec.job_name
    failed = result.failed
    if failed is not None:
        reason = f": {failed.failure}" if failed.failure else ""
        oom = " (killed: out of memory)" if failed.oom_killed else ""
        raise TrainingJobError(
            f"run-local job {job} failed: host {failed.host} exited with code "
            f"{failed.exit_code}{oom}{reason}; its log is {host_dir(result.spec, failed.host)}"
            "/log.txt.")
    if result.timed_out:
        running = ", ".join(h.host for h in result.hosts if h.status == "timed out")
        raise TrainingJobError(
            f"run-local job {job} timed out after {result.spec.timeout:g} s with {running} "
            "still running (stopped and removed); raise --timeout if it needs longer.")


def summary(result: JobResult) -> str:
    lines = [f"job {result.spec.job_name}: {result.status} in {result.duration:.1f} s "
             f"(output {result.spec.output})"]
    for h in result.hosts:
        code = "-" if h.exit_code is None else str(h.exit_code)
        files = len(h.model_files)
        lines.append(f"  {h.host:<8} {h.status:<10} exit {code:<4} model "
                     f"{model_dir(result.spec, h.host)} ({files} file{'s' * (files != 1)})")
    return "\n".join(lines)

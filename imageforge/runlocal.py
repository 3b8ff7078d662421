"""run-local: a SageMaker training job emulated with Docker on this machine.

Each host is one container of the image, started the way SageMaker starts it
(`docker run IMAGE train`) with the /opt/ml layout the SageMaker training toolkit reads
(sagemaker-training 5.1.4, environment.py): input/config/{hyperparameters,resourceconfig,
inputdataconfig}.json, input/data/<channel>, code, model, output. Hosts are named algo-1 ..
algo-N and reach each other on a private network made for the job. Whatever happens (success,
a failed host, the time limit, Ctrl-C, SIGTERM) the job's containers and network are removed;
its files stay in the output directory: <output>/<host>/{input/config,model,output,log.txt}
and the job's SSH key pair in <output>/ssh.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, TextIO

from imageforge import cmd
from imageforge.cmd import docker_binary
from imageforge.docker import ensure_daemon
from imageforge.errors import DockerError, TrainingJobError, UsageError

LABEL = "imageforge.run-local.job"
SSH_CHANNEL = "ssh"
CODE_DIR = "/opt/ml/code"
GROUP = "homogeneousCluster"
DEFAULT_TIMEOUT = 3600
# SageMaker's ChannelName pattern (CreateTrainingJob API), minus the names a path cannot take.
CHANNEL_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
# The toolkit refuses any other entry point name (process.validate_entry_point); refusing it
# here costs nothing, where the toolkit would fail only after every container has started.
PROGRAM_NAME = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._+-]*(/[A-Za-z0-9._+-]+)*")


@dataclass(frozen=True)
class JobSpec:
    image: str
    output: Path
    job_name: str
    hosts: int = 1
    program: str | None = None
    code: Path | None = None
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)
    channels: Mapping[str, Path] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT
    # Show every host's output as it runs ([algo-N] lines); it always goes to algo-N/log.txt.
    verbose: bool = False


@dataclass
class HostResult:
    host: str
    container: str
    status: str = "pending"  # completed, failed, stopped (another host failed), timed out
    exit_code: int | None = None
    oom_killed: bool = False
    failure: str | None = None
    model_files: list[str] = field(default_factory=list)


@dataclass
class JobResult:
    spec: JobSpec
    hosts: list[HostResult]
    duration: float = 0.0
    timed_out: bool = False

    @property
    def failed(self) -> HostResult | None:
        return next((h for h in self.hosts if h.status == "failed"), None)

    @property
    def status(self) -> str:
        if self.failed:
            return "Failed"
        return "TimedOut" if self.timed_out else "Completed"

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.spec.job_name, "image": self.spec.image, "status": self.status,
            "output": str(self.spec.output), "duration_s": round(self.duration, 3),
            "hosts": [{"host": h.host, "status": h.status, "exit_code": h.exit_code,
                       "oom_killed": h.oom_killed, "failure": h.failure,
                       "model_dir": str(model_dir(self.spec, h.host)),
                       "model_files": h.model_files} for h in self.hosts],
        }


# --- arguments -----------------------------------------------------------------------------

def new_job_name(now: datetime | None = None) -> str:
    """Unique per run, and valid as a SageMaker job name, a container and a network name."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return f"run-local-{stamp}-{secrets.token_hex(3)}"


def parse_hyperparameters(items: Sequence[str]) -> dict[str, Any]:
    """--hp KEY=VALUE: VALUE as JSON when it parses (2, 0.1, true, [1,2]), else the string."""
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--hp {item}: use KEY=VALUE, e.g. --hp epochs=2.")
        if key in parsed:
            raise UsageError(f"--hp {key} is given twice; give each hyperparameter once.")
        try:
            parsed[key] = json.loads(text)
        except ValueError:
            parsed[key] = text
    return parsed


def parse_channels(items: Sequence[str]) -> dict[str, Path]:
    """--channel NAME=DIR: an existing directory, mounted read-only as input data."""
    channels: dict[str, Path] = {}
    for item in items:
        name, sep, directory = item.partition("=")
        if not sep or not directory:
            raise UsageError(f"--channel {item}: use NAME=DIR, e.g. --channel training=data/.")
        if not CHANNEL_NAME.fullmatch(name) or name in (".", ".."):
            raise UsageError(f"--channel {item}: a channel name has 1 to 64 letters, digits, "
                             "'.', '_' or '-'.")
        if name == SSH_CHANNEL:
            raise UsageError(f"--channel {item}: the channel name {SSH_CHANNEL} is taken by the "
                             "job's SSH key; choose another name.")
        if name in channels:
            raise UsageError(f"--channel {name} is given twice; give each channel once.")
        path = Path(directory).expanduser()
        if not path.is_dir():
            raise UsageError(f"--channel {item}: {directory} is not a directory.")
        channels[name] = path.resolve()
    return channels


def make_spec(*, image: str | None, output: str | None, cache_dir: Path, hosts: int = 1,
              program: str | None = None, code: str | None = None,
              hp: Sequence[str] = (), channel: Sequence[str] = (),
              timeout: float = DEFAULT_TIMEOUT, verbose: bool = False) -> JobSpec:
    """Check every flag that needs no Docker; nothing is created here."""
    if not image:
        raise UsageError("run-local needs --image REF (an image in the local Docker store).")
    if hosts < 1:
        raise UsageError(f"--hosts {hosts}: a job needs at least one host.")
    if timeout <= 0:
        raise UsageError(f"--timeout {timeout}: give the job's time limit in seconds (> 0).")
    code_dir = None
    if code is not None:
        code_dir = Path(code).expanduser()
        if not code_dir.is_dir():
            raise UsageError(f"--code {code}: not a directory; give the directory holding "
                             "your training program.")
        code_dir = code_dir.resolve()
    if program is not None:
        check_program(program, code_dir)
    hyperparameters = parse_hyperparameters(hp)
    for key, flag in (("sagemaker_program", program), ("sagemaker_submit_directory", code)):
        if key in hyperparameters and flag is not None:
            option = "--program" if key == "sagemaker_program" else "--code"
            raise UsageError(f"--hp {key} and {option} both set {key}; give one of them.")
    job_name = new_job_name()
    out = Path(output).expanduser() if output else cache_dir / "run-local" / job_name
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--output {out}: exists and is not an empty directory; a job writes "
                         "into a new or empty one.")
    return JobSpec(image=image, output=out.resolve(), job_name=job_name, hosts=hosts,
                   program=program, code=code_dir, hyperparameters=hyperparameters,
                   channels=parse_channels(channel), timeout=timeout, verbose=verbose)


def check_program(program: str, code_dir: Path | None) -> None:
    if (not PROGRAM_NAME.fullmatch(program)
            or any(part in (".", "..") for part in program.split("/"))):
        raise UsageError(f"--program {program}: give a path relative to --code made of letters, "
                         "digits, '.', '_', '+', '-' and '/' (what the SageMaker toolkit "
                         "accepts), e.g. train.py.")
    if code_dir is not None and not (code_dir / program).is_file():
        raise UsageError(f"--program {program}: no such file in --code {code_dir}.")


# --- the files SageMaker writes -------------------------------------------------------------

def host_names(count: int) -> list[str]:
    return [f"algo-{i}" for i in range(1, count + 1)]


def hyperparameters_json(spec: JobSpec) -> dict[str, str]:
    """Every value JSON-encoded into a string, as the SageMaker Python SDK sends them; the
    toolkit json.loads each one back (environment.read_hyperparameters)."""
    values: dict[str, Any] = {"sagemaker_job_name": spec.job_name,
                              "sagemaker_container_log_level": 20}
    if spec.program is not None:
        values["sagemaker_program"] = spec.program
    if spec.code is not None:
        values["sagemaker_submit_directory"] = CODE_DIR
    values.update(spec.hyperparameters)
    return {key: json.dumps(value) for key, value in values.items()}


def resource_config(host: str, hosts: Sequence[str]) -> dict[str, Any]:
    # The toolkit reads current_group_name (not current_instance_group) and instance_groups;
    # without them distributed runs find no distribution hosts.
    return {"current_host": host, "current_instance_type": "local", "current_group_name": GROUP,
            "hosts": list(hosts),
            "instance_groups": [{"instance_group_name": GROUP, "instance_type": "local",
                                 "hosts": list(hosts)}],
            "network_interface_name": "eth0"}


def input_data_config(channels: Sequence[str]) -> dict[str, dict[str, str]]:
    return {name: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
                   "RecordWrapperType": "None"} for name in channels}


def host_dir(spec: JobSpec, host: str) -> Path:
    return spec.output / host


def model_dir(spec: JobSpec, host: str) -> Path:
    return host_dir(spec, host) / "model"


def write_layout(spec: JobSpec) -> None:
    """<output>/<host>/input/config/*.json, model/, output/data/ for every host."""
    hosts = host_names(spec.hosts)
    channels = [*spec.channels, SSH_CHANNEL]
    for host in hosts:
        config = host_dir(spec, host) / "input" / "config"
        config.mkdir(parents=True)
        for name, data in (("hyperparameters.json", hyperparameters_json(spec)),
                           ("resourceconfig.json", resource_config(host, hosts)),
                           ("inputdataconfig.json", input_data_config(channels))):
            (config / name).write_text(json.dumps(data, indent=2) + "\n")
        model_dir(spec, host).mkdir()
        (host_dir(spec, host) / "output" / "data").mkdir(parents=True)
    (spec.output / SSH_CHANNEL).mkdir()


def mount_value(source: Path, target: str, *, readonly: bool = False) -> str:
    """A bind --mount value. --mount, not -v: a missing source is an error instead of a new
    empty directory, and a ':' in a path is not a separator. Docker reads the value as one
    CSV record, so a ',' in a path needs CSV quoting."""
    buffer = io.StringIO()
    fields = ["type=bind", f"source={source}", f"target={target}"]
    csv.writer(buffer, lineterminator="").writerow(fields + (["readonly"] if readonly else []))
    return buffer.getvalue()


def mounts(spec: JobSpec, host: str) -> list[str]:
    def bind(source: Path, target: str, *, readonly: bool = False) -> list[str]:
        return ["--mount", mount_value(source, target, readonly=readonly)]

    args = [*bind(host_dir(spec, host) / "input" / "config", "/opt/ml/input/config"),
            *bind(model_dir(spec, host), "/opt/ml/model"),
            *bind(host_dir(spec, host) / "output", "/opt/ml/output"),
            *bind(spec.output / SSH_CHANNEL, f"/opt/ml/input/data/{SSH_CHANNEL}",
                  readonly=True)]
    for name, path in spec.channels.items():
        args += bind(path, f"/opt/ml/input/data/{name}", readonly=True)
    if spec.code is not None:
        args += bind(spec.code, CODE_DIR, readonly=True)
    return args


def failure_reason(path: Path) -> str | None:
    """What the toolkit's failure file says, in one line: its first line, and when that is
    only an error's class name (`ExecuteUserScriptError:`, `Framework Error:`), the exit
    code and the last line of the error message or traceback, where the cause is."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    first = lines[0]
    if not first.endswith(":") or len(lines) == 1:
        return first[:300]
    details = [line for line in lines if line.startswith("ExitCode ")][:1]
    message = _error_message(lines)
    if message or not details:
        details.append(message or lines[-1])
    return f"{first} {', '.join(details)}"[:300]


def last_log_line(path: Path) -> str | None:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return None
    return lines[-1].strip()[:300] if lines else None


def _error_message(lines: Sequence[str]) -> str:
    """The last line of the toolkit's `ErrorMessage "..."` block (a traceback's last line
    names the exception)."""
    inside: list[str] = []
    for line in lines:
        if line.startswith('ErrorMessage "'):
            inside = [line.removeprefix('ErrorMessage "')]
        elif inside and line.startswith(("Command \"", "ExtraInfo \"")):
            break
        elif inside:
            inside.append(line)
    message = [line.strip('"').strip() for line in inside]
    return next((line for line in reversed(message) if line), "")


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

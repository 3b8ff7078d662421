"""The SageMaker training contract run-local emulates: the job spec, its arguments, the
/opt/ml layout each host container reads, and how a host's failure is read back. No Docker
here (imageforge/sagemaker/job.py runs the containers)."""

from __future__ import annotations

import csv
import io
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from imageforge import cachedir
from imageforge.errors import UsageError

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
    out = Path(output).expanduser() if output else cachedir.run_local(cache_dir, job_name)
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



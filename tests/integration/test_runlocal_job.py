"""run-local with real Docker and the real SageMaker training toolkit (sagemaker-training
5.1.4 + sagemaker-pytorch-training 3.0.0 from PyPI, every package at the version and with
the sha256 hashes of runlocal-toolkit.txt, installed with pip's --require-hashes): tiny
pure-Python programs run as training jobs of one and two hosts; failures, the time limit and
Ctrl-C/SIGTERM; and after every job none of its containers or networks is left."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ROOT, docker_out, invoke

# Kept between sessions under a name the session clean-up does not match
# (tests/engine_cleanup.py), tagged with the hash of what it is built from: a session finds
# it and builds nothing, where a tag the clean-up removed made every run load the 1.4 GB image
# again. A changed Dockerfile or requirement set gives another tag.
IMAGE_REPOSITORY = "imageforge-testkit/runlocal-toolkit"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# The pinned, hash-checked requirement set (regenerate: see its first lines).
REQUIREMENTS = Path(__file__).with_name("runlocal-toolkit.txt")
# The toolkit from PyPI, exactly the set of REQUIREMENTS (bound in, so it lands in no
# layer): pip refuses any file whose hash the set does not list, and any package the set
# does not pin. pip reaches PyPI through the host's CA bundle, handed over as a secret;
# pip's cache mount makes a rebuild after a base change cheap.
DOCKERFILE = """\
FROM imageforge/base:bookworm
RUN python3 -m venv /opt/venv
RUN --mount=type=secret,id=ca-bundle --mount=type=cache,target=/root/.cache/pip \\
    --mount=type=bind,source=requirements.txt,target=/tmp/requirements.txt \\
    PIP_CERT=/run/secrets/ca-bundle /opt/venv/bin/pip install --require-hashes \\
        -r /tmp/requirements.txt
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    SAGEMAKER_TRAINING_MODULE=sagemaker_pytorch_container.training:main
"""

RECORD_PROGRAM = """\
import json, os, sys
model = os.environ["SM_MODEL_DIR"]
with open("/opt/ml/input/config/hyperparameters.json") as f:
    written = json.load(f)
with open(os.path.join(os.environ["SM_CHANNEL_TRAINING"], "data.txt")) as f:
    data = f.read()
os.makedirs(os.path.join(model, "weights"))
with open(os.path.join(model, "weights", "w.bin"), "wb") as f:
    f.write(b"0" * 16)
with open(os.path.join(model, "model.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "sm_hps": json.loads(os.environ["SM_HPS"]),
               "written": written, "data": data, "job": os.environ["TRAINING_JOB_NAME"],
               "channels": json.loads(os.environ["SM_CHANNELS"])}, f)
"""

# Each host: name lookup of the other host, then SSH between them with the job's key from the
# `ssh` channel, the way MPI reaches the other hosts: algo-1 logs in to algo-2, which waits
# for that login before it ends.
TWO_HOST_PROGRAM = """\
import json, os, shutil, socket, subprocess, time
host = os.environ["SM_CURRENT_HOST"]
other = [h for h in json.loads(os.environ["SM_HOSTS"]) if h != host][0]
channel = os.environ["SM_CHANNEL_SSH"]
os.makedirs("/root/.ssh", mode=0o700, exist_ok=True)
shutil.copy(os.path.join(channel, "id_ed25519"), "/root/.ssh/id_ed25519")
os.chmod("/root/.ssh/id_ed25519", 0o600)
shutil.copy(os.path.join(channel, "id_ed25519.pub"), "/root/.ssh/authorized_keys")
os.chmod("/root/.ssh/authorized_keys", 0o600)
os.makedirs("/run/sshd", exist_ok=True)
subprocess.run(["ssh-keygen", "-A"], check=True, capture_output=True)
subprocess.run(["/usr/sbin/sshd", "-o", "UsePAM=no"], check=True)
with open("/opt/ml/input/config/resourceconfig.json") as f:
    record = {"host": host, "resourceconfig": json.load(f), "other": other,
              "other_address": socket.gethostbyname(other)}
if host == "algo-1":
    for attempt in range(150):
        ssh = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                              "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5",
                              other, "hostname && touch /tmp/reached"],
                             capture_output=True, text=True)
        if ssh.returncode == 0:
            break
        time.sleep(0.2)
    record["ssh"] = ssh.stdout.strip()
    record["ssh_error"] = ssh.stderr.strip()
else:
    deadline = time.monotonic() + 60
    while not os.path.exists("/tmp/reached") and time.monotonic() < deadline:
        time.sleep(0.1)
    record["reached"] = os.path.exists("/tmp/reached")
with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.json"), "w") as f:
    json.dump(record, f)
"""

FAILING_PROGRAM = """\
print("checking the learning rate", flush=True)
raise ValueError("learning rate must be positive")
"""

SLEEPING_PROGRAM = """\
import os, time
open(os.path.join(os.environ["SM_MODEL_DIR"], "started"), "w").close()
time.sleep(300)
"""


def build_toolkit(requirements: str, *tag: str) -> subprocess.CompletedProcess[str]:
    """DOCKERFILE built with `requirements` as its requirement set."""
    with tempfile.TemporaryDirectory() as context:
        (Path(context) / "Dockerfile").write_text(DOCKERFILE)
        (Path(context) / "requirements.txt").write_text(requirements)
        return subprocess.run(
            ["docker", "buildx", "build", "--load", "--progress", "plain", *tag,
             "--secret", f"id=ca-bundle,src={CA_BUNDLE}", context],
            capture_output=True, text=True, check=False, timeout=1200)


@pytest.fixture(scope="session")
def toolkit_image(docker_ready: None) -> str:
    """A small training image with the real toolkit, built (or found in the layer cache)."""
    del docker_ready  # requested for its Docker check only (usefixtures is for tests)
    requirements = REQUIREMENTS.read_text()
    digest = hashlib.sha256(f"{DOCKERFILE}\0{requirements}".encode()).hexdigest()[:16]
    image = f"{IMAGE_REPOSITORY}:{digest}"
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True,
                      check=False).returncode == 0:
        return image
    build = build_toolkit(requirements, "--tag", image)
    assert build.returncode == 0, build.stderr[-3000:]
    return image


def pinned(text: str) -> dict[str, tuple[str, list[str]]]:
    """Requirement name -> (version, sha256 hashes), from a requirements file."""
    logical = re.sub(r"\\\n", " ", re.sub(r"#.*", "", text))
    found = {}
    for line in filter(None, map(str.strip, logical.splitlines())):
        name, _, rest = line.partition("==")
        version, *options = rest.split()
        found[name] = (version, [o.removeprefix("--hash=sha256:") for o in options])
    return found


def test_the_toolkit_set_pins_every_package_with_hashes() -> None:
    requirements = pinned(REQUIREMENTS.read_text())
    assert {"sagemaker-training", "sagemaker-pytorch-training"} <= set(requirements)
    assert requirements["sagemaker-training"][0] == "5.1.4"
    assert requirements["sagemaker-pytorch-training"][0] == "3.0.0"
    for name, (version, hashes) in requirements.items():
        assert re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version), (name, version)
        assert hashes, name
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name


@pytest.mark.usefixtures("docker_ready")
def test_a_package_whose_hash_differs_from_the_set_is_refused() -> None:
    # One small package of the set (no dependencies of its own), every hash of it altered:
    # the same Dockerfile, so the same pip command, must refuse what PyPI serves.
    version, hashes = pinned(REQUIREMENTS.read_text())["jmespath"]
    altered = " ".join(f"--hash=sha256:{h[::-1]}" for h in hashes)
    refused = build_toolkit(f"jmespath=={version} {altered}\n")
    assert refused.returncode != 0, refused.stderr[-3000:]
    assert "DO NOT MATCH THE HASHES" in refused.stderr, refused.stderr[-3000:]
    # pip names the hash of the file it got: one of the set's true hashes.
    assert any(re.search(rf"\bGot\s+{h}\b", refused.stderr) for h in hashes), \
        refused.stderr[-3000:]


def program(tmp_path: Path, text: str) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(text)
    return code


def job_name(output: str) -> str:
    found = re.search(r"run-local: job (\S+),", output)
    assert found, output
    return found.group(1)


def leftovers(job: str) -> list[str]:
    """Containers and networks of the job that still exist."""
    containers = docker_out("ps", "-a", "--filter", f"name={job}", "--format", "{{.Names}}")
    labelled = docker_out("ps", "-a", "--filter", f"label=imageforge.run-local.job={job}",
                          "--format", "{{.Names}}")
    networks = docker_out("network", "ls", "--filter", f"name={job}", "--format", "{{.Name}}")
    return [line for line in (containers + "\n" + labelled + "\n" + networks).splitlines()
            if line]


def test_a_program_gets_its_hyperparameters_and_its_model_lands_on_the_host(
        toolkit_image: str, tmp_path: Path) -> None:
    code = program(tmp_path, RECORD_PROGRAM)
    data = tmp_path / "data,v1:2"  # a ',' and a ':' must not break the mount
    data.mkdir()
    (data / "data.txt").write_text("three samples\n")
    out = tmp_path / "job"
    result = invoke("run-local", "--image", toolkit_image, "--code", str(code),
                    "--program", "train.py", "--hp", "epochs=2", "--hp", "lr=0.5",
                    "--hp", "name=resnet", "--hp", "layers=[1,2]",
                    "--channel", f"training={data}", "--output", str(out), "--json",
                    "--verbose", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.stdout)
    job = report["job"]
    assert leftovers(job) == []
    assert report["status"] == "Completed"
    assert report["output"] == str(out.resolve())
    [host] = report["hosts"]
    assert host["host"] == "algo-1"
    assert host["exit_code"] == 0
    assert host["status"] == "completed"
    assert host["model_dir"] == str(out.resolve() / "algo-1" / "model")
    assert host["model_files"] == ["model.json", "weights/w.bin"]
    assert "[algo-1] " in result.stderr, "logs stream to stderr under --json"

    model = json.loads((out / "algo-1" / "model" / "model.json").read_text())
    assert model["argv"] == ["--epochs", "2", "--layers", "[1, 2]", "--lr", "0.5",
                             "--name", "resnet"]
    assert model["sm_hps"] == {"epochs": 2, "lr": 0.5, "name": "resnet", "layers": [1, 2]}
    assert {k: model["written"][k] for k in ("epochs", "name", "sagemaker_program",
                                             "sagemaker_submit_directory")} == {
        "epochs": "2", "name": '"resnet"', "sagemaker_program": '"train.py"',
        "sagemaker_submit_directory": '"/opt/ml/code"'}
    assert model["data"] == "three samples\n"
    assert model["job"] == job
    assert sorted(model["channels"]) == ["ssh", "training"]
    assert (out / "algo-1" / "log.txt").read_text().count("Reporting training SUCCESS") == 1


def test_two_hosts_see_each_other_and_log_in_with_the_job_key(
        toolkit_image: str, tmp_path: Path) -> None:
    code = program(tmp_path, TWO_HOST_PROGRAM)
    out = tmp_path / "job"
    result = invoke("run-local", "--image", toolkit_image, "--code", str(code),
                    "--program", "train.py", "--hosts", "2", "--output", str(out),
                    "--timeout", "240", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert leftovers(job_name(result.stdout)) == []
    # Concise unless --verbose: the hosts' output is in their log files only.
    assert "[algo-" not in result.stdout + result.stderr
    assert "algo-N/log.txt (--verbose shows it here" in result.stdout
    for host in ("algo-1", "algo-2"):
        assert "Invoking user script" in (out / host / "log.txt").read_text()
    assert "Completed" in result.stdout.splitlines()[-3]
    records = {h: json.loads((out / h / "model" / "model.json").read_text())
               for h in ("algo-1", "algo-2")}
    for host, record in records.items():
        assert record["resourceconfig"]["current_host"] == host
        assert record["resourceconfig"]["hosts"] == ["algo-1", "algo-2"]
        assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", record["other_address"])
    assert records["algo-1"]["other_address"] != records["algo-2"]["other_address"]
    assert records["algo-1"]["ssh"] == "algo-2", records["algo-1"]["ssh_error"]
    assert records["algo-2"]["reached"] is True
    key = (out / "ssh" / "id_ed25519.pub").read_text()
    assert key.startswith("ssh-ed25519 ")


def test_a_failing_program_fails_the_job_with_its_host_code_and_reason(
        toolkit_image: str, tmp_path: Path) -> None:
    code = program(tmp_path, FAILING_PROGRAM)
    out = tmp_path / "job"
    result = invoke("run-local", "--image", toolkit_image, "--code", str(code),
                    "--program", "train.py", "--output", str(out), timeout=300)
    assert result.returncode == 11, result.stderr
    assert leftovers(job_name(result.stdout)) == []
    message = result.stderr.strip()
    assert "Traceback" not in message, message
    assert len(message.splitlines()) == 1, message
    assert "failed: host algo-1 exited with code 1: ExecuteUserScriptError: ExitCode 1, " \
           "ValueError: learning rate must be positive;" in message
    assert (out / "algo-1" / "output" / "failure").is_file()
    assert "algo-1   failed" in result.stdout


@pytest.mark.usefixtures("docker_ready")
def test_an_image_that_is_not_here_is_refused_and_nothing_is_made(
        tmp_path: Path) -> None:
    before = docker_out("network", "ls", "-q")
    out = tmp_path / "job"
    result = invoke("run-local", "--image", f"imageforge-test/absent:{uuid.uuid4().hex[:8]}",
                    "--output", str(out), timeout=120)
    assert result.returncode == 6
    assert "is not in the local Docker image store" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert docker_out("network", "ls", "-q") == before


def test_the_time_limit_stops_and_removes_the_job(toolkit_image: str, tmp_path: Path) -> None:
    code = program(tmp_path, SLEEPING_PROGRAM)
    result = invoke("run-local", "--image", toolkit_image, "--code", str(code),
                    "--program", "train.py", "--hosts", "2", "--timeout", "3",
                    "--output", str(tmp_path / "job"), timeout=120)
    assert result.returncode == 11, result.stderr
    assert leftovers(job_name(result.stdout)) == []
    assert "timed out after 3 s with algo-1, algo-2 still running" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_mid_job_removes_everything_and_exits_130(
        toolkit_image: str, tmp_path: Path, signum: int) -> None:
    code = program(tmp_path, SLEEPING_PROGRAM)
    out = tmp_path / "job"
    log = tmp_path / "stdout.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "invoke", "-r", str(ROOT), "run-local", "--image",
             toolkit_image, "--code", str(code), "--program", "train.py", "--hosts", "2",
             "--output", str(out)],
            cwd=ROOT, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
        started = [out / h / "model" / "started" for h in ("algo-1", "algo-2")]
        deadline = time.monotonic() + 120
        while not all(p.exists() for p in started):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        job = job_name(log.read_text())
        assert len(leftovers(job)) == 5, "two containers (name and label) and the network"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip() == "imageforge: error: interrupted."
    assert leftovers(job) == []

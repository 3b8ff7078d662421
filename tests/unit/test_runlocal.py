"""run-local without Docker: the /opt/ml files a SageMaker training container reads, the flags
and their refusals, and the one-line failure reasons taken from the toolkit's failure file."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from imageforge import sagemaker as runlocal
from imageforge.errors import FatalError, TrainingJobError
from imageforge.sagemaker import HostResult, JobResult, JobSpec

ROOT = Path(__file__).resolve().parents[2]


def spec(tmp_path: Path, **changes: object) -> JobSpec:
    values: dict[str, object] = {"image": "example/train:1", "output": tmp_path / "out",
                                 "job_name": "run-local-20260101-000000-abcdef"}
    values.update(changes)
    return JobSpec(**values)  # type: ignore[arg-type]


def make(tmp_path: Path, **flags: object) -> JobSpec:
    return runlocal.make_spec(**{"image": "example/train:1", "output": None,
                                 "cache_dir": tmp_path / "cache", **flags})  # type: ignore[arg-type]


def decode(hyperparameters: dict[str, str]) -> dict[str, object]:
    """What the toolkit does with hyperparameters.json (environment.read_hyperparameters)."""
    decoded: dict[str, object] = {}
    for key, value in hyperparameters.items():
        try:
            decoded[key] = json.loads(value)
        except ValueError:
            decoded[key] = value
    return decoded


def test_hyperparameters_are_json_strings_like_the_sdk_writes(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("")
    job = make(tmp_path, program="train.py", code=str(code), hp=["epochs=2"])
    written = runlocal.hyperparameters_json(job)
    assert written["epochs"] == "2"
    assert written["sagemaker_program"] == '"train.py"'
    assert written["sagemaker_submit_directory"] == '"/opt/ml/code"'
    assert written["sagemaker_job_name"] == json.dumps(job.job_name)
    assert written["sagemaker_container_log_level"] == "20"
    assert all(isinstance(v, str) for v in written.values())


@pytest.mark.parametrize(("item", "value"), [
    ("epochs=2", 2), ("lr=0.5", 0.5), ("amp=true", True), ("layers=[1, 2]", [1, 2]),
    ('opts={"a": 1}', {"a": 1}), ("name=resnet", "resnet"), ('quoted="2"', "2"),
    ("empty=", ""), ("expr=a=b", "a=b"), ("none=null", None), ("spaces=two words", "two words"),
])
def test_hp_value_is_json_when_it_parses_else_a_string(item: str, value: object) -> None:
    parsed = runlocal.parse_hyperparameters([item])
    assert list(parsed.values()) == [value]


def test_the_toolkit_reads_back_what_was_given(tmp_path: Path) -> None:
    given = ["epochs=2", "name=resnet", "layers=[1,2]", 'quoted="2"', "flag=false"]
    job = spec(tmp_path, hyperparameters=runlocal.parse_hyperparameters(given))
    back = decode(runlocal.hyperparameters_json(job))
    assert {k: back[k] for k in ("epochs", "name", "layers", "quoted", "flag")} == {
        "epochs": 2, "name": "resnet", "layers": [1, 2], "quoted": "2", "flag": False}


@pytest.mark.parametrize("items", [["epochs"], ["=2"], [" =2"], ["a=1", "a=2"]])
def test_bad_hp_syntax_is_refused(items: list[str]) -> None:
    with pytest.raises(FatalError, match="--hp"):
        runlocal.parse_hyperparameters(items)


def test_resourceconfig_names_every_host_in_one_group() -> None:
    hosts = runlocal.host_names(3)
    assert hosts == ["algo-1", "algo-2", "algo-3"]
    assert runlocal.resource_config("algo-2", hosts) == {
        "current_host": "algo-2", "current_instance_type": "local",
        "current_group_name": "homogeneousCluster", "hosts": hosts,
        "instance_groups": [{"instance_group_name": "homogeneousCluster",
                             "instance_type": "local", "hosts": hosts}],
        "network_interface_name": "eth0"}


def test_inputdataconfig_has_one_file_mode_entry_per_channel() -> None:
    entry = {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
             "RecordWrapperType": "None"}
    assert runlocal.input_data_config(["training", "ssh"]) == {"training": entry, "ssh": entry}


def test_layout_gives_each_host_its_config_model_and_output(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    job = spec(tmp_path, hosts=2, channels={"training": data},
               hyperparameters={"epochs": 2})
    runlocal.write_layout(job)
    for host in ("algo-1", "algo-2"):
        config = job.output / host / "input" / "config"
        assert json.loads((config / "resourceconfig.json").read_text())["current_host"] == host
        assert json.loads((config / "resourceconfig.json").read_text())["hosts"] == [
            "algo-1", "algo-2"]
        assert json.loads((config / "hyperparameters.json").read_text())["epochs"] == "2"
        assert sorted(json.loads((config / "inputdataconfig.json").read_text())) == [
            "ssh", "training"]
        assert (job.output / host / "model").is_dir()
        assert (job.output / host / "output" / "data").is_dir()
    assert (job.output / "ssh").is_dir()


def test_mounts_inputs_read_only_and_model_and_output_writable(tmp_path: Path) -> None:
    data, code = tmp_path / "data", tmp_path / "code"
    job = spec(tmp_path, channels={"training": data}, code=code)
    args = runlocal.mounts(job, "algo-1")
    values = [args[i + 1] for i, arg in enumerate(args) if arg == "--mount"]
    by_target = {dict(p.split("=", 1) for p in v.split(",") if "=" in p)["target"]: v
                 for v in values}
    assert by_target["/opt/ml/code"].endswith(",readonly")
    assert by_target["/opt/ml/input/data/training"].endswith(",readonly")
    assert by_target["/opt/ml/input/data/ssh"].endswith(",readonly")
    assert f"source={job.output / 'algo-1' / 'model'}," in by_target["/opt/ml/model"]
    assert not by_target["/opt/ml/model"].endswith(",readonly")
    assert not by_target["/opt/ml/output"].endswith(",readonly")
    assert "/opt/ml/input/config" in by_target


def test_a_comma_or_colon_in_a_path_stays_one_mount_source(tmp_path: Path) -> None:
    source = tmp_path / "data,v1:2"
    value = runlocal.mount_value(source, "/opt/ml/input/data/training", readonly=True)
    [fields] = csv.reader([value])
    assert fields == ["type=bind", f"source={source}", "target=/opt/ml/input/data/training",
                      "readonly"]


def test_job_names_are_valid_sagemaker_job_names() -> None:
    names = {runlocal.new_job_name() for _ in range(20)}
    assert len(names) == 20
    for name in names:
        assert re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", name), name


def test_default_output_is_under_the_cache_and_nothing_is_created(tmp_path: Path) -> None:
    job = make(tmp_path, hosts=2, hp=["epochs=2"])
    assert job.output == (tmp_path / "cache" / "run-local" / job.job_name).resolve()
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(("flags", "message"), [
    ({"image": None}, "needs --image"),
    ({"hosts": 0}, "--hosts 0: a job needs at least one host"),
    ({"timeout": 0}, "--timeout"),
    ({"code": "missing"}, "--code missing: not a directory"),
    ({"code": "code", "program": "nope.py"}, "--program nope.py: no such file"),
    ({"code": "code", "program": "../train.py"}, "--program ../train.py: give a path"),
    ({"program": "-m train"}, "--program -m train: give a path"),
    ({"program": "/abs/train.py"}, "give a path relative"),
    ({"hp": ["epochs"]}, "--hp epochs: use KEY=VALUE"),
    ({"hp": ["sagemaker_program=x.py"], "program": "y.py"}, "both set sagemaker_program"),
    ({"channel": ["training"]}, "--channel training: use NAME=DIR"),
    ({"channel": ["training=missing"]}, "missing is not a directory"),
    ({"channel": ["ssh=code"]}, "taken by the job's SSH key"),
    ({"channel": ["bad/name=code"]}, "a channel name has"),
    ({"channel": ["a=code", "a=code"]}, "given twice"),
    ({"output": "busy"}, "not an empty directory"),
])
def test_bad_flags_are_refused_before_anything_exists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: dict[str, object],
        message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "old").write_text("")
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(FatalError, match=re.escape(message)):
        make(tmp_path, **flags)
    assert sorted(tmp_path.rglob("*")) == before


def test_an_empty_output_dir_and_a_program_in_a_subdirectory_are_fine(tmp_path: Path) -> None:
    (tmp_path / "code" / "bin").mkdir(parents=True)
    (tmp_path / "code" / "bin" / "train.py").write_text("")
    (tmp_path / "empty").mkdir()
    job = make(tmp_path, code=str(tmp_path / "code"), program="bin/train.py",
               output=str(tmp_path / "empty"))
    assert job.output == (tmp_path / "empty").resolve()
    assert job.code == (tmp_path / "code").resolve()


# Failure files as sagemaker-training 5.1.4 writes them (trainer.train, errors.py).
SCRIPT_ERROR = ('ExecuteUserScriptError:\nExitCode 1\nErrorMessage "raise ValueError('
                '"learning rate must be positive")\n ValueError: learning rate must be '
                'positive"\nCommand "/opt/venv/bin/python3 -- train.py"')
EMPTY_MESSAGE = ('ExecuteUserScriptError:\nExitCode 2\nErrorMessage ""\n'
                 'Command "/opt/venv/bin/python3 -- train.py --fail x"')
FRAMEWORK_ERROR = ("Framework Error: \nTraceback (most recent call last):\n  File \"x.py\", "
                   "line 1, in <module>\nKeyError: 'hosts'\n\n'hosts'")


@pytest.mark.parametrize(("text", "reason"), [
    (SCRIPT_ERROR, "ExecuteUserScriptError: ExitCode 1, ValueError: learning rate must be "
                   "positive"),
    (EMPTY_MESSAGE, "ExecuteUserScriptError: ExitCode 2"),
    (FRAMEWORK_ERROR, "Framework Error: 'hosts'"),
    ("out of disk space\nmore", "out of disk space"),
    ("\n\n", None),
])
def test_failure_reason_is_one_line(tmp_path: Path, text: str, reason: str | None) -> None:
    path = tmp_path / "failure"
    path.write_text(text)
    assert runlocal.failure_reason(path) == reason


def test_no_failure_file_gives_no_reason(tmp_path: Path) -> None:
    assert runlocal.failure_reason(tmp_path / "failure") is None


def result(tmp_path: Path, *hosts: HostResult, timed_out: bool = False) -> JobResult:
    return JobResult(spec=spec(tmp_path, hosts=len(hosts), timeout=5), hosts=list(hosts),
                     duration=1.25, timed_out=timed_out)


def test_a_failed_host_is_one_sentence_with_its_code_and_reason(tmp_path: Path) -> None:
    failed = result(tmp_path, HostResult("algo-1", "c1", "stopped"),
                    HostResult("algo-2", "c2", "failed", 1, failure="ValueError: bad"))
    assert failed.status == "Failed"
    with pytest.raises(TrainingJobError) as caught:
        runlocal.require_success(failed)
    assert caught.value.return_code == 11
    message = str(caught.value)
    assert "host algo-2 exited with code 1: ValueError: bad" in message
    assert message.count(". ") == 0
    assert "\n" not in message


def test_a_timeout_names_the_hosts_still_running(tmp_path: Path) -> None:
    late = result(tmp_path, HostResult("algo-1", "c1", "completed", 0),
                  HostResult("algo-2", "c2", "timed out"), timed_out=True)
    assert late.status == "TimedOut"
    with pytest.raises(TrainingJobError, match=r"timed out after 5 s with algo-2 still"):
        runlocal.require_success(late)


def test_report_json_has_every_host(tmp_path: Path) -> None:
    done = result(tmp_path, HostResult("algo-1", "c1", "completed", 0,
                                       model_files=["model.json"]))
    runlocal.require_success(done)
    report = done.to_json()
    assert report["status"] == "Completed"
    assert report["duration_s"] == 1.25
    assert report["hosts"] == [{"host": "algo-1", "status": "completed", "exit_code": 0,
                                "oom_killed": False, "failure": None,
                                "model_dir": str(tmp_path / "out" / "algo-1" / "model"),
                                "model_files": ["model.json"]}]
    assert "algo-1   completed  exit 0" in runlocal.summary(done)


def test_cli_refuses_bad_flags_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "run-local",
                           "--image", "example/train:1", "--hosts", "0", "--hp", "x",
                           "--output", str(tmp_path / "out")],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("imageforge: error: --hosts 0: give a whole number of at "
                                   "least 1.")
    assert not (tmp_path / "out").exists()

"""test-image without Docker: the generated script (run by the host's bash), its parsing,
hardware skips, the table, JSON, JUnit XML, the digest record and build's exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from invoke.config import Config
from invoke.context import Context
from invoke.exceptions import Exit

import tasks
from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.buildkit.results import BuildResult
from imageforge.errors import ImageCheckError
from imageforge.image import checkreport, checks, smoke
from imageforge.image.checks import CheckResult, CheckRun, PlannedCheck
from imageforge.model.stage import Check, Needs
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
MARKER = "@@imageforge-test"


def bash(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """What the container does with the script: `bash -s` reading it from stdin."""
    return subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True,
                          check=False, env={**os.environ, **(env or {})}, timeout=60)


def outcomes_of(*scripts: str, timeout: int = 60) -> dict[int, checks.Outcome]:
    script = checks.script([Check(name=f"c{i}", script=s) for i, s in enumerate(scripts)],
                           marker=MARKER, timeout=timeout)
    return checks.parse(bash(script).stdout, marker=MARKER)


def test_each_check_gets_its_exit_code_output_and_time() -> None:
    found = outcomes_of("echo hello; echo to-stderr >&2",
                        "printf 'no newline at the end'; exit 3",
                        "sleep 0.2")
    assert found[0].exit_code == 0
    assert found[0].output == "hello\nto-stderr"
    assert found[1].exit_code == 3
    assert found[1].output == "no newline at the end"
    assert found[2].exit_code == 0
    assert 0.2 <= found[2].seconds < 5


def test_quotes_heredocs_and_stdin_readers_stay_inside_their_check() -> None:
    found = outcomes_of("cat <<'EOF'\nit's \"quoted\" $HOME\nEOF",
                        "cat; echo read-nothing",  # would swallow the rest of the script
                        "exit 0")
    assert found[0].output == "it's \"quoted\" $HOME"
    assert found[1].output == "read-nothing"
    assert set(found) == {0, 1, 2}


def test_a_hung_check_stops_at_the_limit_and_the_run_goes_on() -> None:
    found = outcomes_of("sleep 30", "echo after", timeout=1)
    assert found[0].exit_code == 124
    assert found[0].seconds < 10
    assert found[1].output == "after"


def test_a_check_the_container_never_finished_fails_with_why() -> None:
    stdout = f"{MARKER} begin 0\nok\n\n{MARKER} end 0 0 1000\n{MARKER} begin 1\npartial"
    found = checks.parse(stdout, marker=MARKER)
    assert found[0].exit_code == 0
    assert found[1].exit_code is None
    planned = PlannedCheck(stage="nccl", check=Check(name="c1", script="true"))
    result = checks.result_of(planned, found.get(1), "the container exited with 137")
    assert result.result == "fail"
    assert "partial" in result.output
    assert "did not finish: the container exited with 137" in result.output
    assert checks.result_of(planned, None, "gone").result == "fail"


def fake_docker(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Runs the script with the host's bash instead of in a container; records the argv."""
    calls: list[list[str]] = []

    def run(args: Sequence[str], *, timeout: float | None = None,
            input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        del timeout  # the stub runs the host's bash without the limit
        calls.append(list(args))
        return subprocess.run(["bash", "-s"], input=input, capture_output=True, check=False)

    monkeypatch.setattr(checks, "run", run)
    monkeypatch.setattr(checks, "docker_binary", lambda: "docker")
    return calls


def planned_check(stage: str, name: str, script: str, needs: Needs = "none") -> PlannedCheck:
    return PlannedCheck(stage=stage, check=Check(name=name, script=script, needs=needs))


def test_hardware_checks_are_skipped_not_run_unless_asked(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    calls = fake_docker(monkeypatch)
    flag = tmp_path / "ran"
    planned = [planned_check("efa", "fi_info", "true"),
               planned_check("efa", "provider", f"touch {flag}", needs="efa"),
               planned_check("pytorch", "gpu", f"touch {flag}", needs="gpu"),
               planned_check("nccl", "broken", "echo bad; exit 1")]
    results = checks.run_checks("img", planned)
    assert [r.result for r in results] == ["ok", "skipped", "skipped", "fail"]
    assert results[1].output == "needs hardware"
    assert not flag.exists()
    assert len(calls) == 1, "every check of an image runs in one container"
    assert calls[0][-3:] == ["bash", "img", "-s"]
    assert "--gpus" not in calls[0]
    results = checks.run_checks("img", planned, hardware=True)
    assert [r.result for r in results] == ["ok", "ok", "ok", "fail"]
    assert flag.exists()


def test_hardware_args_hand_over_the_hosts_devices(tmp_path: Path) -> None:
    assert checks.hardware_args(tmp_path) == []
    (tmp_path / "nvidiactl").touch()
    (tmp_path / "infiniband").mkdir()
    (tmp_path / "infiniband" / "uverbs0").touch()
    args = checks.hardware_args(tmp_path)
    assert args[:2] == ["--gpus", "all"]
    assert f"--device={tmp_path}/infiniband/uverbs0" in args
    assert "memlock=-1:-1" in args


def test_environment_check_compares_with_what_the_stage_declares() -> None:
    ctx = project.plan(Workspace(registry=STAGES, manifest=ROOT / "manifests/sample.toml"),
                       "smddp").context
    check = checks.environment_check(STAGES["efa"], ctx)
    assert check is not None
    assert "RDMAV_FORK_SAFE" in check.name
    good = {"RDMAV_FORK_SAFE": "1", "EFA_VERSION": "1.14.1",
            "PATH": "/opt/amazon/openmpi/bin:/opt/amazon/efa/bin:/usr/bin",
            "LD_LIBRARY_PATH": "/x:/opt/amazon/efa/lib:/opt/amazon/openmpi/lib"}
    assert bash(check.script, good).returncode == 0
    bad = bash(check.script, {**good, "RDMAV_FORK_SAFE": "0", "LD_LIBRARY_PATH": "/x"})
    assert bad.returncode != 0
    assert "RDMAV_FORK_SAFE=0, want 1" in bad.stdout
    assert "LD_LIBRARY_PATH lacks /opt/amazon/efa/lib" in bad.stdout
    assert checks.environment_check(STAGES["boost"], ctx) is None


@pytest.mark.parametrize(("manifest", "target"), [
    ("manifests/sample.toml", "smddp"), ("manifests/smddp.toml", "smddp"),
    ("manifests/efa-nccl.toml", "efa-nccl"), ("manifests/pt25-cu124.toml", "smddp")])
def test_every_image_script_is_valid_bash(manifest: str, target: str, tmp_path: Path) -> None:
    planned = project.plan(Workspace(registry=STAGES,
                                            manifest=ROOT / manifest, cache_dir=tmp_path),
                           target)
    found = checks.image_checks(planned)
    assert {c.stage for c in found} >= {"efa", "nccl", "aws-ofi-nccl"}
    assert any(c.check.needs == "efa" for c in found)
    for c in found:
        assert subprocess.run(["bash", "-n", "-c", c.check.script], check=False).returncode == 0
    script = checks.script([c.check for c in found], marker=MARKER)
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0


def fake_ldconfig(tmp_path: Path, *lines: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "ldconfig"
    tool.write_text("#!/bin/sh\necho '2 libs found in cache'\n" +
                    "".join(f"printf '\\t%s\\n' '{line}'\n" for line in lines))
    tool.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_one_libnccl_counts_files_not_names(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "libnccl.so.2.10.3").write_bytes(b"x")
    (one / "libnccl.so.2").symlink_to("libnccl.so.2.10.3")
    env = fake_ldconfig(tmp_path, f"libnccl.so.2 (libc6,x86-64) => {one}/libnccl.so.2")
    script = smoke.one_visible("libnccl.so")
    single = bash(script, {**env, "LD_LIBRARY_PATH": f"{one}:{two}"})
    assert single.returncode == 0, single.stdout
    (two / "libnccl.so.2.11.4").write_bytes(b"y")
    double = bash(script, {**env, "LD_LIBRARY_PATH": f"{one}:{two}"})
    assert double.returncode != 0
    assert "2 libnccl.so* visible" in double.stdout
    assert "libnccl.so.2.11.4" in double.stdout


def test_links_reports_missing_files_and_unresolved_libraries(tmp_path: Path) -> None:
    assert bash(smoke.links("/bin/sh")).returncode == 0
    missing = bash(smoke.links(f"{tmp_path}/*.so"))
    assert missing.returncode != 0
    assert "missing" in missing.stdout
    ldd = tmp_path / "bin" / "ldd"
    ldd.parent.mkdir()
    ldd.write_text("#!/bin/sh\nprintf '\\tlibcuda.so.1 => not found\\n'\n"
                   "[ -z \"$LIBFABRIC\" ] || printf '\\tlibfabric.so.1 => not found\\n'\n")
    ldd.chmod(0o755)
    env = {"PATH": f"{ldd.parent}:{os.environ['PATH']}"}
    # The driver library comes from the host with the GPU, not from the image.
    assert bash(smoke.links("/bin/sh"), env).returncode == 0
    unresolved = bash(smoke.links("/bin/sh"), {**env, "LIBFABRIC": "1"})
    assert unresolved.returncode != 0
    assert "libfabric.so.1 => not found" in unresolved.stdout


def result(stage: str, name: str, state: str, output: str = "", needs: Needs = "none",
           code: int | None = 0) -> CheckResult:
    return CheckResult(stage=stage, name=name, needs=needs, result=state,  # type: ignore[arg-type]
                       seconds=0.5, output=output, exit_code=code)


def sample_run(*, failing: bool) -> CheckRun:
    results = [result("efa", "fi_info runs", "ok", "fi_info: 1.13.2"),
               result("efa", "fi_info -p efa", "skipped", "needs hardware", "efa", None)]
    if failing:
        results.append(result("pytorch", "libnccl loaded by import torch", "fail",
                              "Traceback\n\x1b[31mAssertionError: reports NCCL 2.11.4, "
                              "the nccl stage is 2.10.3", code=1))
    return CheckRun(image="img:tag", digest="sha256:" + "ab" * 32, target="smddp",
                    manifest="manifests/sample.toml", hardware=False,
                    started="2026-01-01T00:00:00Z", seconds=1.5, results=tuple(results))


def test_table_lists_every_check_and_the_failed_output() -> None:
    text = checkreport.table(sample_run(failing=True))
    rows = text.splitlines()
    assert rows[0].split() == ["stage", "check", "result", "seconds"]
    assert "needs hardware" in rows[2]
    assert rows[2].rstrip().endswith("-")
    assert "FAIL" in rows[3]
    assert "0.50" in rows[3]
    assert "--- FAIL pytorch: libnccl loaded by import torch" in text
    assert "1 ok, 1 failed, 1 skipped: needs hardware" in text


def test_json_report_has_every_check_with_its_reason() -> None:
    data = checkreport.to_json(sample_run(failing=True))
    assert data["passed"] is False
    assert data["digest"].startswith("sha256:")
    assert [r["result"] for r in data["results"]] == ["ok", "skipped", "fail"]
    skipped = data["results"][1]
    assert skipped["reason"] == "needs hardware"
    assert skipped["needs"] == "efa"
    assert data["results"][0]["reason"] is None
    json.dumps(data)


def test_junit_xml_is_well_formed_with_skips_and_failures(tmp_path: Path) -> None:
    run = sample_run(failing=True)
    path = tmp_path / "out" / "junit.xml"
    checkreport.write_reports(run, junit_path=path)
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    assert root.tag == "testsuites"
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    cases = suite.findall("testcase")
    assert [c.get("classname") for c in cases] == ["smddp.efa", "smddp.efa", "smddp.pytorch"]
    skipped = cases[1].find("skipped")
    assert skipped is not None
    assert skipped.attrib == {"message": "needs hardware"}
    failure = cases[2].find("failure")
    assert failure is not None
    assert failure.text is not None
    assert "reports NCCL 2.11.4" in failure.text
    assert "\x1b" not in failure.text
    assert (failure.get("message") or "").startswith("exit 1: ")


def test_record_is_kept_by_digest_only_while_runs_pass(tmp_path: Path) -> None:
    passing = sample_run(failing=False)
    written = checkreport.publish(tmp_path, passing, json_path=tmp_path / "r.json")
    record = tmp_path / "tests" / f"{passing.digest}.json"
    assert written == [tmp_path / "r.json", record]
    found = checkreport.passed_record(tmp_path, passing.digest)
    assert found is not None
    assert found["image"] == "img:tag"
    assert checkreport.publish(tmp_path, sample_run(failing=True)) == []
    assert checkreport.passed_record(tmp_path, passing.digest) is None


def test_require_passed_names_each_failed_check_and_its_last_line() -> None:
    checks.require_passed(sample_run(failing=False))
    with pytest.raises(ImageCheckError) as caught:
        checks.require_passed(sample_run(failing=True))
    message = str(caught.value)
    assert caught.value.return_code == 10
    assert "1 of 3 checks failed in img:tag: pytorch: libnccl loaded by import torch" in message
    assert "2.11.4" in message
    assert "2.10.3" in message


def built(monkeypatch: pytest.MonkeyPatch, run: CheckRun) -> list[str]:
    """Stubs the build and the image checks; returns the images checked."""
    import imageforge.app.build

    checked: list[str] = []

    def fake_build(_settings: Workspace, options: Any) -> BuildResult:
        return BuildResult(target=options.target, tag="img:tag", stages=(), seconds=1.0,
                           report=None)

    def fake_tests(_planned: Any, image: str, *, hardware: bool = False) -> CheckRun:
        del hardware  # the stub answers with the given run either way
        checked.append(image)
        return run

    monkeypatch.setattr(imageforge.app.build, "build", fake_build)
    monkeypatch.setattr(checks, "run_image_tests", fake_tests)
    return checked


def invoke_context(tmp_path: Path) -> Context:
    return Context(Config(overrides={"imageforge": {
        "manifest": str(ROOT / "manifests/sample.toml"), "cache_dir": str(tmp_path)}}))


def test_build_exits_10_after_tagging_when_a_check_fails(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    checked = built(monkeypatch, sample_run(failing=True))
    with pytest.raises(Exit) as caught:
        tasks.build(invoke_context(tmp_path), target="smddp")
    assert caught.value.code == 10
    assert checked == ["img:tag"]
    assert "libnccl loaded by import torch" in str(caught.value.message)
    out = capsys.readouterr().out
    assert "image img:tag" in out
    assert "--- FAIL pytorch" in out


def test_build_skips_checks_with_no_test_push_or_a_builder_target(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    checked = built(monkeypatch, sample_run(failing=True))
    context = invoke_context(tmp_path)
    tasks.build(context, target="smddp", test=False)
    tasks.build(context, target="smddp", push=True, tag="registry.example.com/smddp:1")
    tasks.build(context, target="nccl")
    assert checked == []
    built(monkeypatch, sample_run(failing=False))
    tasks.build(context, target="smddp")
    assert (tmp_path / "tests" / f"{sample_run(failing=False).digest}.json").exists()


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '"passed"', '{"passed": "yes"}'])
def test_a_corrupt_test_record_is_no_proof_and_no_traceback(tmp_path: Path, text: str) -> None:
    """`promote` raised JSONDecodeError or AttributeError on a record like these."""
    digest = "sha256:" + "b" * 64
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / f"{digest}.json").write_text(text)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(root), "promote",
                             "--image", f"127.0.0.1:9/x@{digest}", "--tag", "golden"],
                            cwd=root, env=env, capture_output=True, text=True, check=False,
                            timeout=120)
    assert "Traceback" not in result.stderr
    assert result.returncode == 10, result.stderr
    assert f"{digest} has no passing `invoke test-image` record" in result.stderr

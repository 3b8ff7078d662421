"""test-image on real images of the sample upstream: the built image passes every check that
runs without hardware; images made inconsistent after the build (another NCCL copied in)
fail the NCCL checks with exit code 10."""

from __future__ import annotations

import json
import subprocess
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import docker_out, invoke, untagging

RUN = uuid.uuid4().hex[:8]
LOADED_CHECK = "libnccl loaded by import torch is the nccl stage's (ncclGetVersion)"
NCCL_LOADED_CHECK = "ncclGetVersion of the libnccl a process loads is the pin"
ONE_CHECK = "exactly one libnccl visible to the dynamic linker"


# Every image this module made is untagged at its end (the layers stay in BuildKit's cache).
remove_tags = untagging(RUN)


@pytest.fixture(scope="module")
def built(sample_manifest: Path, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    """`invoke build` of the sample smddp image, which runs the checks itself."""
    result = invoke("build", "--target", "smddp", "--manifest", str(sample_manifest),
                    "--tag", f"imageforge-test/checks-smddp:{RUN}", "--progress", "plain",
                    cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def smddp_image(built: subprocess.CompletedProcess[str]) -> str:
    del built  # requested for the build that tags the image (usefixtures is for tests)
    return f"imageforge-test/checks-smddp:{RUN}"


@pytest.fixture(scope="module")
def nccl_2_11(sample_manifest: Path, cache_dir: Path, upstream: str) -> str:
    """The nccl stage built at the sample's NCCL 2.11.4 (its files under /out)."""
    with urllib.request.urlopen(f"{upstream}/pins.json") as response:
        commit = json.load(response)["repos"]["nccl"]["tags"]["v2.11.4-1"]
    tag = f"imageforge-test/nccl:2.11.4-{RUN}"
    result = invoke("build", "--target", "nccl", "--manifest", str(sample_manifest),
                    "--set", "stages.nccl.version=2.11.4", "--set", f"stages.nccl.commit={commit}",
                    # A build of the wrong NCCL on purpose: the rule that refuses it is waived.
                    "--set", "waive.nccl-pytorch-pin=an NCCL swapped in after the build",
                    "--tag", tag, "--progress", "plain", cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    return tag


def derived(base: str, nccl: str, destination: str, context: Path) -> str:
    """`base` with NCCL 2.11.4's library copied to `destination` after the build."""
    tag = f"imageforge-test/checks-broken-{uuid.uuid4().hex[:8]}:{RUN}"
    dockerfile = (f"FROM {nccl} AS other\nFROM {base}\n"
                  f"COPY --from=other /out/opt/conda/lib/libnccl.so.2.11.4 {destination}\n")
    subprocess.run(["docker", "build", "--quiet", "--tag", tag, "--file", "-", str(context)],
                   input=dockerfile, text=True, capture_output=True, check=True)
    return tag


def run_test_image(manifest: Path, cache: Path, image: str, *extra: str
               ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    report = cache / f"report-{uuid.uuid4().hex[:8]}.json"
    result = invoke("test-image", "--target", "smddp", "--manifest", str(manifest),
                    "--image", image, "--json", str(report), *extra, cache=cache)
    return result, json.loads(report.read_text())


def test_build_runs_the_checks_and_lists_hardware_ones(built: subprocess.CompletedProcess[str]
                                                       ) -> None:
    out = built.stdout
    assert LOADED_CHECK in out
    assert ONE_CHECK in out
    assert "FAIL" not in out
    assert "fi_info -p efa -t FI_EP_RDM lists the EFA provider" in out
    assert "needs hardware" in out


def test_every_check_passes_with_reports_written(smddp_image: str, sample_manifest: Path,
                                                 cache_dir: Path, tmp_path: Path) -> None:
    result = invoke("test-image", "--target", "smddp", "--manifest", str(sample_manifest),
                    "--image", smddp_image, "--report", str(tmp_path), cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "test-image-smddp.json").read_text())
    assert data["passed"] is True
    assert data["hardware"] is False
    states = {(r["stage"], r["name"]): r["result"] for r in data["results"]}
    assert set(states.values()) == {"ok", "skipped"}
    assert {stage for stage, _ in states} >= {"efa", "nccl", "aws-ofi-nccl", "pytorch",
                                              "boost", "smddp"}
    for r in data["results"]:
        assert (r["result"] == "skipped") == (r["needs"] != "none")
        assert r["reason"] == ("needs hardware" if r["result"] == "skipped" else None)
    assert states[("pytorch", LOADED_CHECK)] == "ok"
    # setup.py install --root exports none of torch's requirements; the stage installs them.
    assert states[("pytorch", "torch's runtime requirements are installed")] == "ok"
    assert "environment: DLC_CONTAINER_TYPE, LD_LIBRARY_PATH" in {
        name for stage, name in states if stage == "smddp"}
    assert states[("sagemaker-training", "environment: SAGEMAKER_TRAINING_MODULE")] == "ok"

    suite = ET.parse(tmp_path / "test-image-smddp.xml").getroot().find("testsuite")
    assert suite is not None
    assert suite.get("failures") == "0"
    cases = suite.findall("testcase")
    assert len(cases) == len(data["results"])
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert skipped
    assert all(c.find("skipped").attrib == {"message": "needs hardware"}  # type: ignore[union-attr]
               for c in skipped)
    assert int(suite.get("skipped", "0")) == len(skipped)

    digest = docker_out("image", "inspect", "--format", "{{.Id}}", smddp_image)
    record = json.loads((cache_dir / "tests" / f"{digest}.json").read_text())
    assert record["passed"] is True
    assert record["image"] == smddp_image


def test_nccl_swapped_in_after_the_build_fails_with_both_versions(
        smddp_image: str, nccl_2_11: str, sample_manifest: Path, cache_dir: Path,
        tmp_path: Path) -> None:
    # The file keeps its 2.10.3 name; only ncclGetVersion tells the libraries apart.
    image = derived(smddp_image, nccl_2_11, "/opt/conda/lib/libnccl.so.2.10.3", tmp_path)
    result, data = run_test_image(sample_manifest, cache_dir, image)
    assert result.returncode == 10, result.stdout + result.stderr
    # Both the library a plain process loads and the one `import torch` maps are 2.11.4.
    assert [r["name"] for r in data["results"] if r["result"] == "fail"] == [
        NCCL_LOADED_CHECK, LOADED_CHECK]
    assert LOADED_CHECK in result.stderr
    assert "reports NCCL 2.11.4, the nccl stage is 2.10.3" in result.stderr
    assert "nccl (ncclGetVersion) is 2.11.4 in the image, pinned 2.10.3" in result.stdout
    assert "Traceback" not in result.stderr
    digest = docker_out("image", "inspect", "--format", "{{.Id}}", image)
    assert not (cache_dir / "tests" / f"{digest}.json").exists()


def test_a_second_libnccl_on_the_library_path_fails(
        smddp_image: str, nccl_2_11: str, sample_manifest: Path, cache_dir: Path,
        tmp_path: Path) -> None:
    image = derived(smddp_image, nccl_2_11, "/usr/local/lib/libnccl.so.2.11.4", tmp_path)
    result, data = run_test_image(sample_manifest, cache_dir, image)
    assert result.returncode == 10, result.stdout + result.stderr
    failed = [r for r in data["results"] if r["result"] == "fail"]
    assert [r["name"] for r in failed] == [ONE_CHECK]
    assert "/usr/local/lib/libnccl.so.2.11.4" in failed[0]["output"]
    assert "/opt/conda/lib/libnccl.so.2.10.3" in failed[0]["output"]
    assert ONE_CHECK in result.stderr


def test_hardware_flag_runs_the_efa_checks(sample_manifest: Path, cache_dir: Path) -> None:
    # The sample's fi_info and NCCL act as on an EFA instance, so the hardware checks can
    # run here; on real images they need the devices.
    tag = f"imageforge-test/checks-efa-nccl:{RUN}"
    result = invoke("build", "--target", "efa-nccl", "--manifest", str(sample_manifest),
                    "--tag", tag, "--progress", "plain", "--no-test", cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "environment:" not in result.stdout, "--no-test runs no checks"
    checks = invoke("test-image", "--target", "efa-nccl", "--manifest", str(sample_manifest),
                    "--image", tag, "--hardware", cache=cache_dir)
    assert checks.returncode == 0, checks.stdout + checks.stderr
    assert "needs hardware" not in checks.stdout
    row = next(line for line in checks.stdout.splitlines() if "selects the EFA provider" in line)
    assert " ok " in row

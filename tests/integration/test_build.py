"""`invoke build` end to end: real BuildKit builds of the sample upstream, checked inside."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.integration.conftest import ROOT, docker_out, invoke

RUN = uuid.uuid4().hex[:8]
CHECKOUT_CACHE = ROOT / "cache"
# Host-side download caches that scripts/cuda-base.sh and test_real_parts keep in the
# checkout on purpose, and that other modules may fill while these tests run.
SHARED_DOWNLOADS = ("sources/cuda-wheels", "sources/debs")


def checkout_cache_files() -> dict[str, tuple[int, int]]:
    """Each file under the checkout's cache/ (download caches aside) with its size and mtime."""
    found = {}
    for path in CHECKOUT_CACHE.rglob("*"):
        name = path.relative_to(CHECKOUT_CACHE).as_posix()
        if path.is_dir() or name.startswith(SHARED_DOWNLOADS):
            continue
        info = path.lstat()
        found[name] = (info.st_size, info.st_mtime_ns)
    return found


@pytest.fixture(autouse=True)
def checkout_cache_untouched() -> Iterator[None]:
    """Every command here gets a cache of the test's own: the checkout's cache/ (a user's real
    one) is neither read nor written."""
    before = checkout_cache_files()
    yield
    assert checkout_cache_files() == before


@pytest.fixture(scope="module")
def smddp_image(sample_manifest: Path, cache_dir: Path) -> str:
    tag = f"imageforge-test/smddp:{RUN}"
    result = invoke("build", "--target", "smddp", "--manifest", str(sample_manifest),
                    "--tag", tag, "--progress", "plain", cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "smddp" in result.stdout
    assert "rebuilt:" in result.stdout
    return tag


def run_in(image: str, script: str) -> str:
    return docker_out("run", "--rm", "--entrypoint", "bash", image, "-c", script)


def test_smddp_image_has_every_stage_in_place(smddp_image: str) -> None:
    listing = run_in(smddp_image, "ls /opt/amazon/efa/lib /opt/conda/lib /usr/local/lib "
                                  "/opt/conda/include/boost/version.hpp")
    assert "libfabric.so" in listing
    assert "libnccl.so.2.10.3" in listing
    assert "libnccl-net.so" in listing
    assert "version.hpp" in listing


def test_torch_reports_the_nccl_stage_version(smddp_image: str) -> None:
    version = run_in(smddp_image, "python -c 'import torch; print(torch.cuda.nccl.version())'")
    assert version == "(2, 10, 3)"


def test_plugin_links_without_missing_libraries(smddp_image: str) -> None:
    ldd = run_in(smddp_image, "ldd /usr/local/lib/libnccl-net.so")
    assert "libfabric.so" in ldd
    assert "not found" not in ldd


def test_image_carries_labels_and_environment(smddp_image: str, sample_manifest: Path,
                                              cache_dir: Path) -> None:
    config = json.loads(docker_out("image", "inspect", "--format", "{{json .Config}}",
                                   smddp_image))
    labels = config["Labels"]
    assert labels["io.imageforge.target"] == "smddp"
    assert labels["io.imageforge.version.nccl"] == "2.10.3"
    plan = json.loads(invoke("plan", "--target", "smddp", "--manifest", str(sample_manifest),
                             "--json", cache=cache_dir).stdout)
    for stage in plan["stages"]:
        assert labels[f"io.imageforge.key.{stage['name']}"] == stage["key"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["RDMAV_FORK_SAFE"] == "1"
    assert "/opt/amazon/openmpi/bin" in env["PATH"]
    assert "/opt/amazon/efa/lib" in env["LD_LIBRARY_PATH"]


def test_test_image_runs_every_smoke_check(smddp_image: str, sample_manifest: Path,
                                           cache_dir: Path) -> None:
    result = invoke("test-image", "--target", "smddp", "--manifest", str(sample_manifest),
                    "--image", smddp_image, cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout
    assert "libnccl loaded by import torch is the nccl stage's" in result.stdout


def test_second_build_rebuilds_nothing_and_says_so(smddp_image: str, sample_manifest: Path,
                                                   cache_dir: Path, tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    result = invoke("build", "--target", "smddp", "--manifest", str(sample_manifest), "--tag",
                    smddp_image, "--progress", "plain", "--no-test", "--summary", str(summary),
                    cache=cache_dir)
    assert result.returncode == 0, result.stderr
    assert "nothing rebuilt" in result.stdout
    report = sorted((cache_dir / "reports").glob("*-smddp.json"))[-1]
    stages = json.loads(report.read_text())["stages"]
    assert {s["state"] for s in stages} == {"cached"}
    assert "| smddp | cached |" in summary.read_text()


@pytest.mark.usefixtures("smddp_image")
def test_a_new_smddp_wheel_reruns_only_its_install_step(sample_manifest: Path,
                                                         cache_dir: Path, upstream: str) -> None:
    """The cold build baked smddp after the stages it gathers, reading them as stored
    artifacts, as this build does: BuildKit's layer cache serves every gathering step and
    only the pip install of the new wheel runs (with them read in-bake, all of them ran)."""
    wheel = requests.get(f"{upstream}/files/smdistributed_dataparallel-1.4.1-cp311-cp311-"
                         "linux_x86_64.whl", timeout=30)
    wheel.raise_for_status()
    result = invoke("build", "--target", "smddp", "--manifest", str(sample_manifest),
                    "--set", "stages.smddp.version=1.4.1",
                    "--set", f"stages.smddp.sha256={hashlib.sha256(wheel.content).hexdigest()}",
                    "--tag", f"imageforge-test/smddp:{RUN}-wheel", "--progress", "plain",
                    "--no-test", cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    report = max((cache_dir / "reports").glob("*-smddp.json"), key=lambda p: p.stat().st_mtime)
    stages = {s["name"]: s for s in json.loads(report.read_text())["stages"]}
    assert {n for n, s in stages.items() if s["state"] == "built"} == {"smddp"}
    assert stages["smddp"]["steps"] >= 10
    # At most the install (BuildKit may hold it too, from an earlier build of this wheel).
    assert stages["smddp"]["steps_run"] <= 1, stages["smddp"]
    assert f"{stages['smddp']['steps_run']} of {stages['smddp']['steps']}" in next(
        line for line in result.stdout.splitlines() if line.startswith("smddp "))


def test_efa_nccl_image_from_sample(sample_manifest: Path, cache_dir: Path) -> None:
    tag = f"imageforge-test/efa-nccl:{RUN}"
    # The checks run once, through test-image below.
    result = invoke("build", "--target", "efa-nccl", "--manifest", str(sample_manifest),
                    "--tag", tag, "--progress", "json", "--no-test", cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert {e["stage"] for e in events} >= {"efa", "nccl", "aws-ofi-nccl", "nccl-tests"}
    checks = invoke("test-image", "--target", "efa-nccl", "--manifest", str(sample_manifest),
                    "--image", tag, cache=cache_dir)
    assert checks.returncode == 0, checks.stdout + checks.stderr
    out = run_in(tag, "all_reduce_perf -b 8 -e 128 -f 2 -g 1")
    assert "2.10.3" in out


def test_failing_stage_names_itself_and_shows_its_log(sample_manifest: Path,
                                                      cache_dir: Path) -> None:
    result = invoke("build", "--target", "efa", "--manifest", str(sample_manifest),
                    "--set", "stages.efa.flags=-y,--no-such-flag", "--progress", "plain",
                    cache=cache_dir)
    assert result.returncode == 7
    assert "stage efa failed" in result.stderr
    assert "no-such-flag" in result.stderr
    assert "Traceback" not in result.stderr


def test_stopped_daemon_is_one_clear_error(sample_manifest: Path, tmp_path: Path) -> None:
    result = invoke("build", "--target", "efa", "--manifest", str(sample_manifest),
                    cache=tmp_path / "cache",
                    env={"DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"})
    assert result.returncode == 6
    assert "Docker daemon is not running" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_missing_buildx_is_one_clear_error(sample_manifest: Path, tmp_path: Path) -> None:
    # A docker CLI without the buildx plugin: the real client for everything else.
    real = docker_out("context", "inspect", "--format", "{{.Name}}")  # daemon reachable
    assert real
    shim = tmp_path / "bin" / "docker"
    shim.parent.mkdir()
    shim.write_text('#!/bin/sh\nif [ "$1" = buildx ]; then\n'
                    '  echo "docker: \'buildx\' is not a docker command." >&2; exit 1\nfi\n'
                    f'exec {docker_path()} "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    # A cache of its own and empty (not this module's, which holds efa already): the build
    # must reach the bake, where the missing buildx shows.
    cache = tmp_path / "cache"
    result = invoke("build", "--target", "efa", "--manifest", str(sample_manifest),
                    cache=cache, env={"PATH": f"{shim.parent}:{os.environ['PATH']}"})
    assert result.returncode == 6
    assert "buildx is not installed" in result.stderr
    # It got that far: the efa installer was fetched, into this cache (before, the checkout's).
    assert [p.name for p in (cache / "sources").rglob("*.tar.gz")] == \
        ["aws-efa-installer-1.14.1.tar.gz"]


def docker_path() -> str:
    import shutil

    path = shutil.which("docker")
    assert path
    return path

"""The image SageMaker runs, built from the sample upstream: `docker run IMAGE train` runs
the user's program with the job's hyperparameters, the code is a cheap last stage, hosts of
one job reach each other over SSH with keys made at start, and an image can be extended."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, docker_out, invoke

EXAMPLE = ROOT / "examples" / "train"


def fit(epochs: int, lr: float) -> float:
    w = 0.0
    for _ in range(epochs):
        w -= lr * 2 * (w - 3)
    return w


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("code") / "train"
    shutil.copytree(EXAMPLE, path)
    return path


def build(manifest: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = invoke("build", "--manifest", str(manifest), "--progress", "plain", "--no-test",
                    *args, cache=cache)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def rebuilt(result: subprocess.CompletedProcess[str]) -> list[str]:
    line = next(x for x in result.stdout.splitlines() if "rebuilt" in x)
    return [] if line.startswith("nothing rebuilt") else line.removeprefix("rebuilt: ").split(", ")


@pytest.fixture(scope="module")
def code_image(sample_manifest: Path, cache_dir: Path, code_dir: Path) -> str:
    tag = "imageforge-test/contract:code"
    build(sample_manifest, cache_dir, "--code", str(code_dir), "--program", "train.py",
          "--tag", tag)
    return tag


def opt_ml(root: Path, hyperparameters: dict[str, str]) -> list[str]:
    """The /opt/ml directories SageMaker mounts into a training container, as docker -v."""
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (config / "resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"}))
    (config / "inputdataconfig.json").write_text(json.dumps(
        {"training": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"}}))
    (root / "input" / "data" / "training").mkdir(parents=True)
    (root / "model").mkdir()
    (root / "output").mkdir()
    return [arg for name in ("input", "model", "output")
            for arg in ("-v", f"{root / name}:/opt/ml/{name}")]


def test_train_runs_the_program_with_the_hyperparameters(code_image: str, tmp_path: Path) -> None:
    mounts = opt_ml(tmp_path, {"epochs": "4", "lr": "0.25", "optimizer": '"sgd"'})
    run = subprocess.run(["docker", "run", "--rm", "--hostname", "algo-1", *mounts, code_image,
                          "train"], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    model = json.loads((tmp_path / "model" / "model.json").read_text())
    assert model["hyperparameters"] == {"epochs": 4, "lr": 0.25, "optimizer": "sgd"}
    assert model["argv"] == ["--epochs", "4", "--lr", "0.25", "--optimizer", "sgd"]
    assert model["weight"] == pytest.approx(fit(4, 0.25))
    assert model["hosts"] == ["algo-1"]


def test_a_failing_program_fails_the_job(code_image: str, tmp_path: Path) -> None:
    mounts = opt_ml(tmp_path, {"lr": "0.1"})  # --epochs is required
    run = subprocess.run(["docker", "run", "--rm", "--hostname", "algo-1", *mounts, code_image,
                          "train"], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode != 0
    failure = (tmp_path / "output" / "failure").read_text()
    assert "ExitCode 2" in failure  # argparse's exit
    assert "train.py --lr 0.1" in failure
    assert not (tmp_path / "model" / "model.json").exists()


def layer_files(image: str, tmp: Path) -> set[str]:
    """Every path any layer of `image` adds (a file a later layer deletes is still here)."""
    subprocess.run(["docker", "save", "-o", str(tmp / "image.tar"), image], check=True)
    names: set[str] = set()
    with tarfile.open(tmp / "image.tar") as saved:
        for member in saved:
            blob = saved.extractfile(member) if member.isfile() else None
            if blob is None or member.size < 1024:
                continue
            try:
                with tarfile.open(fileobj=blob, mode="r:*") as layer:
                    names.update(layer.getnames())
            except tarfile.TarError:
                continue  # a manifest or config blob
    return names


def test_no_ssh_key_is_in_any_layer_of_the_image(code_image: str, tmp_path: Path) -> None:
    names = layer_files(code_image, tmp_path)
    assert any(n.endswith("usr/sbin/sshd") for n in names)  # the scan sees the layers
    keys = [n for n in names if re.search(r"etc/ssh/ssh_host_\w+_key|root/\.ssh/id_", n)]
    assert keys == []


def test_two_hosts_see_each_other_and_log_in_with_keys_made_at_start(code_image: str,
                                                                      tmp_path: Path) -> None:
    result = invoke("run-local", "--image", code_image, "--hosts", "2", "--hp", "epochs=3",
                    "--hp", "lr=0.1", "--output", str(tmp_path / "job"), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    first = json.loads((tmp_path / "job/algo-1/model/model.json").read_text())
    second = json.loads((tmp_path / "job/algo-2/model/model.json").read_text())
    for host, model in (("algo-1", first), ("algo-2", second)):
        assert model["resourceconfig"]["current_host"] == host
        assert model["resourceconfig"]["hosts"] == ["algo-1", "algo-2"]
        assert model["weight"] == pytest.approx(fit(3, 0.1))
    ssh = first["ssh"]["algo-2"]
    assert ssh["exit"] == 0, ssh["stderr"]
    hostname, _, config = ssh["stdout"].partition("\n")
    assert hostname == "algo-2"
    assert json.loads(config)["current_host"] == "algo-2"
    assert second["reached_by"] == "algo-1"
    # Each container made its own host keys when it started.
    assert first["host_key"] != second["host_key"]
    job_key = (tmp_path / "job/ssh/id_ed25519.pub").read_text().split()[1]
    assert job_key not in docker_out("run", "--rm", "--entrypoint", "sh", code_image, "-c",
                                     "cat /root/.ssh/* 2>/dev/null; true")


@pytest.mark.usefixtures("code_image")
def test_a_code_change_rebuilds_only_the_code_stage(sample_manifest: Path, cache_dir: Path,
                                                    tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere"
    shutil.copytree(EXAMPLE, moved)
    args = ("--code", str(moved), "--program", "train.py")
    # The same code in another directory is the same stage: nothing to build.
    assert rebuilt(build(sample_manifest, cache_dir, *args)) == []
    with (moved / "train.py").open("a") as handle:
        handle.write("# a comment is a change too\n")
    plan = json.loads(invoke("plan", "--manifest", str(sample_manifest), "--target", "code",
                             "--json", "--set", f"stages.code.dir={moved}", "--set",
                             "stages.code.program=train.py", cache=cache_dir).stdout)
    assert [s["name"] for s in plan["stages"] if s["status"] == "build"] == ["code"]
    assert rebuilt(build(sample_manifest, cache_dir, *args)) == ["code"]


def extending(path: Path, ref: str, code: Path, extra: str = "") -> Path:
    path.write_text(f"""
[image]
name = "extended"
extends = "{ref}"
cuda_arch = ["7.0", "8.0"]
python = "3.11"
apt = false
{extra}
[stages.code]
dir = "{code}"
program = "train.py"
""")
    return path


def test_extending_an_image_builds_only_what_its_labels_lack(
        sample_manifest: Path, cache_dir: Path, code_dir: Path, tmp_path: Path) -> None:
    base = "imageforge-test/contract:smddp"
    build(sample_manifest, cache_dir, "--target", "smddp", "--tag", base)
    manifest = extending(tmp_path / "extended.toml", base, code_dir)
    locked = invoke("lock", "--manifest", str(manifest), cache=cache_dir)
    assert locked.returncode == 0, locked.stderr
    lock = json.loads((tmp_path / "extended.lock.json").read_text())
    assert lock["extends"]["from"]["ref"] == base
    assert {"efa", "nccl", "pytorch", "sagemaker-training", "smddp"} <= \
        set(lock["extends"]["provides"])
    # Built here, in no registry: its ID is a fact of this machine, kept in the local cache.
    assert lock["extends"]["digest"] is None
    assert json.loads((cache_dir / "local/images.json").read_text())[base].startswith("sha256:")
    plan = json.loads(invoke("plan", "--manifest", str(manifest), "--target", "code", "--json",
                             cache=cache_dir).stdout)
    assert [s["name"] for s in plan["stages"]] == ["base", "code"]
    result = build(manifest, cache_dir, "--target", "code", "--tag", "imageforge-test/ext:1")
    assert rebuilt(result) == ["code"]
    job = invoke("run-local", "--image", "imageforge-test/ext:1", "--hp", "epochs=2", "--hp",
                 "lr=0.5", "--output", str(tmp_path / "job"), timeout=600)
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
    model = json.loads((tmp_path / "job/algo-1/model/model.json").read_text())
    assert model["weight"] == pytest.approx(fit(2, 0.5))
    # The tag now names another image: building on it under the old lock is refused.
    moved = f"imageforge-test/contract:moved-{tmp_path.name}"
    subprocess.run(["docker", "tag", base, moved], check=True)
    manifest.write_text(manifest.read_text().replace(base, moved))
    assert invoke("lock", "--manifest", str(manifest), cache=cache_dir).returncode == 0
    subprocess.run(["docker", "tag", "imageforge/base:bookworm", moved], check=True)
    refused = invoke("build", "--manifest", str(manifest), "--target", "code", cache=cache_dir)
    subprocess.run(["docker", "rmi", moved], check=True, capture_output=True)
    assert refused.returncode == 6, refused.stderr
    assert f"image.extends = '{moved}' is sha256:" in refused.stderr
    assert "run `invoke lock`" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_extending_with_declared_stages_builds_smddp_and_code_on_top(
        sample_manifest: Path, cache_dir: Path, code_dir: Path, tmp_path: Path) -> None:
    """The seed's "extend a prebuilt container" path: SMDDP plus the user's code on an
    existing PyTorch training image that says what it has."""
    base = "imageforge-test/contract:smddp"
    build(sample_manifest, cache_dir, "--target", "smddp", "--tag", base)
    smddp = sample_manifest.read_text().split("[stages.smddp]", 1)[1].split("\n[", 1)[0]
    provides = ["efa", "nccl", "aws-ofi-nccl", "python", "pytorch", "torchvision", "boost",
                "sagemaker-training"]
    manifest = extending(tmp_path / "declared.toml", base, code_dir,
                         f"provides = {json.dumps(provides)}\n[stages.smddp]{smddp}")
    assert invoke("lock", "--manifest", str(manifest), cache=cache_dir).returncode == 0
    plan = json.loads(invoke("plan", "--manifest", str(manifest), "--target", "code", "--json",
                             cache=cache_dir).stdout)
    assert [s["name"] for s in plan["stages"]] == ["base", "smddp", "code"]
    assert plan["extends"] == {"ref": base, "provides": provides}
    result = build(manifest, cache_dir, "--target", "code", "--tag", "imageforge-test/ext:2")
    assert rebuilt(result) == ["smddp", "code"]
    checks = invoke("test-image", "--manifest", str(manifest), "--target", "code", "--image",
                    "imageforge-test/ext:2", cache=cache_dir)
    assert checks.returncode == 0, checks.stdout[-3000:] + checks.stderr[-2000:]

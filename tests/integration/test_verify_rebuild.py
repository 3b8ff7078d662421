"""Same pins, same bytes: every stage of the sample rebuilt from scratch comes out byte for
byte as stored, on this engine and on a second one; a stage that is not reproducible is
caught by `invoke verify --rebuild`, which names the stage and the file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from imageforge.app.verify import save_image
from imageforge.errors import DockerError
from tests.integration.conftest import SecondDockerd, invoke

LAYOUTS = {"INVOKE_IMAGEFORGE_IMAGE_ARTIFACTS": "oci-layout"}

# A team's stage whose output holds the time it was built: never the same twice.
CLOCK_STAGE = '''"""clock: the time of the build, in a file."""

from imageforge.model.stage import Stage
from imageforge.planning.dockerfile import run

STAGE = Stage(
    name="clock",
    doc=__doc__ or "",
    deps=("base",),
    fields={},
    recipe=lambda _ctx: run("mkdir -p /out/opt/clock", "date +%s%N > /out/opt/clock/stamp",
                            "echo same > /out/opt/clock/same"),
    reproducible=REPRODUCIBLE,
)
'''


def digests(cache: Path) -> dict[str, str]:
    """stage -> the digest of its stored artifact."""
    found = {}
    for meta in (cache / "artifacts" / "entries").glob("*/meta.json"):
        entry = json.loads(meta.read_text())
        found[entry["stage"]] = entry["digest"]
    return found


def private_mounts(engine: SecondDockerd) -> set[str]:
    """Descriptions of the cache mounts builds from nothing gave ids of their own, in the
    second engine: only this module's tests build there while they run (tests/conftest.py),
    whereas the host engine's list changes with every other worker's verify."""
    listing = engine.docker("buildx", "du", "--verbose", "--filter",
                            "type=exec.cachemount").stdout
    return {line for line in listing.splitlines()
            if line.startswith("Description:") and "-verify-" in line}


def verify(target: str, cache: Path, *args: str, env: dict[str, str] | None = None
           ) -> tuple[int, dict[str, Any], str]:
    result = invoke("verify", "--rebuild", "--target", target, "--json", "--progress", "plain",
                    *args, cache=cache, env=env, timeout=1800)
    document = json.loads(result.stdout) if result.stdout.strip() else {}
    return result.returncode, document, result.stderr


@pytest.fixture(scope="module")
def built(sample_manifest: Path, cache_dir: Path) -> dict[str, str]:
    result = invoke("build", "--target", "smddp", "--manifest", str(sample_manifest),
                    "--no-test", "--progress", "plain", cache=cache_dir, env=LAYOUTS,
                    timeout=1800)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return digests(cache_dir)


def test_every_stage_rebuilt_from_scratch_on_a_second_engine_is_byte_identical(
        built: dict[str, str], sample_manifest: Path, cache_dir: Path, second_builder: str,
        dockerd2: SecondDockerd) -> None:
    """Built on the host engine, every stage rebuilt from scratch on the second one (through
    --builder, its docker context): the same bytes. (A whole second build of the chain there
    is this by induction: each stage is rebuilt from the very inputs the chain gives it.)"""
    assert set(built) == {"efa", "python", "nccl", "aws-ofi-nccl", "pytorch", "torchvision",
                          "boost", "sagemaker-training", "smddp"}
    before = private_mounts(dockerd2)
    code, document, stderr = verify("smddp", cache_dir, "--manifest", str(sample_manifest),
                                    "--builder", second_builder, env=LAYOUTS)
    assert code == 0, stderr[-3000:]
    # The pip and ccache mounts of its own the rebuild used are gone with it.
    assert private_mounts(dockerd2) <= before
    verdicts = {v["stage"]: v for v in document["stages"]}
    assert set(verdicts) == set(built)
    for stage, verdict in verdicts.items():
        assert verdict["result"] == "same", verdict
        assert verdict["rebuilt"] == verdict["stored"] == built[stage]


def test_an_image_store_artifact_is_the_same_files(sample_manifest: Path,
                                                   tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    result = invoke("build", "--target", "efa", "--manifest", str(sample_manifest),
                    "--no-test", "--progress", "plain", cache=cache)
    assert result.returncode == 0, result.stderr[-3000:]
    code, document, stderr = verify("efa", cache, "--manifest", str(sample_manifest))
    assert code == 0, stderr[-3000:]
    [verdict] = document["stages"]
    # The engine's image store keeps build-time file times, so files are compared instead.
    assert verdict["result"] == "same files", verdict
    assert "file times not compared" in verdict["detail"]


@pytest.mark.parametrize("declared", [False, True])
def test_a_stage_that_is_never_the_same_is_caught(sample_manifest: Path, tmp_path: Path,
                                                  declared: bool) -> None:
    stages = tmp_path / "stages"
    stages.mkdir()
    reproducible = ('False,\n    reproducible_reason="it records the time of the build"'
                    if declared else "True")
    (stages / "clock.py").write_text(CLOCK_STAGE.replace("REPRODUCIBLE", reproducible))
    env = {"INVOKE_IMAGEFORGE_STAGE_DIRS": str(stages)}
    cache = tmp_path / "cache"
    result = invoke("build", "--target", "clock", "--manifest", str(sample_manifest),
                    "--progress", "plain", cache=cache, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    plan = invoke("plan", "--target", "clock", "--manifest", str(sample_manifest), "--json",
                  cache=cache, env=env)
    assert json.loads(plan.stdout).get("not_reproducible") == (
        {"clock": "it records the time of the build"} if declared else None)
    assert ("not reproducible: clock: it records the time of the build" in invoke(
        "plan", "--target", "clock", "--manifest", str(sample_manifest), cache=cache,
        env=env).stdout) is declared

    code, document, stderr = verify("clock", cache, "--manifest", str(sample_manifest),
                                    env=env)
    [verdict] = document["stages"]
    if declared:
        assert code == 0, stderr
        assert verdict["result"] == "declared"
        assert "it records the time of the build" in verdict["detail"]
        return
    assert code == 13, stderr
    assert verdict["result"] == "differs"
    assert "/out/opt/clock/stamp differs (content" in verdict["detail"]
    assert "verify --rebuild: clock" in stderr
    assert "/out/opt/clock/stamp" in stderr
    assert "Traceback" not in stderr
    # Progress lines, then the one sentence.
    assert stderr.strip().splitlines()[-1].startswith("imageforge: error: verify --rebuild: clock")


def test_an_image_alone_is_checked_against_its_pins(sample_manifest: Path, tmp_path: Path,
                                                    dockerd2: SecondDockerd) -> None:
    tag = f"imageforge-test/verify-image:{tmp_path.name[-8:].lower()}"
    cache = tmp_path / "cache"
    result = invoke("build", "--target", "efa-nccl", "--manifest", str(sample_manifest),
                    "--tag", tag, "--no-test", "--progress", "plain", cache=cache)
    assert result.returncode == 0, result.stderr[-3000:]
    # Handed to the verifier's engine (the second one) as an image alone.
    move_image(tag, dockerd2)
    # From the image alone: a verifier's own cache directory, built from nothing.
    before = private_mounts(dockerd2)
    code, document, stderr = verify_image(tag, tmp_path / "verifier", sample_manifest,
                                          engine=dockerd2)
    assert code == 0, stderr[-3000:]
    assert private_mounts(dockerd2) <= before
    [verdict] = document["stages"]
    assert verdict["stage"] == "efa-nccl"
    assert verdict["result"] == "same files", verdict

    # Someone changes an image after it was built: the rebuild says what its pins give.
    # (The efa image, one stage: a second from-nothing rebuild of the whole efa-nccl chain
    # would prove nothing more about telling a changed image apart.)
    efa = f"{tag}-efa"
    result = invoke("build", "--target", "efa", "--manifest", str(sample_manifest),
                    "--tag", efa, "--no-test", "--progress", "plain", cache=cache)
    assert result.returncode == 0, result.stderr[-3000:]
    move_image(efa, dockerd2)
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    (tampered / "Dockerfile").write_text(
        f"FROM {efa}\nRUN echo 'export NCCL_ALGO=Ring' >> /etc/profile\n")
    build = dockerd2.docker("buildx", "build", "--load", "-t", f"{efa}-tampered",
                            str(tampered), check=False)
    assert build.returncode == 0, build.stderr
    code, document, stderr = verify_image(f"{efa}-tampered", tmp_path / "verifier",
                                          sample_manifest, engine=dockerd2)
    assert code == 13, stderr[-3000:]
    [verdict] = document["stages"]
    assert verdict["stage"] == "efa"
    assert verdict["result"] == "differs"
    assert f"rebuilt differently from {efa}-tampered" in stderr

    # Pins this checkout does not have: say which revision to verify from.
    code, _, stderr = verify_image(tag, tmp_path / "verifier", sample_manifest,
                                   "--set", "stages.efa.flags=-y,--skip-kmod", engine=dockerd2)
    assert code == 8, stderr[-3000:]
    assert "check out that revision" in stderr


def move_image(ref: str, engine: SecondDockerd) -> None:
    """`ref` from the host engine into `engine` (docker save | docker load)."""
    save = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
    loaded = subprocess.run(["docker", "load"], stdin=save.stdout, capture_output=True,
                            env={**os.environ, **engine.env}, check=False, timeout=600)
    assert save.wait(timeout=600) == 0
    assert loaded.returncode == 0, loaded.stderr


def verify_image(ref: str, cache: Path, manifest: Path, *args: str, engine: SecondDockerd
                 ) -> tuple[int, dict[str, Any], str]:
    result = invoke("verify", "--rebuild", "--image", ref, "--manifest", str(manifest),
                    "--json", "--progress", "plain", *args, cache=cache, env=engine.env,
                    timeout=1800)
    document = json.loads(result.stdout) if result.stdout.strip() else {}
    return result.returncode, document, result.stderr


@pytest.mark.usefixtures("docker_ready")
def test_an_image_gone_from_the_engine_is_named_with_what_to_do(tmp_path: Path) -> None:
    ref = f"imageforge-test/absent:{tmp_path.name[-8:].lower()}"
    with pytest.raises(DockerError) as caught:
        save_image(ref, tmp_path / "stored")
    assert str(caught.value) == (f"{ref} is not in the Docker engine's image store (removed "
                                 "since it was built?); build it again, then verify.")
    assert list(tmp_path.iterdir()) == []

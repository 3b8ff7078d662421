"""`[stages.nccl] provider = "wheel"` on real parts: the nvidia-nccl-cu13 2.28.9 wheel that the
real torch 2.11.0 wheel pins, locked from PyPI (manifests/torch211-nccl-wheel.lock.json), fetched
from PyPI, unpacked by a real BuildKit build into the nccl stage, and checked inside the image:
the library a process loads is that wheel's file, byte for byte, reporting 2.28.9."""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from stages import STAGES
from tests.integration.conftest import ROOT, derive, docker_out, invoke

RUN = uuid.uuid4().hex[:8]
MANIFEST = ROOT / "manifests" / "torch211-nccl-wheel.toml"
COMMITTED = MANIFEST.with_name("torch211-nccl-wheel.lock.json")
# The nccl stage needs no CUDA toolkit to unpack NCCL nor to call ncclGetVersion: the plain
# Debian base stands in for the CUDA one (only the base entry of the lock moves).
BASE = "image.base=imageforge/base:bookworm"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory,
          cache_dir: Path) -> Iterator[tuple[str, str]]:
    """The build's output and the tag of an image that has the stage: the committed manifest
    and lock, the NCCL pin and wheel as locked from PyPI. nccl is not an image target: its
    build is tagged as its exports (/out on scratch), which are laid over the base as an
    image's assembly does (and ldconfig run)."""
    folder = tmp_path_factory.mktemp("nccl-wheel")
    manifest = folder / MANIFEST.name
    manifest.write_text(MANIFEST.read_text())
    (folder / COMMITTED.name).write_text(COMMITTED.read_text())
    tag = f"imageforge-test/nccl-wheel:{RUN}"
    result = invoke("build", "--manifest", str(manifest), "--set", BASE, "--target", "nccl",
                    "--tag", tag, "--progress", "plain", cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assembled = derive(folder, f"{tag}-assembled", f"""
        FROM {BASE.split('=', 1)[1]}
        COPY --from={tag} /out/ /
        RUN ldconfig
        """)
    yield result.stdout + result.stderr, assembled
    subprocess.run(["docker", "image", "rm", tag, assembled], capture_output=True, check=False)


def test_the_lock_pins_the_wheels_nccl_by_pypis_sha256() -> None:
    lock = json.loads(COMMITTED.read_text())
    pin = lock["nccl_pytorch_pin"]
    assert pin["version"] == "2.28.9"
    assert pin["evidence"]["requires"] == "nvidia-nccl-cu13==2.28.9"
    assert pin["wheel_url"].endswith(
        "/nvidia_nccl_cu13-2.28.9-py3-none-manylinux_2_18_x86_64.whl")
    assert lock["stages"]["nccl"]["src-nccl"]["sha256"] == pin["sha256"]


def test_every_nccl_check_passes_in_the_image(built: tuple[str, str], cache_dir: Path) -> None:
    """The nccl stage's own checks (what test-image runs in an image that has the stage)."""
    output, tag = built
    assert "nvcc" not in output   # nothing was compiled
    settings = Workspace(registry=STAGES, manifest=MANIFEST, overrides=(BASE,),
                                cache_dir=cache_dir)
    planned = project.plan(settings, "nccl")
    checks = STAGES["nccl"].checks(planned.context)
    assert {c.name for c in checks} >= {
        "ncclGetVersion of the libnccl a process loads is the pin",
        "nccl.h declares the pinned version", "exactly one libnccl visible to the dynamic linker"}
    for check in checks:
        run = subprocess.run(["docker", "run", "--rm", "--entrypoint", "bash", tag, "-c",
                              check.script], capture_output=True, text=True,
                             check=False, timeout=120)
        assert run.returncode == 0, f"{check.name}: {run.stdout}{run.stderr}"


def test_the_library_loaded_is_the_wheels_own_file(built: tuple[str, str],
                                                   cache_dir: Path) -> None:
    _, tag = built
    pin = json.loads(COMMITTED.read_text())["nccl_pytorch_pin"]
    [wheel] = (cache_dir / "sources" / "sha256" / pin["sha256"]).glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        record = archive.read("nvidia_nccl_cu13-2.28.9.dist-info/RECORD").decode()
    line = next(row for row in record.splitlines()
                if row.startswith("nvidia/nccl/lib/libnccl.so.2,"))
    digest = base64.urlsafe_b64decode(line.split(",")[1].removeprefix("sha256=") + "==").hex()
    script = ("cd /usr/local/lib && ls libnccl* && "
              "readlink -f libnccl.so.2 libnccl.so && "
              "sha256sum libnccl.so.2.28.9 && python3 -c 'import ctypes; c = ctypes.c_int(); "
              "ctypes.CDLL(\"libnccl.so.2\").ncclGetVersion(ctypes.byref(c)); print(c.value)'")
    out = docker_out("run", "--rm", "--entrypoint", "bash", tag, "-c", script).split()
    assert out[:3] == ["libnccl.so", "libnccl.so.2", "libnccl.so.2.28.9"]
    assert out[3:5] == ["/usr/local/lib/libnccl.so.2.28.9"] * 2
    assert out[5] == digest          # the wheel's bytes, as its RECORD lists them
    assert out[-1] == "22809"        # ncclGetVersion: 2.28.9

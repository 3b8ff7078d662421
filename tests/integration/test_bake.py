"""`invoke render --format bake`: the docker-bake.json that `docker buildx bake` accepts.

The plain bake runs on this worker's own engine (dockerd2), not the host's. With the docker
driver, bake hands each `target:` context to the next target as an untagged image in the
engine (`moby-dangling@<digest>`), and the engine deletes that name as soon as any other
build names an image of the same digest or removes it. Beside the suite's other workers on
the host engine, CI once saw the bake fail with "failed to solve: not found"."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

from tests.integration.conftest import SecondDockerd, invoke


def test_rendered_bake_file_builds_the_image_with_plain_bake(sample_manifest: Path,
                                                             cache_dir: Path, tmp_path: Path,
                                                             dockerd2: SecondDockerd) -> None:
    fetched = invoke("fetch", "--target", "efa-nccl", "--manifest", str(sample_manifest),
                     cache=cache_dir)
    assert fetched.returncode == 0, fetched.stderr
    bake_file = tmp_path / "docker-bake.json"
    rendered = invoke("render", "--format", "bake", "--target", "efa-nccl", "--manifest",
                      str(sample_manifest), "--output", str(bake_file), cache=cache_dir)
    assert rendered.returncode == 0, rendered.stderr
    bake = json.loads(bake_file.read_text())
    assert set(bake["target"]) == {"base", "efa", "nccl", "aws-ofi-nccl", "nccl-tests",
                                   "efa-nccl"}
    assert bake["target"]["aws-ofi-nccl"]["contexts"]["nccl"] == "target:nccl"
    tag = f"imageforge-test/bake:{uuid.uuid4().hex[:8]}"
    built = subprocess.run(
        ["docker", "buildx", "bake", "-f", str(bake_file), "--set", f"efa-nccl.tags={tag}",
         "--set", "efa-nccl.output=type=docker", "--progress", "plain", "efa-nccl"],
        cwd=tmp_path, env={**os.environ, **dockerd2.env}, capture_output=True, text=True,
        check=False, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    try:
        out = dockerd2.docker("run", "--rm", "--entrypoint", "bash", tag, "-c",
                              "all_reduce_perf -b 8 -e 128 -f 2 -g 1 && ls /usr/local/lib")
        assert "libnccl-net.so" in out.stdout
        labels = json.loads(dockerd2.docker("image", "inspect", "--format",
                                            "{{json .Config.Labels}}", tag).stdout)
        assert labels["io.imageforge.target"] == "efa-nccl"
    finally:
        dockerd2.docker("image", "rm", "-f", tag, check=False)

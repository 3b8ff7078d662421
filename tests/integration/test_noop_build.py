"""A build with nothing to do calls no BuildKit at all: every stage is in the artifact store
and the tag already is this plan's image (every label equal). Seen through a `docker` on PATH
that records each command and then runs the real one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.integration.conftest import docker_out, invoke

TAG = f"imageforge-test/noop-smddp:{uuid.uuid4().hex[:8]}"
WAIVER = "waive.nccl-pytorch-pin=a label-only change"


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    bindir = tmp_path_factory.mktemp("traced-docker")
    calls = bindir / "calls.log"
    real = shutil.which("docker")
    assert real is not None
    (bindir / "docker").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\n'
                                   f'exec {real} "$@"\n')
    (bindir / "docker").chmod(0o755)
    return {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}, calls


def build(manifest: Path, cache: Path, env: dict[str, str], *sets: str
          ) -> dict[str, str]:
    """Stage states of the build's report."""
    before = set((cache / "reports").glob("*.json")) if (cache / "reports").exists() else set()
    result = invoke("build", "--target", "smddp", "--manifest", str(manifest), "--no-test",
                    "--tag", TAG, "--progress", "plain",
                    *[w for s in sets for w in ("--set", s)], cache=cache, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (report,) = set((cache / "reports").glob("*.json")) - before
    return {s["name"]: s["state"] for s in json.loads(report.read_text())["stages"]}


def keys(manifest: Path, cache: Path, *sets: str) -> dict[str, str]:
    result = invoke("plan", "--target", "smddp", "--manifest", str(manifest), "--json",
                    *[w for s in sets for w in ("--set", s)], cache=cache)
    assert result.returncode == 0, result.stderr
    return {s["name"]: s["key"] for s in json.loads(result.stdout)["stages"]}


def test_a_noop_build_calls_no_buildkit_and_a_changed_label_does(
        sample_manifest: Path, cache_dir: Path, traced: tuple[dict[str, str], Path]) -> None:
    env, calls = traced
    try:
        build(sample_manifest, cache_dir, env)
        assert "bake" in calls.read_text()
        calls.write_text("")
        states = build(sample_manifest, cache_dir, env)
        assert set(states.values()) == {"cached"}, states
        assert not [c for c in calls.read_text().splitlines() if "buildx" in c], \
            calls.read_text()

        # A waiver changes no key but a label: the image is made again from the store.
        assert keys(sample_manifest, cache_dir, WAIVER) == keys(sample_manifest, cache_dir)
        calls.write_text("")
        states = build(sample_manifest, cache_dir, env, WAIVER)
        assert set(states.values()) == {"cached"}, states
        assert "bake" in calls.read_text()
        labels = json.loads(docker_out("image", "inspect", "--format",
                                       "{{json .Config.Labels}}", TAG))
        assert labels["io.imageforge.waiver.nccl-pytorch-pin"] == "a label-only change"

        # The image gone: made again, never assumed.
        subprocess.run(["docker", "image", "rm", TAG], check=True, capture_output=True)
        calls.write_text("")
        build(sample_manifest, cache_dir, env)
        assert "bake" in calls.read_text()
        assert docker_out("image", "inspect", "--format", "{{.Id}}", TAG)
    finally:
        subprocess.run(["docker", "image", "rm", "--force", TAG], capture_output=True,
                       check=False)


def test_a_replaced_local_base_stops_even_a_build_with_nothing_to_do(
        sample_manifest: Path, cache_dir: Path, tmp_path: Path) -> None:
    base = f"imageforge-test/noop-base:{uuid.uuid4().hex[:8]}"
    tag = f"imageforge-test/noop-efa:{uuid.uuid4().hex[:8]}"

    def make_base(content: str) -> None:
        subprocess.run(["docker", "buildx", "build", "--load", "--quiet", "-t", base, "-"],
                       input=f"FROM imageforge/base:bookworm\nRUN echo {content} > /which\n",
                       text=True, check=True, capture_output=True)

    manifest = tmp_path / "sample.toml"
    manifest.write_text(sample_manifest.read_text().replace(
        'base = "imageforge/base:bookworm"', f'base = "{base}"'))
    try:
        make_base("one")
        assert invoke("lock", "--manifest", str(manifest), cache=cache_dir).returncode == 0
        for _ in range(2):   # the second: nothing to do
            result = invoke("build", "--target", "efa", "--manifest", str(manifest),
                            "--no-test", "--tag", tag, cache=cache_dir)
            assert result.returncode == 0, result.stderr
        make_base("two")
        result = invoke("build", "--target", "efa", "--manifest", str(manifest), "--no-test",
                        "--tag", tag, cache=cache_dir)
        assert result.returncode == 6, result.stdout + result.stderr
        assert f"image.base = '{base}' is sha256:" in result.stderr
        assert "the lock pins; run `invoke lock`" in result.stderr
    finally:
        subprocess.run(["docker", "image", "rm", "--force", base, tag], capture_output=True,
                       check=False)

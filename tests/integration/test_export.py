"""`invoke build --output`: a target's own files as a plain tree or a tar, from real BuildKit."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
from pathlib import Path

from tests.integration.conftest import invoke


def build_output(manifest: Path, cache: Path, target: str, dest: Path
                 ) -> subprocess.CompletedProcess[str]:
    return invoke("build", "--target", target, "--manifest", str(manifest), "--no-test",
                  "--progress", "plain", "--output", str(dest), cache=cache)


def test_output_dir_holds_each_stage_export_and_a_listing(sample_manifest: Path,
                                                          cache_dir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "tree"
    result = build_output(sample_manifest, cache_dir, "efa-nccl", dest)
    assert result.returncode == 0, result.stdout + result.stderr
    # The files each stage made, where the image has them, and nothing of the base image.
    assert list((dest / "opt/conda/lib").glob("libnccl.so.2.10.3"))
    assert (dest / "usr/local/lib/libnccl-net.so").exists()
    assert (dest / "opt/amazon/efa/bin/fi_info").exists()
    assert list((dest / "opt/nccl-tests/bin").glob("*_perf"))
    assert not (dest / "usr/bin").exists()
    assert not (dest / "etc").exists()
    listing = json.loads((dest / "imageforge-export.json").read_text())
    plan = json.loads(invoke("plan", "--target", "efa-nccl", "--manifest", str(sample_manifest),
                             "--json", cache=cache_dir).stdout)
    keys = {s["name"]: s["key"] for s in plan["stages"]}
    assert {s["name"] for s in listing["stages"]} == {"efa", "nccl", "aws-ofi-nccl", "nccl-tests"}
    for stage in listing["stages"]:
        assert stage["key"] == keys[stage["name"]]
    assert listing["target"] == "efa-nccl"


def test_output_tar_of_one_builder_stage(sample_manifest: Path, cache_dir: Path,
                                         tmp_path: Path) -> None:
    dest = tmp_path / "nccl.tar"
    result = build_output(sample_manifest, cache_dir, "nccl", dest)
    assert result.returncode == 0, result.stdout + result.stderr
    with tarfile.open(dest) as tar:
        names = tar.getnames()
    assert any(n.endswith("lib/libnccl.so.2.10.3") for n in names), names
    assert "imageforge-export.json" in names
    assert not any("fi_info" in n for n in names)   # efa is not nccl's dependency
    assert not (tmp_path / "nccl.tar.part").exists()


def test_output_to_a_missing_directory_fails_before_building(sample_manifest: Path,
                                                             cache_dir: Path,
                                                             tmp_path: Path) -> None:
    dest = tmp_path / "no" / "such" / "dir"
    result = build_output(sample_manifest, cache_dir, "nccl", dest)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "--output" in result.stderr
    assert "does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert "building" not in result.stdout
    assert not (tmp_path / "no").exists()


def test_output_builds_again_a_stage_whose_artifact_is_gone(sample_manifest: Path,
                                                            tmp_path: Path) -> None:
    """A stage the target no longer needs built (its dependents are cached) is still
    exported: when its artifact is gone from the engine's image store, build --output builds
    it again instead of ending with 'not in the artifact cache; build first', which the
    same build could never fix."""
    cache = tmp_path / "cache"
    first = build_output(sample_manifest, cache, "efa-nccl", tmp_path / "first")
    assert first.returncode == 0, first.stdout + first.stderr
    images = [json.loads(meta.read_text()).get("image")
              for meta in (cache / "artifacts" / "entries").glob("*/meta.json")]
    [efa] = [ref for ref in images if ref and "/efa:" in ref]
    subprocess.run(["docker", "image", "rm", efa], check=True, capture_output=True)
    again = build_output(sample_manifest, cache, "efa-nccl", tmp_path / "again")
    assert again.returncode == 0, again.stdout + again.stderr
    assert (tmp_path / "again/opt/amazon/efa/bin/fi_info").exists()
    assert re.search(r"^efa\s+built\b", again.stdout, re.M), again.stdout

"""Lock files against the served sample upstream: moved tags, atomic writes, stale checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.errors import LockError, SourceError
from sample.serve import ServerHandle
from stages import STAGES
from tests.unit.conftest import ROOT, sample_manifest

pytestmark = pytest.mark.usefixtures("isolated_git")

# nccl-tests is resolved from its tag, not from the commit the sample manifest pins.
UNPINNED_NCCL_TESTS = {'commit = "643f326d71b0d9d7188615b70add82fc4a313ed4"\n': ""}

# The smddp wheel is hashed by the lock, not pinned in the manifest.
UNPINNED_SMDDP = {
    'sha256 = "87ea8a43b5491be7857c5aa310ee20dbccb567ea82647270a0f25f9ed0a493b0"\n': ""}


def settings(manifest: Path, *overrides: str) -> Workspace:
    return Workspace(registry=STAGES, manifest=manifest, overrides=overrides,
                            cache_dir=manifest.parent / "cache")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_moved_tag_is_refused_naming_repo_tag_and_both_commits(
        sample_server: ServerHandle, sample_copy: Path, sample_pins: dict[str, Any],
        tmp_path: Path) -> None:
    manifest = sample_manifest(tmp_path / "m", sample_server.url, UNPINNED_NCCL_TESTS)
    lock_file, _ = project.write_lock(settings(manifest), upgrade=False)
    before = lock_file.read_bytes()
    tags = sample_pins["repos"]["nccl-tests"]["tags"]
    locked, other = tags["v2.11.0"], tags["v2.0.0"]
    git(sample_copy / "git/nccl-tests.git", "tag", "-f", "v2.11.0", other)

    with pytest.raises(LockError) as refused:
        project.write_lock(settings(manifest), upgrade=False)

    message = str(refused.value)
    repo = f"{sample_server.url}/git/nccl-tests.git"
    assert all(part in message for part in (repo, "v2.11.0", locked, other))
    assert "invoke lock --upgrade" in message
    assert lock_file.read_bytes() == before
    # An upgrade accepts the move and records the new commit.
    project.write_lock(settings(manifest), upgrade=True)
    assert other in lock_file.read_text()


def test_a_failure_midway_leaves_the_old_lock_byte_identical(
        sample_server: ServerHandle, tmp_path: Path) -> None:
    manifest = sample_manifest(tmp_path / "m", sample_server.url, UNPINNED_SMDDP)
    lock_file, _ = project.write_lock(settings(manifest), upgrade=False)
    before = lock_file.read_bytes()
    # smddp is resolved after efa, nccl, pytorch and most others: the 404 comes midway.
    wheel = "smdistributed_dataparallel-{version}-cp311-cp311-linux_x86_64.whl"
    missing = f"stages.smddp.url={sample_server.url}/files/missing/{wheel}"

    with pytest.raises(SourceError, match=r"missing/smdistributed_dataparallel-1\.4\.0-.*404"):
        project.write_lock(settings(manifest, missing), upgrade=False)

    assert lock_file.read_bytes() == before
    assert sorted(os.listdir(manifest.parent)) == ["cache", "sample.lock.json", "sample.toml"]
    leftovers = [p for p in (manifest.parent / "cache").rglob("*")
                 if p.name.endswith((".tmp", ".part")) or p.name.startswith("tmp")]
    assert leftovers == []


def test_lock_check_is_stale_after_a_set(sample_server: ServerHandle, tmp_path: Path) -> None:
    manifest = sample_manifest(tmp_path / "m", sample_server.url)
    project.write_lock(settings(manifest), upgrade=False)
    assert project.check_lock(settings(manifest)) == manifest.with_name("sample.lock.json")

    with pytest.raises(LockError, match=r"stale.*--set"):
        project.check_lock(settings(manifest, "stages.boost.version=1.74.0"))

    cli = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "lock", "--check", "--manifest",
         str(manifest), "--set", "stages.boost.version=1.74.0"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert cli.returncode == 8, cli.stderr
    assert "stale" in cli.stderr
    assert "Traceback" not in cli.stderr

"""A lock file is input: every pin value is checked when the lock is read, before it can reach
a FROM line, a RUN line or a requirements file, and a bad one is one sentence naming the file
and the entry (exit 8), never a traceback nor a rendered Dockerfile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "manifests" / "sample.toml"
TORCH = ROOT / "manifests" / "real-torch211.toml"

Edit = Callable[[dict[str, Any]], None]


def _set(*path: str, value: Any) -> Edit:
    def edit(lock: dict[str, Any]) -> None:
        node = lock
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return edit


def _del(*path: str) -> Edit:
    def edit(lock: dict[str, Any]) -> None:
        node = lock
        for part in path[:-1]:
            node = node[part]
        del node[path[-1]]
    return edit


def _first_package(key: str, value: Any) -> Edit:
    return lambda lock: lock["pip"]["pytorch"]["packages"][0].__setitem__(key, value)


CASES = [
    (TORCH, _set("nccl_pytorch_pin", "version", value="2.28.9; curl x | sh"),
     "nccl_pytorch_pin.version: '2.28.9; curl x | sh' is not allowed"),
    (TORCH, _set("nccl_pytorch_pin", "version", value=["2.28.9"]), "nccl_pytorch_pin.version"),
    (TORCH, _set("nccl_pytorch_pin", "commit", value="main"), "nccl_pytorch_pin.commit"),
    (TORCH, _first_package("hashes", "sha256:" + "a" * 64),
     "pip.pytorch.packages: cuda-bindings: hashes must be a non-empty list"),
    (TORCH, _first_package("version", "13.5.0 --index-url http://evil"),
     "pip.pytorch.packages: cuda-bindings: version"),
    (TORCH, _first_package("name", "x; id"), "package name 'x; id' is not allowed"),
    (TORCH, _set("pip", "pytorch", "packages", value="torch==2.11.0"),
     "pip.pytorch.packages: expected a list"),
    (TORCH, _set("base", "digest", value="sha256:nothex"), "base.digest"),
    (TORCH, _set("stages", "efa", "src-efa", "sha256", value="$(id)"),
     "stages.efa.src-efa.sha256"),
    (TORCH, _set("stages", "nccl-tests", "src-nccl-tests", "commit", value=7),
     "stages.nccl-tests.src-nccl-tests.commit"),
    (TORCH, _set("source_date_epoch", value="yesterday"), "source_date_epoch 'yesterday'"),
    (SAMPLE, _set("base", "digest", value="sha256:" + "A" * 64), "base.digest"),
    # Found by tests/unit/test_hostile_records.py: a KeyError while locksettle.
    (TORCH, _del("pip", "pytorch", "packages"), "pip.pytorch.packages: missing"),
]


@pytest.mark.parametrize(("manifest", "edit", "says"), CASES,
                         ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("command", [["lock", "--check"], ["render"], ["plan", "--json"]])
def test_a_bad_value_in_the_lock_is_refused_naming_file_and_entry(
        tmp_path: Path, manifest: Path, edit: Edit, says: str, command: list[str]) -> None:
    copy = tmp_path / manifest.name
    copy.write_text(manifest.read_text())
    lock = json.loads(manifest.with_name(manifest.stem + ".lock.json").read_text())
    lock["manifest"] = copy.name
    edit(lock)
    path = tmp_path / f"{manifest.stem}.lock.json"
    path.write_text(json.dumps(lock))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path)}
    target = ["--target", "training"] if manifest == TORCH and command[0] != "lock" else []
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *command,
                             "--manifest", str(copy), *target], cwd=tmp_path, env=env,
                            capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 8, result.stderr
    assert result.stdout == ""   # no Dockerfile, no plan
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"imageforge: error: {path}: ")
    assert says in result.stderr
    assert "run `invoke lock`" in result.stderr


def test_every_committed_lock_passes() -> None:
    from imageforge.sources import lockfile

    for path in sorted((ROOT / "manifests").glob("*.lock.json")):
        assert lockfile.read(path) is not None, path


@pytest.mark.parametrize("kind", ["a link to /dev/zero", "a directory", "over the size cap"])
def test_a_lock_that_never_ends_or_is_too_large_is_refused_unread(tmp_path: Path,
                                                                  kind: str) -> None:
    """The lock is read only when it is a regular file of at most 16 MiB: a link to
    /dev/zero used to be read until memory ran out."""
    copy = tmp_path / SAMPLE.name
    copy.write_text(SAMPLE.read_text())
    path = tmp_path / "sample.lock.json"
    if kind == "a link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "a directory":
        path.mkdir()
    else:
        with path.open("wb") as sparse:
            sparse.truncate((16 << 20) + 1)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "plan",
                             "--manifest", str(copy), "--target", "efa"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 8, result.stderr
    assert "Traceback" not in result.stderr
    reason = "larger than 16 MiB" if kind == "over the size cap" else "not a regular file"
    assert f"{path}: not a valid imageforge lock file ({reason})" in result.stderr

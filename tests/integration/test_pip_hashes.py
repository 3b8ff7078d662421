"""The toolkit stage of the sample installs the set `invoke lock` resolved from PyPI with
pip's hash checking, in a real BuildKit build: a hash that does not match stops the build."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.integration.conftest import invoke

pytestmark = pytest.mark.docker

TARGET = "sagemaker-training"


def test_the_toolkit_installs_its_locked_set_with_hash_checking(
        sample_manifest: Path, cache_dir: Path, tmp_path: Path) -> None:
    lock_file = sample_manifest.with_name("sample.lock.json")
    entry = json.loads(lock_file.read_text())["pip"][TARGET]
    assert entry["from"]["python"] == "3.11"
    assert {p["name"] for p in entry["packages"]} >= {TARGET, "sagemaker-pytorch-training"}
    assert all(p["version"] and p["hashes"] for p in entry["packages"])
    rendered = invoke("render", "--manifest", str(sample_manifest), "--target", TARGET,
                      cache=cache_dir)
    assert rendered.returncode == 0, rendered.stderr
    assert "--require-hashes" in rendered.stdout
    built = invoke("build", "--manifest", str(sample_manifest), "--target", TARGET, "--no-test",
                   "--progress", "plain", cache=cache_dir)
    assert built.returncode == 0, built.stderr[-3000:]

    # The same lock with one hash of the toolkit's own package replaced.
    tampered = tmp_path / "sample.toml"
    shutil.copy(sample_manifest, tampered)
    data = json.loads(lock_file.read_text())
    package = next(p for p in data["pip"][TARGET]["packages"] if p["name"] == TARGET)
    package["hashes"] = ["sha256:" + "0" * 64]
    tampered.with_name("sample.lock.json").write_text(json.dumps(data, indent=2))
    refused = invoke("build", "--manifest", str(tampered), "--target", TARGET, "--no-test",
                     "--progress", "plain", cache=cache_dir)
    assert refused.returncode == 7, refused.stderr[-3000:]
    assert "DO NOT MATCH THE HASHES" in refused.stderr

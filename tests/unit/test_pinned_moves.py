"""A --set that moves a source away from the sha256 or commit the manifest file pins for it is
refused before anything is fetched, naming the pin's line: `fetch --set
stages.efa.version=1.15.1` on the sample failed as a checksum mismatch blamed on upstream."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imageforge.errors import ManifestError
from imageforge.model.manifest import load, refuse_moved_pins
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "manifests" / "sample.toml"
SHA = "a" * 64
COMMIT = "b" * 40


@pytest.mark.parametrize(("sets", "says"), [
    (("stages.efa.version=1.15.1",),
     "--set stages.efa.version=1.15.1 moves stages.efa.url, but "
     f"{SAMPLE}: stages.efa.sha256 (line 22) pins the sha256 of the old one; also --set "
     "stages.efa.sha256=<the new file's sha256>"),
    (("stages.boost.version=1.74.0",), "stages.boost.sha256 (line 57) pins the sha256"),
    (("stages.aws-ofi-nccl.version=1.2.0-aws",),
     "moves stages.aws-ofi-nccl.ref, but "
     f"{SAMPLE}: stages.aws-ofi-nccl.commit (line 32) pins the commit of the old one; also --set "
     "stages.aws-ofi-nccl.commit=<the new ref's commit>"),
])
def test_moving_a_pinned_source_needs_its_new_pin(sets: tuple[str, ...], says: str) -> None:
    with pytest.raises(ManifestError) as caught:
        refuse_moved_pins(SAMPLE, sets, registry=STAGES)
    assert says in str(caught.value)
    # What downloads nothing still shows it (plan, check, render, the compatibility rules).
    assert load(SAMPLE, sets, registry=STAGES).stages


@pytest.mark.parametrize("sets", [
    ("stages.efa.version=1.15.1", f"stages.efa.sha256={SHA}"),
    ("stages.aws-ofi-nccl.version=1.2.0-aws", f"stages.aws-ofi-nccl.commit={COMMIT}"),
    ("stages.efa.flags=[\"-y\"]",),   # not where the file comes from
    # A mirror of the same bytes, another name for the same commit: the pins still hold.
    ("stages.efa.url=http://mirror.example/aws-efa-installer-1.14.1.tar.gz",),
    ("stages.aws-ofi-nccl.ref=release-1.1.3",),
])
def test_a_move_with_its_new_pin_or_an_unrelated_set_is_fine(sets: tuple[str, ...]) -> None:
    refuse_moved_pins(SAMPLE, sets, registry=STAGES)
    loaded = load(SAMPLE, sets, registry=STAGES)
    assert loaded.stages["efa"]["version"] in ("1.14.1", "1.15.1")


def test_fetch_refuses_before_downloading(tmp_path: Path) -> None:
    """The sample's upstream is not served here: the refusal comes before any download."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "fetch",
                             "--target", "efa", "--manifest", str(SAMPLE), "--set",
                             "stages.efa.version=1.15.1"], cwd=ROOT, env=env,
                            capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1].startswith(
        "imageforge: error: --set stages.efa.version=1.15.1 moves stages.efa.url, but ")
    assert not (tmp_path / "sources").exists() or not any((tmp_path / "sources").rglob("*.tar.gz"))

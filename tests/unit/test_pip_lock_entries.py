"""A stage's pip lock entry: current while its requirements, Python and platform are what it
was resolved from; its versions and hashes are installed with --require-hashes and keyed."""

from __future__ import annotations

from pathlib import Path

from imageforge.model.manifest import load
from imageforge.planning.plan import make_plan
from imageforge.sources import lockfile, locksettle, piplock
from stages import STAGES

SAMPLE = Path("manifests/sample.toml")

PACKAGES: list[dict[str, object]] = [
    {"name": "sagemaker-training", "version": "5.1.4", "hashes": ["sha256:" + "a" * 64]},
            {"name": "six", "version": "1.17.0", "hashes": ["sha256:" + "b" * 64]}]


def _locked(overrides: tuple[str, ...] = (), packages: list[dict[str, object]] = PACKAGES,
            requirements: list[str] | None = None) -> locksettle.Settled:
    """The sample with a lock whose only entry is the toolkit's pip set."""
    manifest = load(SAMPLE, overrides, registry=STAGES)
    wanted = requirements or ["sagemaker-training==5.1.4", "sagemaker-pytorch-training==3.0.0"]
    entry = lockfile.Entry(origin=piplock.origin(wanted, manifest.image),
                       pin={"packages": packages})
    the_lock = lockfile.Lock(entries={(lockfile.PIP, "sagemaker-training"): entry})
    return locksettle.settle(manifest, the_lock, STAGES)


def _toolkit(settled: locksettle.Settled) -> tuple[str, str]:
    planned = make_plan(settled.manifest, "sagemaker-training", STAGES).stage("sagemaker-training")
    return planned.key, planned.recipe


def test_a_current_entry_installs_with_hash_checking() -> None:
    settled = _locked()
    assert (lockfile.PIP, "sagemaker-training") not in settled.stale
    _, recipe = _toolkit(settled)
    assert "pip install --disable-pip-version-check --require-hashes" in recipe
    assert f"six==1.17.0 \\\n    --hash=sha256:{'b' * 64}\n" in recipe


def test_the_key_moves_with_a_locked_version_or_hash() -> None:
    key, _ = _toolkit(_locked())
    moved = [dict(PACKAGES[0]), {**PACKAGES[1], "version": "1.16.0"}]
    rehashed = [dict(PACKAGES[0]), {**PACKAGES[1], "hashes": ["sha256:" + "c" * 64]}]
    assert _toolkit(_locked(packages=moved))[0] != key
    assert _toolkit(_locked(packages=rehashed))[0] != key


def test_a_changed_requirement_makes_the_entry_stale_and_changes_the_key() -> None:
    key, _ = _toolkit(_locked())
    changed = _locked(('stages.sagemaker-training.packages=["sagemaker-pytorch-training==2.8.0"]',))
    assert (lockfile.PIP, "sagemaker-training") in changed.stale
    new_key, recipe = _toolkit(changed)
    assert new_key != key
    # Not locked: installed as written, which `lock --check` and `build --locked` refuse.
    assert "--require-hashes" not in recipe
    assert "sagemaker-pytorch-training==2.8.0\n" in recipe

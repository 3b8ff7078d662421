"""The lock applies entry by entry: a change makes only its own entries stale, and a key comes
from the resolved commit or sha256, never from the ref's name or where the bytes came from."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from imageforge.errors import LockError
from imageforge.model.manifest import load
from imageforge.planning.plan import make_plan
from imageforge.sources import lockfile, locksettle
from stages import STAGES, nccl_pytorch_pin
from tests.unit.conftest import ROOT

NCCL_PIN = (nccl_pytorch_pin.ENTRY,)

SAMPLE = ROOT / "manifests/sample.toml"
NCCL_COMMIT = "507f9c571bb959fce87c3bfce0e3da9afa344c65"
LOCAL_ID = "sha256:" + "1" * 64
EFA_1_15_1 = ("stages.efa.version=1.15.1", "stages.efa.sha256=" + "9" * 64)


def sample_lock() -> lockfile.Lock:
    """The sample's lock as `invoke lock` writes it: the manifest's own pins, the base image
    (local only: no digest) and the NCCL PyTorch 1.10.2 pins."""
    raw = load(SAMPLE, registry=STAGES)
    entries = dict(locksettle.settle(raw, None, STAGES).entries)
    entries[lockfile.BASE] = lockfile.Entry(origin={"ref": raw.image["base"]}, pin={"digest": None})
    entries[NCCL_PIN] = lockfile.Entry(
        origin={"pytorch_version": "1.10.2", "pytorch_commit": raw.stages["pytorch"]["commit"],
                "cuda": "11.3"},
        pin={"version": "2.10.3", "commit": NCCL_COMMIT, "evidence": {}})
    # Settled again: NCCL's own source is known once "auto" is.
    settled = locksettle.settle(raw, lockfile.Lock(entries=entries), STAGES)
    return lockfile.Lock(entries=settled.entries)


def settled(overrides: Sequence[str] = (), manifest: Path = SAMPLE) -> locksettle.Settled:
    return locksettle.settle(load(manifest, overrides, registry=STAGES), sample_lock(), STAGES,
                       local_id=lambda _ref: LOCAL_ID)


def stale(result: locksettle.Settled) -> set[str]:
    # Pip requirements are locked against PyPI, which unit tests do not reach.
    return {lockfile.name(p) for p in result.stale if p[0] != "pip"}


def keys(result: locksettle.Settled, target: str = "smddp") -> dict[str, str]:
    return {s.name: s.key for s in make_plan(result.manifest, target, STAGES).stages}


def moved(a: dict[str, str], b: dict[str, str]) -> set[str]:
    return {name for name in a if a[name] != b[name]}


def test_a_set_makes_only_its_own_entry_stale_and_the_base_stays_pinned() -> None:
    before, after = settled(), settled(EFA_1_15_1)
    assert stale(before) == set()
    assert stale(after) == {"stages.efa.src-efa"}
    assert after.manifest.image["base_image_id"] == LOCAL_ID
    assert moved(keys(before), keys(after)) == {"efa", "aws-ofi-nccl", "smddp"}


def test_editing_the_manifest_without_locking_is_the_same_as_a_set(tmp_path: Path) -> None:
    edited = tmp_path / "sample.toml"
    text = SAMPLE.read_text().replace('version = "1.14.1"', 'version = "1.15.1"')
    edited.write_text(text.replace(
        "24220cb0add4527f3e3797d4cb19e85aadca13c5b549902a19028aa19afd0a54", "9" * 64))
    by_file = settled(manifest=edited)
    assert stale(by_file) == {"stages.efa.src-efa"}
    assert keys(by_file) == keys(settled(EFA_1_15_1))


def test_an_unrelated_edit_leaves_every_entry_current() -> None:
    assert stale(settled(("stages.pytorch.max_jobs=7",))) == set()


@pytest.mark.parametrize("mirror", [
    "stages.boost.url=file:///srv/mirror/boost_1_73_0.tar.gz",
    "stages.pytorch.repo=https://git.mirror.example/pytorch.git",
    "stages.nccl.repo=/srv/mirror/nccl.git",
])
def test_a_mirror_with_the_same_pins_rebuilds_nothing(mirror: str) -> None:
    assert keys(settled((mirror,))) == keys(settled())


def test_pinning_nccl_to_the_commit_auto_resolved_gives_the_same_key() -> None:
    explicit = settled(("stages.nccl.version=2.10.3", f"stages.nccl.commit={NCCL_COMMIT}"))
    assert keys(explicit, "nccl") == keys(settled(), "nccl")
    other = settled(("stages.nccl.version=2.10.3", "stages.nccl.commit=" + "e" * 40))
    assert keys(other, "nccl") != keys(settled(), "nccl")


def test_lock_check_names_exactly_the_stale_entries(tmp_path: Path) -> None:
    raw = load(SAMPLE, EFA_1_15_1, registry=STAGES)
    with pytest.raises(LockError) as refused:
        locksettle.check(raw, sample_lock(), tmp_path / "sample.lock.json", registry=STAGES)
    message = str(refused.value)
    assert "stale entries stages.efa.src-efa" in message
    assert "invoke lock" in message
    assert "stages.boost" not in message
    assert "base" not in message.split("stale")[1]


def test_a_written_lock_reads_back_and_holds_no_machine_local_fact(tmp_path: Path) -> None:
    path = tmp_path / "sample.lock.json"
    lockfile.write(path, sample_lock(), load(SAMPLE, registry=STAGES))
    assert lockfile.read(path) == sample_lock()
    assert LOCAL_ID not in path.read_text()


def test_an_old_lock_asks_for_invoke_lock(tmp_path: Path) -> None:
    path = tmp_path / "sample.lock.json"
    path.write_text(json.dumps({"format": 1, "stages": {}}))
    with pytest.raises(LockError, match=r"lock format 1, not 2; run `invoke lock`"):
        lockfile.read(path)
    assert lockfile.read(path, old_ok=True) is None

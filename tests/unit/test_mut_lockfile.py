"""Reading a lock file (imageforge/sources/lockfile.py `read`), in process: a lock whose
source_date_epoch or pin values `invoke lock` never writes is refused with a message naming
the file, the entry and its key. tests/unit/test_lock_values.py runs such locks through
`invoke`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imageforge.errors import LockError
from imageforge.sources import lockfile

DIGEST = "sha256:" + "d" * 64
AFTER = ("; a lock holds only what `invoke lock` writes: delete that entry and run "
         "`invoke lock`.")


def _refusal(tmp_path: Path, data: object) -> str:
    path = tmp_path / "x.lock.json"
    path.write_text(json.dumps(data))
    with pytest.raises(LockError) as info:
        lockfile.read(path)
    return str(info.value)


@pytest.mark.parametrize(("epoch", "shown"), [
    ("yesterday", "'yesterday'"), (-1, "-1"), (1.5, "1.5"), (True, "True")])
def test_an_epoch_that_is_not_whole_seconds_is_refused_naming_the_key(
        tmp_path: Path, epoch: object, shown: str) -> None:
    assert _refusal(tmp_path, {"format": 2, "source_date_epoch": epoch}) == (
        f"{tmp_path / 'x.lock.json'}: source_date_epoch {shown} is not a whole number of "
        "seconds; delete the key and run `invoke lock`.")


def test_a_whole_epoch_or_none_is_read(tmp_path: Path) -> None:
    path = tmp_path / "x.lock.json"
    for epoch in (0, 1700000000, None):
        path.write_text(json.dumps({"format": 2, "source_date_epoch": epoch}))
        assert lockfile.read(path) == lockfile.Lock(entries={}, source_date_epoch=epoch)


@pytest.mark.parametrize(("data", "where"), [
    ({"base": {"from": {"ref": "r"}, "digest": "sha256:x"}},
     "base.digest: 'sha256:x' is not allowed: expected an image digest "
     "'sha256:<64 hex digits>'"),
    ({"pip": {"pytorch": {"from": {}}}}, "pip.pytorch.packages: missing"),
    ({"stages": {"efa": {"src\nefa": {"from": {}, "sha256": "zz"}}}},
     "stages.efa.src\\nefa.sha256: 'zz' is not allowed: expected 64 lowercase hex digits"),
])
def test_a_pin_invoke_lock_never_writes_is_refused_naming_entry_and_key(
        tmp_path: Path, data: dict[str, object], where: str) -> None:
    good = {"extends": {"from": {"ref": "r"}, "digest": DIGEST, "provides": ["efa"]}}
    assert _refusal(tmp_path, {"format": 2, **good, **data}) == (
        f"{tmp_path / 'x.lock.json'}: {where}{AFTER}")

"""A command reads its manifest and lock once (`Workspace.opened`, a ManifestLock): planning,
the waivers, the default target, the lock's digest for the labels and `--locked` all ask the
same object. Counted with a real audit hook on open(), not by patching the loader."""

from __future__ import annotations

import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.errors import LockError, UsageError
from imageforge.sources import lockfile
from stages import STAGES
from tests.unit.conftest import ROOT

OPENED: Counter[str] = Counter()
WATCHING: list[bool] = [False]


def _count(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and WATCHING[0] and isinstance(args[0], str | Path):
        OPENED[Path(args[0]).name] += 1


sys.addaudithook(_count)


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    for name in ("sample.toml", "sample.lock.json"):
        shutil.copy(ROOT / "manifests" / name, tmp_path / name)
    return tmp_path / "sample.toml"


def test_one_command_reads_the_manifest_once_and_the_lock_file_once_plus_its_digest(
        sample: Path, tmp_path: Path) -> None:
    settings = Workspace(registry=STAGES, manifest=sample, cache_dir=tmp_path / "cache",
                                locked=True)
    OPENED.clear()
    WATCHING[0] = True
    try:
        with pytest.raises(UsageError, match="defines 3 images"):
            project.default_target(settings)
        planned = project.plan(settings, "smddp")
        project.waived(settings, planned.manifest)
        current = project.current_lock(settings)
        project.check_lock(settings)
    finally:
        WATCHING[0] = False
    assert current is not None
    assert current[1] == settings.opened.digest
    assert OPENED["sample.toml"] == 1
    # Its entries, then its bytes for the digest the image is labelled with.
    assert OPENED["sample.lock.json"] == 2


def test_a_new_settings_reads_again_and_a_written_lock_is_read_anew(
        sample: Path, tmp_path: Path) -> None:
    settings = Workspace(registry=STAGES, manifest=sample, cache_dir=tmp_path / "cache")
    assert project.current_lock(settings) is not None
    lock_path = lockfile.lock_path(sample)
    lock_path.write_text("{}")
    # Same command: the lock it opened is the one it keeps using.
    assert project.current_lock(settings) is not None
    with pytest.raises(LockError, match="lock format None"):
        project.current_lock(Workspace(registry=STAGES, manifest=sample))

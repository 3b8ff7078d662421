"""Running out of space, as each writer says it: Python, git and BuildKit."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from imageforge import diskfull
from imageforge.errors import CacheError, SourceError

# Verbatim from the fault tests on a 2 MiB tmpfs (tests/integration/test_faults.py).
BUILDKIT = ("ERROR: failed to solve: failed to copy: failed to send write: write "
            "/c/artifacts/tmp/26972-6c74bb1a2000/efa/ingest/0577/data: no space left on device: "
            "unknown")
GIT = ("could not create a work tree for http://127.0.0.1:8799/git/nccl.git (fatal: cannot copy "
       "'/usr/share/git-core/templates/hooks/pre-push.sample' to '/c/sources/git/.x/tree/.git/"
       "hooks/pre-push.sample': No space left on device); check the repository URL")


def test_each_writers_wording_is_recognised() -> None:
    assert diskfull.is_full(OSError(errno.ENOSPC, "No space left on device"))
    assert diskfull.is_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not diskfull.is_full(OSError(errno.EACCES, "Permission denied"))
    assert diskfull.is_full(SourceError(GIT))
    assert not diskfull.is_full(SourceError("could not connect"))
    assert diskfull.full_path(BUILDKIT) == Path(
        "/c/artifacts/tmp/26972-6c74bb1a2000/efa/ingest/0577/data")
    assert diskfull.full_path("write error: no space left on device") is None


def test_the_guard_names_the_place_and_lets_other_errors_through(tmp_path: Path) -> None:
    with pytest.raises(CacheError, match=f"the disk holding {tmp_path} is full"), \
            diskfull.guard(tmp_path):
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(PermissionError), diskfull.guard(tmp_path):
        raise PermissionError(errno.EACCES, "Permission denied")
    assert diskfull.error(tmp_path).return_code == 9


def test_nearly_full_reads_the_disk(tmp_path: Path) -> None:
    assert diskfull.nearly_full(tmp_path, below=1 << 62)
    assert not diskfull.nearly_full(tmp_path, below=0)
    assert not diskfull.nearly_full(tmp_path / "missing")

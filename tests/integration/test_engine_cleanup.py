"""A test session leaves the host engine as it found it: real pytest sessions of their own
(child processes, with the suite's session fixture and a lock file of their own) make images
the way the suite does. Afterwards the engine holds none of them, while an image of another
name made at the same time, and everything that was there before, stays; and a session that
ends while another holds the lock removes nothing, as it cannot tell whose images are whose."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD_TEST = '''
import subprocess
from pathlib import Path

TOKEN = "{token}"


def build(marker: str, out: Path) -> str:
    subprocess.run(["docker", "buildx", "build", "--quiet", "--iidfile", str(out), "-"],
                   input=f"FROM imageforge/base:bookworm\\nRUN echo {{marker}} > /marker\\n",
                   text=True, check=True, capture_output=True)
    return out.read_text().strip()


def test_makes_images(tmp_path: Path) -> None:
    ids = [build(f"{{TOKEN}}-{{n}}", tmp_path / f"iid-{{n}}") for n in range(3)]
    subprocess.run(["docker", "tag", ids[1], f"imageforge-test/cleanup:{{TOKEN}}"], check=True)
    subprocess.run(["docker", "tag", ids[2], f"imageforge-kept/cleanup:{{TOKEN}}"], check=True)
    (tmp_path.parent.parent / "ids").write_text("\\n".join(ids))
'''


def present(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True,
                          check=False).returncode == 0


def child_session(where: Path, lock: Path) -> tuple[str, list[str]]:
    """Run a child session in `where`; its token and the IDs of its three images (untagged,
    test-named, other-named)."""
    token = uuid.uuid4().hex[:12]
    session = where / "session"
    session.mkdir(parents=True)
    (session / "conftest.py").write_text(
        "from tests.engine_cleanup import engine_left_as_found  # noqa: F401\n")
    (session / "test_child.py").write_text(CHILD_TEST.format(token=token))
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
         str(where / "base"), str(session)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                       "IMAGEFORGE_TEST_ENGINE_LOCK": str(lock),
                       # Its own tags only: the suite's other workers build on this engine
                       # meanwhile, and a child ending "alone" under its own lock would
                       # remove their test images (it once removed one a module still used).
                       "IMAGEFORGE_TEST_CLEANUP_ONLY": token},
        capture_output=True, text=True, timeout=600, check=False)
    assert child.returncode == 0, child.stdout + child.stderr
    return token, (where / "ids").read_text().split()


def remove(*refs: str) -> None:
    subprocess.run(["docker", "image", "rm", "--force", *refs], capture_output=True,
                   check=False)


@pytest.mark.usefixtures("docker_ready")
def test_a_session_removes_the_images_it_made_and_nothing_else(tmp_path: Path) -> None:
    token, (untagged, tagged, other) = child_session(tmp_path, tmp_path / "lock")
    kept = f"imageforge-kept/cleanup:{token}"
    try:
        assert not present(untagged)
        assert not present(tagged)
        assert not present(f"imageforge-test/cleanup:{token}")
        assert present(kept)
        assert present(other)
        assert present("imageforge/base:bookworm")
    finally:
        remove(kept)


@pytest.mark.usefixtures("docker_ready")
def test_a_session_ending_beside_another_removes_nothing(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_SH)   # what another session running holds
        token, ids = child_session(tmp_path, lock)
    named = [f"imageforge-test/cleanup:{token}", f"imageforge-kept/cleanup:{token}"]
    try:
        assert all(present(ref) for ref in [*ids, *named])
    finally:
        remove(*named, *ids)

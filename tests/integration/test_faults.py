"""Faults tried on purpose against real parts: a Docker daemon stopped mid-build, a cache
disk that fills up, SIGINT and SIGTERM while BuildKit runs, exports or the cache stores an
artifact. Each ends in one sentence and its own exit code, leaves the cache consistent and
the engine clean, and the next run succeeds.

Everything builds on a second Docker engine of the test's own (conftest.SecondDockerd), so
stopping it and pruning its build cache disturbs nobody else.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import leftovers
from tests.cache_consistency import assert_cache_consistent
from tests.integration.conftest import (
    Running,
    SecondDockerd,
    assert_engine_clean,
    invoke,
)


def build(manifest: Path, cache: Path, engine: SecondDockerd, target: str,
          *sets: str) -> Running:
    # Every artifact an OCI layout in the cache directory, efa's whole image (about 230 MB)
    # included: the faults below land while that layout is written and adopted. (By default
    # a whole image stays in the engine's image store; test_uptodate_build covers that.)
    return Running("build", "--target", target, "--manifest", str(manifest), "--progress",
                   "plain", "--no-test", *[w for s in sets for w in ("--set", s)], cache=cache,
                   env={**engine.env, "INVOKE_IMAGEFORGE_IMAGE_ARTIFACTS": "oci-layout"})


def built(manifest: Path, cache: Path, engine: SecondDockerd, target: str,
          *sets: str) -> None:
    """The next run: the same build, now succeeding."""
    again = build(manifest, cache, engine, target, *sets)
    assert again.finish(timeout=180) == 0, again.stderr
    assert_cache_consistent(cache)


def in_make(running: Running, engine: SecondDockerd) -> None:
    """Until NCCL's make runs in a build step of `engine` (seen in the process table, so the
    fault lands while BuildKit really works, however slow the machine)."""
    running.wait_until(lambda: engine.runs("make", "src.build"), "make src.build in a build step")


def fresh_nccl() -> str:
    """A --set that makes BuildKit really run NCCL's make (its layer cache would answer in no
    time) and nothing else: ONLY_FUNCS is a keyed make variable, which the sample's NCCL
    Makefile takes and ignores, so a value of the test's own gives a step no cache holds.
    (Pruning the engine's whole build cache made every later build there start cold.)"""
    return f"stages.nccl.only_funcs=fault{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["crash", "stop"])
def test_daemon_stopped_mid_build_exits_6_and_a_build_after_restart_succeeds(
        sample_manifest: Path, dockerd2: SecondDockerd, tmp_path: Path, how: int) -> None:
    fresh = fresh_nccl()
    builders = dockerd2.builders()
    running = build(sample_manifest, tmp_path, dockerd2, "nccl", fresh)
    running.wait_for(r"\bnccl +building")
    in_make(running, dockerd2)
    dockerd2.kill(how)
    assert running.finish() == 6, running.stderr
    assert "Traceback" not in running.stderr
    assert running.last_line.startswith("imageforge: error: the Docker daemon stopped "
                                        "answering during the build;"), running.stderr
    assert_cache_consistent(tmp_path)
    assert not (tmp_path / "artifacts" / "entries").exists()
    dockerd2.start()
    assert_engine_clean(dockerd2, builders)
    built(sample_manifest, tmp_path, dockerd2, "nccl", fresh)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: room for the sample's sources, not for a whole-image artifact. Recorded
    (tests/leftovers.py), so a session killed while it is mounted leaves it to the next
    session's sweep."""
    with leftovers.tmpfs(tmp_path / "disk", "2m") as disk:
        yield disk


def fill(disk: Path, leave: int) -> None:
    """Leave only `leave` bytes free on `disk`."""
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    (disk / "ballast").write_bytes(b"\0" * (free - leave))


def grow(disk: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=400m", str(disk)], check=True)
    (disk / "ballast").unlink(missing_ok=True)


@pytest.mark.parametrize("target", ["efa", "nccl"], ids=["file", "git"])
def test_fetch_onto_a_full_disk_exits_9_naming_it(sample_manifest: Path, small_disk: Path,
                                                  target: str) -> None:
    cache = small_disk / "cache"
    fill(small_disk, leave=8192)
    result = invoke("fetch", "--target", target, "--manifest", str(sample_manifest),
                    cache=cache)
    assert result.returncode == 9, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"imageforge: error: the disk holding {cache / 'sources'} is full;"), result.stderr
    assert_cache_consistent(cache)
    grow(small_disk)
    again = invoke("fetch", "--target", target, "--manifest", str(sample_manifest),
                   cache=cache)
    assert again.returncode == 0, again.stderr
    assert_cache_consistent(cache)


def test_build_onto_a_full_disk_exits_9_naming_it(sample_manifest: Path, small_disk: Path,
                                                  dockerd2: SecondDockerd) -> None:
    cache = small_disk / "cache"
    builders = dockerd2.builders()
    # efa's artifact is a whole image (about 230 MB): BuildKit's export fills the disk.
    running = build(sample_manifest, cache, dockerd2, "efa")
    assert running.finish() == 9, running.stderr
    assert "Traceback" not in running.stderr
    assert running.last_line.startswith(
        f"imageforge: error: the disk holding {cache / 'artifacts'} is full;"), running.stderr
    assert_cache_consistent(cache)
    assert_engine_clean(dockerd2, builders)
    grow(small_disk)
    built(sample_manifest, cache, dockerd2, "efa")


def export_started(cache: Path) -> bool:
    """BuildKit is writing efa's OCI layout (some blobs there, its index.json not yet), in
    the work directory of the build's first bake."""
    return any(not Path(d, "index.json").exists()
               for d in glob.glob(f"{cache}/artifacts/tmp/*/bake-0/out/efa")
               if glob.glob(f"{d}/blobs/sha256/*"))


def storing(cache: Path) -> bool:
    """The store assembles efa's entry under tmp/ (BuildKit has finished)."""
    return bool(glob.glob(f"{cache}/artifacts/tmp/*/blobs"))


@pytest.mark.parametrize("phase", ["running", "exporting", "storing"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_signal_while_building_or_storing_exits_130_and_keeps_nothing_partial(
        sample_manifest: Path, dockerd2: SecondDockerd, tmp_path: Path, phase: str,
        signum: int) -> None:
    # Ctrl-C reaches the whole process group (buildx too); CI's SIGTERM only imageforge.
    group = signum == signal.SIGINT
    builders, steps = dockerd2.builders(), dockerd2.step_mounts()
    fresh = fresh_nccl()
    if phase == "running":
        running = build(sample_manifest, tmp_path, dockerd2, "nccl", fresh)
        running.wait_for(r"\bnccl +building")
        in_make(running, dockerd2)
        running.signal(signum, group=group)
    else:
        running = build(sample_manifest, tmp_path, dockerd2, "efa")
        ready = export_started if phase == "exporting" else storing
        running.wait_until(lambda: ready(tmp_path), f"{phase} efa's artifact", poll=0.005)
        # Held still, so the signal lands in the middle of the write, not after it: the whole
        # process group, since buildx (imageforge's child) writes the layout while exporting.
        running.signal(signal.SIGSTOP, group=True)
        assert ready(tmp_path)
        assert not (tmp_path / "artifacts" / "entries").exists()
        running.signal(signum, group=group)
        running.signal(signal.SIGCONT, group=True)
    assert running.finish() == 130, running.stderr
    assert "Traceback" not in running.stderr
    assert running.last_line.startswith("imageforge: error: ")
    assert "interrupted" in running.last_line
    assert not (tmp_path / "artifacts" / "entries").exists()
    assert_cache_consistent(tmp_path)
    assert_engine_clean(dockerd2, builders)
    deadline = time.monotonic() + 20
    while dockerd2.step_mounts() != steps:
        assert time.monotonic() < deadline, "the interrupted step's root file system stays"
        time.sleep(0.2)
    if phase == "running":
        built(sample_manifest, tmp_path, dockerd2, "nccl", fresh)
    else:
        built(sample_manifest, tmp_path, dockerd2, "efa")

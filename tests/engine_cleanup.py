"""Leaving the host engine as the test session found it: the images its tests made are
removed when it ends. A full run left 139 images behind (real CUDA ones among them) that
nothing reads afterwards; with BuildKit's cache and pytest's temp directories, runs on one
disk filled its 100 GB.

Sessions at once on one engine (a single test run beside a full one) cannot tell whose image
is whose, so each holds a shared lock on one file while it runs, and only a session that ends
alone (it gets the lock exclusively) removes anything."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# Names this suite's images take: its own tags, the registry service pytest-docker builds
# (imageforge-test-<pid>-registry), the image-store artifacts of its caches, what it pushed
# to its registries (the docker driver keeps a pushed image in the engine too), and the
# default tags (<target>-<key>) of builds of the sample and real manifests without --tag.
TEST_IMAGES = re.compile(r"^(imageforge-test[/-]|imageforge-artifact/|127\.0\.0\.1:"
                         r"|imageforge/(sample-smddp|real-efa-nccl):[a-z0-9-]+-[0-9a-f]{12}$)")
UNTAGGED = "<none>:<none>"
# Image names per `docker image rm`: well under any command-line limit.
BATCH = 200
# `docker image rm` calls at once.
AT_ONCE = 8
LOCK = Path(os.environ.get("IMAGEFORGE_TEST_ENGINE_LOCK", "/tmp/imageforge-test-engine.lock"))
# Only tags holding this text are removed (all test tags when unset).
ONLY_ENV = "IMAGEFORGE_TEST_CLEANUP_ONLY"


def image_table() -> set[tuple[str, str]]:
    """Every (name, image ID) in the host engine, the name of an untagged image being
    "<none>:<none>"; empty when there is no engine to ask."""
    try:
        listed = subprocess.run(["docker", "image", "ls", "--all", "--no-trunc", "--format",
                                 "{{.Repository}}:{{.Tag}} {{.ID}}"],
                                capture_output=True, text=True, check=False, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {(name, ident) for name, _, ident in
            (line.partition(" ") for line in listed.stdout.splitlines()) if ident}


def left_behind(before: set[tuple[str, str]], after: set[tuple[str, str]]) -> list[str]:
    """What a session made that nothing needs after it: the test-named tags that appeared,
    and the untagged images that appeared (`docker buildx build` without a tag loads one).
    Another name, or an image that was there before, is never touched."""
    new = after - before
    # A session that checks this clean-up (test_engine_cleanup's child) runs beside the
    # suite's other workers on one engine: it names its own token, so it never removes the
    # test images another worker made meanwhile and still uses.
    only = os.environ.get(ONLY_ENV, "")
    tags = sorted(name for name, _ in new if TEST_IMAGES.match(name) and only in name)
    untagged = sorted({ident for name, ident in new if name == UNTAGGED
                       and (not only or only in history(ident))})
    return tags + untagged


def history(ident: str) -> str:
    """The commands that made image `ident`: an untagged image has no name to hold a token,
    but its build steps do (a worker's own untagged results must survive a child session)."""
    try:
        shown = subprocess.run(["docker", "image", "history", "--no-trunc", "--format",
                                "{{.CreatedBy}}", ident], capture_output=True, text=True,
                               check=False, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return shown.stdout


def remove_images(names: list[str]) -> None:
    """Several `docker image rm` at once: with containerd's image store each removal waits
    for a garbage collection of its own, and the engine runs several of those side by side
    (80 images: 22 s one at a time, 8 s in 8 calls at once), which is most of the last
    worker's teardown at the end of a full run."""
    share = max(1, min(BATCH, -(-len(names) // AT_ONCE)))
    batches = [names[start:start + share] for start in range(0, len(names), share)]
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        list(pool.map(_remove, batches))


def _remove(batch: list[str]) -> None:
    subprocess.run(["docker", "image", "rm", "--force", *batch], capture_output=True,
                   check=False, timeout=600)


@pytest.fixture(scope="session", autouse=True)
def engine_left_as_found() -> Iterator[None]:
    """Autouse and session-scoped, so it is set up before the other session fixtures and
    torn down after them (the registry service's container is gone by then)."""
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        before = image_table()
        yield
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another session is running: its images cannot be told from ours
        if before:
            remove_images(left_behind(before, image_table()))

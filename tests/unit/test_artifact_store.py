"""The artifact store's promises, on real OCI layouts adopted by the real store (only their
bytes are made up, so no Docker is needed): verify re-hashes and discards corrupt entries,
prune removes the least recently used first, keeps the newest of each stage and the store
under its size, and never removes an entry whose key lock another process holds.
Locks are real flock locks held by a second process."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from imageforge.cache.artifacts import ArtifactStore, Entry
from imageforge.cache.keylock import locked
from imageforge.errors import CacheError
from tests.cache_consistency import assert_cache_consistent, sha256_of
from tests.oci_layout import key_of, oci_layout

ROOT = Path(__file__).resolve().parents[2]
SHARED = os.urandom(2048)  # a base layer every entry has


class Store:
    """A store in tmp_path whose entries are added, and used, in the order they are named."""

    def __init__(self, tmp_path: Path) -> None:
        self.cache = tmp_path / "cache"
        self.store = ArtifactStore(self.cache / "artifacts")
        self.scratch = tmp_path / "layouts"
        self.used: list[Entry] = []

    def add(self, name: str, stage: str, layer_bytes: int = 4096) -> Entry:
        entry = self.store.add(key=key_of(name), stage=stage, inputs={"name": name},
                               build_seconds=1.0,
                               layout=oci_layout(self.scratch / name,
                                                 [os.urandom(layer_bytes), SHARED]))
        self.use(entry)
        return entry

    def use(self, entry: Entry) -> None:
        """Mark `entry` the most recently used (strictly later than every other use)."""
        floor = max((e.last_used for e in self.used), default=0.0)
        while True:
            self.store.touch(entry.key)
            latest = self.store.get(entry.key)
            assert latest is not None
            if latest.last_used > floor:
                break
        self.used = [e for e in self.used if e.key != entry.key] + [latest]

    def names(self) -> list[str]:
        return sorted(str(e.inputs["name"]) for e in self.store.all_entries())


def corrupt(blob: Path) -> None:
    """Change one byte in place: same size, same inode (every hard link sees it)."""
    with blob.open("r+b") as handle:
        first = handle.read(1)
        handle.seek(0)
        handle.write(bytes([first[0] ^ 0xFF]))


def layer_blob(entry: Entry) -> Path:
    """The entry's own random layer (the biggest blob that is not the shared one)."""
    shared = hashlib.sha256(SHARED).hexdigest()
    blobs = [p for p in (entry.path / "blobs" / "sha256").iterdir() if p.name != shared]
    return max(blobs, key=lambda p: p.stat().st_size)


# ---- verify ---------------------------------------------------------------------------------


@pytest.mark.parametrize("verified_before", [False, True], ids=["fresh", "verified-before"])
def test_verify_rehashes_and_discards_an_entry_with_a_corrupted_blob(
        tmp_path: Path, verified_before: bool, capsys: pytest.CaptureFixture[str]) -> None:
    s = Store(tmp_path)
    good, bad = s.add("good", "efa"), s.add("bad", "nccl")
    if verified_before:
        assert s.store.verify(bad.key) == s.store.get(bad.key)
    blob = layer_blob(bad)
    corrupt(blob)

    assert s.store.verify(bad.key) is None

    assert "cached artifact of nccl" in capsys.readouterr().err
    assert s.names() == ["good"]
    assert not (s.store.blobs / blob.name).exists(), "the bad shared blob is gone too"
    assert s.store.verify(good.key) is not None
    assert (s.store.blobs / hashlib.sha256(SHARED).hexdigest()).exists()
    assert_cache_consistent(s.cache)


def test_verify_keeps_an_intact_entry_and_the_consistency_check_agrees(tmp_path: Path) -> None:
    s = Store(tmp_path)
    entry = s.add("one", "efa")
    assert s.store.verify(entry.key) == s.store.get(entry.key)
    assert s.store.verify(entry.key) == s.store.get(entry.key)
    assert_cache_consistent(s.cache)


def test_the_consistency_check_rehashes_blobs_itself(tmp_path: Path) -> None:
    s = Store(tmp_path)
    entry = s.add("one", "efa")
    blob = layer_blob(entry)
    corrupt(blob)
    with pytest.raises(AssertionError, match=f"blob {blob.name} holds other bytes"):
        assert_cache_consistent(s.cache)
    assert sha256_of(blob) != blob.name


# ---- prune ----------------------------------------------------------------------------------


def test_max_size_removes_the_least_recently_used_first(tmp_path: Path) -> None:
    s = Store(tmp_path)
    entries = [s.add(name, "efa") for name in ("a", "b", "c", "d")]
    s.use(entries[0])  # a is now the most recently used: b is the oldest
    assert [e.inputs["name"] for e in s.used[-2:]] == ["d", "a"]
    newest_two = s.store.size(s.used[-2:])

    removed = s.store.prune(max_size=newest_two)

    assert [e.inputs["name"] for e in removed] == ["b", "c"]
    assert s.names() == ["a", "d"]
    assert s.store.size() <= newest_two
    assert_cache_consistent(s.cache)


def test_max_size_removes_no_more_than_it_must(tmp_path: Path) -> None:
    s = Store(tmp_path)
    for name in ("a", "b", "c"):
        s.add(name, "efa")

    removed = s.store.prune(max_size=s.store.size() - 1)

    assert [e.inputs["name"] for e in removed] == ["a"]
    assert s.names() == ["b", "c"]


def test_keep_last_keeps_the_newest_of_each_stage_whatever_their_age(tmp_path: Path) -> None:
    s = Store(tmp_path)
    for name, stage in [("e1", "efa"), ("n1", "nccl"), ("e2", "efa"), ("e3", "efa"),
                        ("n2", "nccl"), ("b1", "boost")]:
        s.add(name, stage)

    removed = s.store.prune(older_than=0, keep_last=2)

    assert [e.inputs["name"] for e in removed] == ["e1"]
    assert s.names() == ["b1", "e2", "e3", "n1", "n2"]
    assert_cache_consistent(s.cache)


def test_keep_last_holds_against_max_size_too(tmp_path: Path) -> None:
    s = Store(tmp_path)
    for name, stage in [("e1", "efa"), ("n1", "nccl"), ("e2", "efa"), ("n2", "nccl")]:
        s.add(name, stage)

    removed = s.store.prune(max_size=0, keep_last=1)

    assert sorted(str(e.inputs["name"]) for e in removed) == ["e1", "n1"]
    assert s.names() == ["e2", "n2"]


def test_older_than_spares_entries_used_since(tmp_path: Path) -> None:
    s = Store(tmp_path)
    s.add("old", "efa")
    assert s.store.prune(older_than=3600) == []
    assert s.names() == ["old"]


# ---- key locks, held by another process ------------------------------------------------------

HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX if sys.argv[2] == "exclusive" else fcntl.LOCK_SH)
print("held", flush=True)
sys.stdin.read()
"""


@contextmanager
def held_by_another_process(path: Path, mode: str) -> Iterator[subprocess.Popen[str]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path), mode],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        yield holder
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(timeout=60)


def test_a_key_lock_excludes_another_process_and_is_freed_when_it_ends(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "k.lock"
    with held_by_another_process(path, "exclusive"), \
            pytest.raises(CacheError, match="gave up after 1 s waiting for the lock of k"), \
            locked(path, shared=True, timeout=1, what="k"):
        pytest.fail("took a lock another process holds exclusively")
    with locked(path, shared=False, timeout=1, what="k"):
        pass


def test_shared_key_locks_coexist_and_exclude_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "k.lock"
    with held_by_another_process(path, "shared"):
        with locked(path, shared=True, timeout=1, what="k"):
            pass
        with pytest.raises(CacheError, match="gave up"), \
                locked(path, shared=False, timeout=1, what="k"):
            pytest.fail("took an exclusive lock while another process reads the key")


PRUNE = """
import sys
from pathlib import Path
from imageforge.cache.artifacts import ArtifactStore
removed = ArtifactStore(Path(sys.argv[1])).prune(older_than=0)
print("removed", *sorted(e.inputs["name"] for e in removed), flush=True)
"""


def test_prune_waits_for_a_build_that_holds_the_key_lock(tmp_path: Path) -> None:
    s = Store(tmp_path)
    busy = s.add("busy", "efa")
    s.add("idle", "nccl")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with held_by_another_process(s.store.lock_path(busy.key), "shared"):
        prune = subprocess.Popen([sys.executable, "-c", PRUNE, str(s.store.root)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert prune.stderr is not None
        waiting = prune.stderr.readline()  # prune says so when it first finds the lock taken
        try:
            assert "waiting for another imageforge process using efa" in waiting, waiting
            assert "busy" in s.names(), "removed while a build held its lock"
            assert prune.poll() is None
        finally:
            if prune.poll() is None and "waiting" not in waiting:
                prune.kill()
    out, err = prune.communicate(timeout=120)
    assert prune.returncode == 0, err
    assert out == "removed busy idle\n"
    assert s.names() == []
    assert_cache_consistent(s.cache)


META_KEY = "sha256:" + "c" * 64
GOOD_META = {"key": META_KEY, "stage": "efa", "inputs": {}, "size": 10,
             "digest": "sha256:" + "d" * 64, "build_seconds": 1.5, "created": 1.0,
             "last_used": 2.0, "hits": 0, "image": None}


@pytest.mark.parametrize("meta", [
    [1, 2], "text", {**GOOD_META, "size": "10"}, {**GOOD_META, "hits": True},
    {k: v for k, v in GOOD_META.items() if k != "stage"}, {**GOOD_META, "extra": 1},
    {**GOOD_META, "key": "sha256:" + "e" * 64}, {**GOOD_META, "inputs": []},
])
def test_a_meta_json_of_the_wrong_shape_is_no_entry_and_no_traceback(
        tmp_path: Path, meta: object) -> None:
    """cache.ls and plan raised TypeError/AttributeError on such a record."""
    entry = tmp_path / "cache" / "artifacts" / "entries" / ("c" * 64)
    entry.mkdir(parents=True)
    (entry / "meta.json").write_text(json.dumps(meta))
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "cache.ls",
                             "--json"], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert f"{entry / 'meta.json'}: " in result.stderr
    assert json.loads(result.stdout) == []


def test_a_well_formed_meta_json_is_an_entry(tmp_path: Path) -> None:
    entry = tmp_path / "entries" / ("c" * 64)
    entry.mkdir(parents=True)
    (entry / "meta.json").write_text(json.dumps(GOOD_META))
    found = ArtifactStore(tmp_path, images=None).get(META_KEY)
    assert found is not None
    assert (found.stage, found.size) == ("efa", 10)

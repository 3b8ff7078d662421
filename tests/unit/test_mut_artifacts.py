"""The artifact store's smaller promises (imageforge/cache/artifacts.py), on real OCI layouts with
made-up bytes: what a stage key is, that verification trusts only untouched blobs, that a
corrupt or incomplete entry is discarded with its bad blobs, that sizes count shared blobs
once, that uses are counted, and that only dead processes' work directories are cleaned."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest

from imageforge.cache import artifacts
from imageforge.cache.artifacts import STAMPS, ArtifactStore, Entry
from imageforge.errors import CacheError
from tests.oci_layout import key_of, oci_layout

SHARED = b"shared base layer " * 100
ROOT = Path(__file__).resolve().parents[2]


def _add(store: ArtifactStore, tmp_path: Path, name: str, layer: bytes) -> Entry:
    return store.add(key=key_of(name), stage="efa", inputs={"name": name}, build_seconds=1.234,
                     layout=oci_layout(tmp_path / "layouts" / name, [layer, SHARED]))


def test_key_hex_takes_exactly_sha256_and_64_lowercase_hex() -> None:
    hexpart = "0123456789abcdef" * 4
    assert artifacts.key_hex("sha256:" + hexpart) == hexpart
    assert artifacts.key_hex(hexpart) == hexpart
    for bad in ("sha256:" + hexpart.upper(), "sha256:" + hexpart[:-1], hexpart + "0",
                "sha256:" + hexpart[:-1] + "g", "sha256:" + "X" * 64, "md5:" + hexpart):
        with pytest.raises(CacheError) as info:
            artifacts.key_hex(bad)
        assert str(info.value) == f"{bad!r} is not a stage key (sha256:<64 hex>)."


def test_add_records_the_entry_and_consumes_theoci_layout(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    layer = os.urandom(1000)
    entry = _add(store, tmp_path, "a", layer)
    assert entry.key == key_of("a")
    assert entry.stage == "efa"
    assert entry.inputs == {"name": "a"}
    assert entry.build_seconds == 1.23
    assert entry.hits == 0
    assert entry.created == entry.last_used
    assert entry.path == store.root / "entries" / artifacts.key_hex(key_of("a"))
    assert entry.size == sum(p.stat().st_size for p in (entry.path / "blobs/sha256").iterdir())
    assert store.get(entry.key) == entry
    index = json.loads((entry.path / "index.json").read_text())
    assert entry.digest == index["manifests"][0]["digest"]
    assert entry.context == f"oci-layout://{entry.path}@{entry.digest}"
    assert not (tmp_path / "layouts" / "a").exists()
    assert list((store.root / "tmp").iterdir()) == []
    meta = json.loads((entry.path / "meta.json").read_text())
    assert meta == entry.meta()
    assert "path" not in meta


def test_a_layout_that_is_not_one_is_refused(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(CacheError) as info:
        store.add(key=key_of("x"), stage="efa", inputs={}, layout=bad, build_seconds=0)
    assert str(info.value).startswith(f"{bad}: not an OCI layout BuildKit wrote (")
    (bad / "index.json").write_text('{"manifests": []}')
    with pytest.raises(CacheError, match="not an OCI layout"):
        store.add(key=key_of("x"), stage="efa", inputs={}, layout=bad, build_seconds=0)


def test_a_blob_not_matching_its_name_is_refused_and_nothing_is_kept(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    layout = oci_layout(tmp_path / "l", [b"layer", SHARED])
    # The bad blob is the last one adopted: the ones before it were already shared.
    blob = max((layout / "blobs/sha256").iterdir(), key=lambda p: p.name)
    blob.write_bytes(b"tampered")
    with pytest.raises(CacheError) as info:
        store.add(key=key_of("x"), stage="nccl", inputs={}, layout=layout, build_seconds=0)
    assert str(info.value) == ("BuildKit exported a blob of nccl whose content does not match "
                               f"its name ({blob.name}); rebuild it.")
    assert store.all_entries() == []
    assert list(store.blobs.iterdir()) == []
    assert list(store.tmp.iterdir()) == []
    assert not layout.exists()


def test_the_same_key_added_twice_keeps_the_first(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    first = _add(store, tmp_path, "a", b"first")
    again = store.add(key=first.key, stage="efa", inputs={"name": "again"}, build_seconds=9,
                      layout=oci_layout(tmp_path / "layouts" / "again", [b"second", SHARED]))
    assert again == first
    assert store.get(first.key) == first
    assert list(store.tmp.iterdir()) == []
    assert hashlib.sha256(b"second").hexdigest() not in {p.name for p in store.blobs.iterdir()}


def test_get_is_none_for_a_missing_or_unreadable_entry(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    assert store.get(key_of("none")) is None
    entry = _add(store, tmp_path, "a", b"a")
    (entry.path / "meta.json").write_text("{broken")
    assert store.get(entry.key) is None
    assert store.verify(entry.key) is None


def test_verify_rehashes_a_touched_blob_and_discards_the_entry(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ArtifactStore(tmp_path / "store")
    entry = _add(store, tmp_path, "a", b"layer-a" * 100)
    other = _add(store, tmp_path, "b", b"layer-b" * 100)
    assert store.verify(entry.key) == entry
    stamps = json.loads((entry.path / "verified.json").read_text())
    blobs = sorted((entry.path / "blobs/sha256").iterdir())
    assert set(stamps) == {b.name for b in blobs}
    bad = entry.path / "blobs/sha256" / hashlib.sha256(b"layer-a" * 100).hexdigest()
    with bad.open("r+b") as handle:  # same inode and size, new bytes and mtime
        handle.write(b"X")
    assert store.verify(entry.key) is None
    err = capsys.readouterr().err
    assert err == (f"imageforge: warning: cached artifact of efa ({entry.key[:19]}) is corrupt "
                   "(1 bad blob(s)); discarding it, the stage will be rebuilt.\n")
    assert store.get(entry.key) is None
    assert not (store.blobs / bad.name).exists()
    # the blob both entries share stays for the other
    assert (store.blobs / hashlib.sha256(SHARED).hexdigest()).exists()
    assert store.verify(other.key) == other


def test_verify_trusts_a_blob_whose_stamp_is_unchanged(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    entry = _add(store, tmp_path, "a", b"layer-a" * 100)
    assert store.verify(entry.key) == entry
    blob = entry.path / "blobs/sha256" / hashlib.sha256(b"layer-a" * 100).hexdigest()
    before = blob.stat()
    with blob.open("r+b") as handle:
        handle.write(b"X")
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns))
    # Not hashed again: the stamp (size, mtime, inode) says it is the verified file.
    assert store.verify(entry.key) == entry


def test_an_added_entry_is_trusted_without_hashing_its_new_blobs_again(tmp_path: Path) -> None:
    # add hashes every blob BuildKit exported: the first build that reuses the entry must not
    # hash them all again (seconds for a large image).
    store = ArtifactStore(tmp_path / "store")
    first = _add(store, tmp_path, "a", b"layer-a" * 100)
    layer = first.path / "blobs/sha256" / hashlib.sha256(b"layer-a" * 100).hexdigest()
    shared = hashlib.sha256(SHARED).hexdigest()
    stamps = json.loads((first.path / STAMPS).read_text())
    assert sorted(stamps) == sorted(p.name for p in (first.path / "blobs/sha256").iterdir())
    before = layer.stat()
    with layer.open("r+b") as handle:
        handle.write(b"X")
    os.utime(layer, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert store.verify(first.key) == first
    # A second entry links the shared copy stored before: add never read those bytes, so
    # they are not stamped, and verify hashes them once.
    second = _add(store, tmp_path, "b", b"layer-b" * 100)
    assert shared not in json.loads((second.path / STAMPS).read_text())
    (store.blobs / shared).write_bytes(b"corrupt")
    assert store.verify(second.key) is None


def test_verify_discards_an_entry_without_its_index(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    store = ArtifactStore(tmp_path / "store")
    entry = _add(store, tmp_path, "a", b"a")
    (entry.path / "index.json").unlink()
    assert store.verify(entry.key) is None
    assert "(0 bad blob(s))" in capsys.readouterr().err
    assert store.get(entry.key) is None


def test_a_stale_stamp_file_is_rewritten(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    entry = _add(store, tmp_path, "a", b"a")
    (entry.path / "verified.json").write_text("not json")
    assert store.verify(entry.key) == entry
    stamps = json.loads((entry.path / "verified.json").read_text())
    blobs = sorted((entry.path / "blobs/sha256").iterdir())
    assert stamps == {b.name: [b.stat().st_size, b.stat().st_mtime_ns, b.stat().st_ino]
                      for b in blobs}


def test_all_entries_skips_what_is_not_an_entry(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    assert store.all_entries() == []
    a = _add(store, tmp_path, "a", b"a")
    (store.entry_root / "short").mkdir()
    (store.entry_root / ("f" * 64)).mkdir()  # no meta: not readable, skipped
    assert store.all_entries() == [a]


def test_touch_counts_a_use(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    entry = _add(store, tmp_path, "a", b"a")
    store.touch(entry.key)
    store.touch(entry.key)
    used = store.get(entry.key)
    assert used is not None
    assert used.hits == 2
    assert used.last_used >= entry.last_used
    assert used.created == entry.created
    store.touch(key_of("missing"))  # nothing to count
    assert store.get(key_of("missing")) is None


def test_size_counts_a_shared_blob_once(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    a = _add(store, tmp_path, "a", b"A" * 5000)
    b = _add(store, tmp_path, "b", b"B" * 7000)
    own_a, own_b = a.size - len(SHARED), b.size - len(SHARED)
    assert store.size() == own_a + own_b + len(SHARED)
    assert store.size([a]) == a.size
    assert store.size([]) == 0


def test_remove_takes_the_entry_and_blobs_only_it_used(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    a = _add(store, tmp_path, "a", b"A" * 10)
    b = _add(store, tmp_path, "b", b"B" * 10)
    store.remove(a.key)
    assert store.get(a.key) is None
    assert store.get(b.key) == b
    names = {p.name for p in store.blobs.iterdir()}
    assert hashlib.sha256(b"A" * 10).hexdigest() not in names
    assert {hashlib.sha256(SHARED).hexdigest(), hashlib.sha256(b"B" * 10).hexdigest()} <= names
    store.remove(a.key)  # gone already: nothing to do
    store.remove(b.key)
    assert list(store.blobs.iterdir()) == []
    assert list(store.tmp.iterdir()) == []


def test_cleanup_removes_only_the_work_of_dead_processes(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    store.cleanup()  # no tmp yet
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with _answering_process() as live:
        (store.tmp / f"{live.pid}-abc").mkdir(parents=True)
        (store.tmp / f"{dead}-abc").mkdir()
        (store.tmp / "junk").mkdir()
        mine = store.scratch()  # cleans up first
        # Asking whether a process lives does not disturb it (a live child, never this
        # process or init: a mutant that signals for real must hit something we watch).
        assert _answers(live)
        assert artifacts._alive(live.pid)
        assert _answers(live)
    assert mine.parent == store.tmp
    assert mine.name.startswith(f"{os.getpid()}-")
    assert sorted(p.name for p in store.tmp.iterdir()) == sorted([f"{live.pid}-abc", mine.name])
    store.cleanup()
    assert sorted(p.name for p in store.tmp.iterdir()) == [mine.name]
    assert not artifacts._alive(int(dead))


def test_verify_discards_a_corrupt_entry_whose_shared_copy_is_already_gone(
        tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    entry = _add(store, tmp_path, "a", b"layer-a" * 100)
    name = hashlib.sha256(b"layer-a" * 100).hexdigest()
    (store.blobs / name).unlink()  # e.g. another process's verify took it first
    (entry.path / "blobs/sha256" / name).write_bytes(b"corrupt")
    assert store.verify(entry.key) is None
    assert store.get(entry.key) is None


def _use(entry: Entry, when: float) -> None:
    meta_path = entry.path / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["last_used"] = when
    meta_path.write_text(json.dumps(meta))


def test_prune_by_size_counts_only_what_age_left(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    old, mid, new = (_add(store, tmp_path, n, n.encode() * 5000) for n in ("old", "mid", "new"))
    now = time.time()
    _use(old, now - 10_000)
    _use(mid, now - 200)
    _use(new, now - 100)
    fits = store.size([store.get(mid.key), store.get(new.key)])  # type: ignore[list-item]
    removed = store.prune(max_size=fits, older_than=5_000)
    assert [e.key for e in removed] == [old.key]
    assert {e.key for e in store.all_entries()} == {mid.key, new.key}


def test_prune_by_size_passes_over_protected_entries(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    only = store.add(key=key_of("only"), stage="boost", inputs={}, build_seconds=1,
                     layout=oci_layout(tmp_path / "layouts" / "only", [b"o" * 5000, SHARED]))
    older = _add(store, tmp_path, "older", b"a" * 5000)
    newer = _add(store, tmp_path, "newer", b"b" * 5000)
    now = time.time()
    _use(only, now - 300)  # the least recently used, but the only boost entry
    _use(older, now - 200)
    _use(newer, now - 100)
    removed = store.prune(max_size=0, keep_last=1)
    assert [e.key for e in removed] == [older.key]
    assert {e.key for e in store.all_entries()} == {only.key, newer.key}


def test_prune_waits_while_a_build_reads_the_entry(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    store = ArtifactStore(tmp_path / "store")
    entry = _add(store, tmp_path, "busy", b"busy")
    path = store.lock_path(entry.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    hold = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_SH)\nprint('held', flush=True)\nsys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    assert holder.stdout.readline() == "held\n"
    result: list[list[Entry]] = []
    pruning = threading.Thread(target=lambda: result.append(store.prune(older_than=-1)))
    pruning.start()
    try:
        deadline = time.monotonic() + 30
        err = ""
        while "waiting" not in err:
            assert time.monotonic() < deadline
            assert pruning.is_alive()
            time.sleep(0.05)
            err += capsys.readouterr().err
        assert err == ("imageforge: note: waiting for another imageforge process using efa "
                       f"{entry.key[:19]}\n")
        time.sleep(0.5)
        assert store.get(entry.key) is not None
        assert pruning.is_alive()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    pruning.join(timeout=60)
    assert [e.key for e in result[0]] == [entry.key]
    assert store.get(entry.key) is None



# ---- helpers: live processes, and another process acting at one exact moment -------------

@contextlib.contextmanager
def _answering_process() -> Iterator[subprocess.Popen[str]]:
    """A child that answers each line on its stdin with 'pong' until its stdin closes."""
    script = "import sys\nfor line in sys.stdin:\n    print('pong', flush=True)\n"
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        yield child
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=60)


def _answers(child: subprocess.Popen[str]) -> bool:
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        child.stdin.write("ping\n")
        child.stdin.flush()
    except BrokenPipeError:
        return False
    return child.stdout.readline() == "pong\n"


@contextlib.contextmanager
def _before_each(builtin: str, action: Callable[[FrameType], None]) -> Iterator[None]:
    """Run `action(frame of the caller)` right before every call of the C function named
    `builtin` made by this thread: what another process would do at exactly that moment."""
    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "c_call" and getattr(arg, "__name__", None) == builtin:
            action(frame)

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)


def _stats_of(path: Path) -> Callable[[FrameType], int]:
    """How many times os.stat was called on `path` (through Path.stat), counting this one."""
    seen = [0]

    def count(frame: FrameType) -> int:
        if frame.f_locals.get("self") == path:
            seen[0] += 1
            return seen[0]
        return 0

    return count


def test_the_store_keeps_shared_blobs_and_locks_where_its_layout_says(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    entry = _add(store, tmp_path, "a", b"layer-a")
    names = sorted(p.name for p in (entry.path / "blobs/sha256").iterdir())
    assert sorted(p.name for p in (tmp_path / "store/blobs/sha256").iterdir()) == names
    assert store.lock_path(entry.key) == (
        tmp_path.resolve() / "store/locks" / f"{artifacts.key_hex(entry.key)}.lock")


def test_cleanup_keeps_the_work_of_a_live_process_of_another_user(tmp_path: Path) -> None:
    """Asking whether a process of another user lives is refused (EPERM): it does live."""
    if os.geteuid() != 0:
        store = ArtifactStore(tmp_path / "store")
        (store.tmp / "1-init").mkdir(parents=True)
        store.cleanup()
        assert (store.tmp / "1-init").is_dir()
        return
    # As root: clean up as nobody, in a store everyone may write, next to our own work.
    shared = Path(tempfile.mkdtemp())
    try:
        shared.chmod(0o777)
        store = ArtifactStore(shared / "store")
        store.tmp.mkdir(parents=True)
        store.tmp.chmod(0o777)
        ours = store.tmp / f"{os.getpid()}-root"
        ours.mkdir()
        # In this process too: mutmut picks the tests to run for a function by what ran in
        # the test's own process, and the forked child's calls are not seen.
        store.cleanup()
        assert ours.is_dir()
        child = os.fork()
        if child == 0:  # pragma: no cover (the child)
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                store.cleanup()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert ours.is_dir()
    finally:
        shutil.rmtree(shared)


def test_a_stray_file_in_tmp_does_not_stop_cleanup(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    store.tmp.mkdir(parents=True)
    (store.tmp / "stray.txt").write_text("not a work directory")
    mine = store.scratch()
    assert mine.is_dir()
    assert mine.parent == store.tmp


def test_remove_clears_a_stray_file_where_an_entry_would_be(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    a = _add(store, tmp_path, "a", b"A" * 10)
    stray = store.entry_root / artifacts.key_hex(key_of("stray"))
    stray.write_text("not an entry")
    assert store.get(key_of("stray")) is None
    store.remove(key_of("stray"))
    assert not stray.exists()
    assert store.all_entries() == [a]


def test_a_blob_another_process_shares_first_stays_this_entrys_copy(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    layer = b"the same layer built twice"
    name = hashlib.sha256(layer).hexdigest()
    theirs = tmp_path / "theirs"
    theirs.write_bytes(layer)

    def share_first(frame: FrameType) -> None:
        # Right before this add shares its copy, the other process shares the same bytes.
        dest, shared = frame.f_locals.get("dest"), frame.f_locals.get("shared")
        if shared == store.blobs / name and dest is not None and dest.exists() \
                and not shared.exists():
            os.link(theirs, shared)

    with _before_each("link", share_first):
        entry = _add(store, tmp_path, "a", layer)
    assert (store.blobs / name).stat().st_ino == theirs.stat().st_ino
    own = entry.path / "blobs/sha256" / name
    assert own.read_bytes() == layer
    assert own.stat().st_ino != theirs.stat().st_ino
    assert store.verify(entry.key) == entry


def test_garbage_another_process_collected_first_is_passed_over(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    a = _add(store, tmp_path, "a", b"A" * 10)
    b = _add(store, tmp_path, "b", b"B" * 10)
    own = store.blobs / hashlib.sha256(b"A" * 10).hexdigest()
    stats = _stats_of(own)

    def collect_first(frame: FrameType) -> None:
        if stats(frame) == 1:
            own.unlink()

    with _before_each("stat", collect_first):
        store.remove(a.key)
    assert store.get(a.key) is None
    assert store.verify(b.key) == b
    assert {p.name for p in store.blobs.iterdir()} == {
        p.name for p in (b.path / "blobs/sha256").iterdir()}


def test_size_counts_nothing_for_a_blob_removed_while_counting(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    layer = b"L" * 3000
    entry = _add(store, tmp_path, "a", layer)
    blob = entry.path / "blobs/sha256" / hashlib.sha256(layer).hexdigest()
    stats = _stats_of(blob)

    def remove_between(frame: FrameType) -> None:
        if stats(frame) == 2:  # listed and seen to be a file, then removed
            blob.unlink()

    with _before_each("stat", remove_between):
        assert store.size([entry]) == entry.size - len(layer)


_FULL_DISK = """
import sys
from pathlib import Path
from imageforge.cache.artifacts import ArtifactStore
from imageforge.errors import CacheError
from tests.oci_layout import key_of, oci_layout
disk = Path(sys.argv[1])
store = ArtifactStore(disk / "store")
layout = oci_layout(disk / "export", [b"layer" * 100])
try:
    with open(disk / "filler", "wb", buffering=0) as filler:
        while True:
            filler.write(bytes(4096))
except OSError:
    pass
try:
    store.add(key=key_of("x"), stage="efa", inputs={}, layout=layout, build_seconds=0)
except CacheError as error:
    print(error)
"""


def test_add_on_a_full_disk_names_the_store_root(tmp_path: Path) -> None:
    """On a real, full 256 KiB tmpfs (mounted in a private user and mount namespace)."""
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True, check=False).returncode != 0:
        problem = "needs unshare -rm (user and mount namespaces) for a small tmpfs"
        if os.environ.get("CI"):
            pytest.fail(f"{problem}; CI must run it (util-linux, user namespaces enabled).")
        pytest.skip(f"{problem} (set CI=true to make this a failure)")
    # The same add, on a disk with room, in this process (mutmut picks the tests to run for a
    # function by what ran in the test's own process, not in the subprocess below).
    roomy = ArtifactStore(tmp_path / "roomy")
    roomy.add(key=key_of("x"), stage="efa", inputs={},
              layout=oci_layout(tmp_path / "export", [b"layer" * 100]), build_seconds=0)
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = 'mount -t tmpfs -o size=256k tmpfs "$1" && exec "$2" -c "$3" "$1"'
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", mount, "sh", str(disk), sys.executable, _FULL_DISK],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, check=False, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, "")
    root = ArtifactStore(disk / "store").root
    assert proc.stdout == (
        f"the disk holding {root} is full; free space there (e.g. `invoke cache.prune "
        "--max-size 20G`) or point INVOKE_IMAGEFORGE_CACHE_DIR at a bigger disk, then run "
        "again.\n")
    # A full disk there says nothing about this one.
    assert not any(disk.iterdir())

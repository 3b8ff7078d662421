"""The artifact store's records (imageforge/cache/artifacts.py) on a real store in tmp_path:
the warning each unusable meta.json gets (once), the records written in sorted-key form, the
store's stable image namespace, and the work of a live process of another user kept by
cleanup."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from imageforge.cache.artifacts import ArtifactStore, Entry
from tests.oci_layout import key_of, oci_layout


def _add(store: ArtifactStore, tmp_path: Path, name: str) -> Entry:
    return store.add(key=key_of(name), stage="efa", inputs={"z": 1, "a": 2},
                     build_seconds=1.5,
                     layout=oci_layout(tmp_path / "layouts" / name, [name.encode() * 10]))


def _warning(meta: Path, why: str) -> str:
    return (f"imageforge: warning: {meta}: {why}; ignoring that artifact (its stage builds "
            "again; `invoke cache.prune` removes what nothing uses).\n")


def _rewritten(entry: Entry, change: Callable[[dict[str, Any]], object]) -> Path:
    """The entry's meta.json, rewritten as `change` makes its data (or what it returns)."""
    meta = entry.path / "meta.json"
    data = json.loads(meta.read_text())
    made = change(data)
    meta.write_text(json.dumps(data if made is None else made))
    return meta


def _without(*names: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        for name in names:
            del data[name]
    return change


def _unknown_and_without_hits(data: dict[str, Any]) -> None:
    data["extra"] = 1
    del data["hits"]


@pytest.mark.parametrize(("change", "why"), [
    (lambda data: [data], "not a JSON object"),
    (lambda _data: "text", "not a JSON object"),
    (_without("hits", "image"), "keys ['hits'] missing"),
    (_without("size", "digest"), "keys ['digest', 'size'] missing"),
    (lambda data: data.update(extra=1, more=2), "keys ['extra', 'more'] unknown"),
    # Missing keys are named before unknown ones.
    (_unknown_and_without_hits, "keys ['hits'] missing"),
    (lambda data: data.update(hits=True), "hits is True"),
    (lambda data: data.update(created="yesterday"), "created is 'yesterday'"),
])
def test_an_unusable_record_is_warned_about_by_path_and_reason_and_ignored(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        change: Callable[[dict[str, Any]], object], why: str) -> None:
    store = ArtifactStore(tmp_path / "store")
    entry = _add(store, tmp_path, "a")
    capsys.readouterr()
    meta = _rewritten(entry, change)
    assert store.get(entry.key) is None
    assert capsys.readouterr().err == _warning(meta, why)


def test_an_unreadable_record_is_named_with_the_readers_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ArtifactStore(tmp_path / "store")
    entry = _add(store, tmp_path, "a")
    capsys.readouterr()
    meta = entry.path / "meta.json"
    meta.write_text("{broken")
    assert store.get(entry.key) is None
    err = capsys.readouterr().err
    assert err.startswith(f"imageforge: warning: {meta}: not readable (")
    assert "ignoring that artifact" in err


def test_a_record_of_another_key_names_both_keys_cut_to_19_characters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ArtifactStore(tmp_path / "store")
    entry = _add(store, tmp_path, "a")
    other = key_of("b")
    capsys.readouterr()
    meta = _rewritten(entry, lambda data: data.update(key=other))
    assert store.get(entry.key) is None
    assert capsys.readouterr().err == _warning(
        meta, f"it names key {other[:19]}, not its own {entry.key[:19]}")


def test_each_unusable_record_is_warned_about_once_per_store(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ArtifactStore(tmp_path / "store")
    first, second = _add(store, tmp_path, "a"), _add(store, tmp_path, "b")
    capsys.readouterr()
    metas = [_rewritten(e, lambda data: [data]) for e in (first, second)]
    for _ in range(3):
        assert store.get(first.key) is None
        assert store.get(second.key) is None
    assert capsys.readouterr().err == "".join(_warning(m, "not a JSON object") for m in metas)
    # Another store (another command) warns again.
    assert ArtifactStore(tmp_path / "store").get(first.key) is None
    assert capsys.readouterr().err == _warning(metas[0], "not a JSON object")


def test_a_record_without_image_is_an_oci_layout_entry(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    entry = _add(store, tmp_path, "a")
    _rewritten(entry, _without("image"))
    assert store.get(entry.key) == entry
    assert entry.image is None


def _sorted_json(path: Path) -> bool:
    text = path.read_text()
    return text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def test_records_are_written_with_sorted_keys(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    entry = _add(store, tmp_path, "a")
    meta = entry.path / "meta.json"
    assert _sorted_json(meta)
    assert list(json.loads(meta.read_text())["inputs"]) == ["a", "z"]
    meta.write_text(json.dumps(entry.meta()))   # field order, as an older writer left it
    store.touch(entry.key)
    assert _sorted_json(meta)
    image = store.add_image(key=key_of("img"), stage="python", inputs={"z": 1, "a": 2},
                            ref=store.image_ref("python", key_of("img")),
                            digest="sha256:" + "c" * 64, size=5, build_seconds=0.0)
    assert _sorted_json(image.path / "meta.json")
    assert image.hits == 0
    assert store.get(image.key) == image


def test_a_stores_image_names_stay_those_earlier_runs_gave_it(tmp_path: Path) -> None:
    # The namespace of the engine's names is derived from the store's path alone, so the
    # images a previous run stored are found again (and a change would orphan them).
    store = ArtifactStore(tmp_path / "store")
    namespace = hashlib.sha256(str((tmp_path / "store").resolve()).encode()).hexdigest()[:12]
    assert store.namespace == namespace
    key = key_of("x")
    assert store.image_ref("efa", key) == f"imageforge-artifact/{namespace}/efa:{key[7:]}"
    assert ArtifactStore(tmp_path / "other").namespace != namespace


def _as_another_user(work: Callable[[], None]) -> None:
    """`work` in a forked child whose uids are nobody's, so asking about a root process is
    refused (EPERM); as another user already, in this process. A fork, not a switch of this
    process's uid: the test session's other threads (servers of other tests) keep running as
    root meanwhile. The child runs the same code in memory, so a mutant is what it runs."""
    if os.geteuid() != 0:
        work()
        return
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.setresuid(65534, 65534, 65534)
            work()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_cleanup_keeps_the_work_of_a_process_it_may_not_signal(tmp_path: Path) -> None:
    """Process 1 lives, and another user may not signal it: its work stays. In a store
    everyone may write, so a cleanup that thought it dead could remove it."""
    del tmp_path
    shared = Path(tempfile.mkdtemp())
    try:
        shared.chmod(0o755)
        store = ArtifactStore(shared / "store")
        init = store.tmp / "1-init"
        init.mkdir(parents=True)
        store.root.chmod(0o755)
        store.tmp.chmod(0o777)
        _as_another_user(store.cleanup)
        assert init.is_dir()
    finally:
        shutil.rmtree(shared)

"""imageforge/uptodate.py in process, at its edges: what the watch records of this process's own
opens and listings, where records live and what names one, the record `remember` writes field
by field, each way a record can be malformed, each failure that sends `answer` to the full
build, and the report and entry uses it writes. tests/unit/test_uptodate.py has the main
path. The engine is a real HTTP server on a unix socket, one that can also answer what no
engine should; files, directories and terminals are real."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from imageforge import uptodate
from tests.engine_socket import serve_engine

ARGV = ["build", "--target", "smddp"]
TAG = "imageforge/smddp:t"
ID = "sha256:" + "1" * 64
STDOUT = "nothing rebuilt: every stage came from the artifact cache"


# ---- the watch ------------------------------------------------------------------------------

# The watches this process's audit events go to while a test listens. An audit hook cannot be
# removed: the one hook installed here stays for the whole process, so it is this module's own
# and calls a watch only while a test runs; a Watch's hook installed for good would go on
# running (under mutmut, a mutated hook that raises) long after its test.
_LISTENING: list[uptodate.Watch] = []


def _forward(event: str, args: tuple[Any, ...]) -> None:
    for listening in _LISTENING:
        listening.hook(event, args)


sys.addaudithook(_forward)


@pytest.fixture
def watch() -> Iterator[uptodate.Watch]:
    """A watch that sees this process's real audit events while the test runs."""
    listening = uptodate.Watch()
    _LISTENING.append(listening)
    try:
        yield listening
    finally:
        _LISTENING.remove(listening)


def test_start_watching_installs_one_watch_for_the_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A watch already started is kept.
    started = uptodate.Watch()
    monkeypatch.setattr(uptodate, "WATCH", started)
    uptodate.start_watching()
    assert uptodate.WATCH is started
    # From the start, as `imageforge` starts: in a forked child, whose hook ends with it.
    (tmp_path / "read").write_text("x")
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            uptodate.WATCH = None
            uptodate.start_watching()
            first = uptodate.WATCH
            uptodate.start_watching()
            assert first is not None
            (tmp_path / "read").read_text()
            os.listdir(tmp_path)
            seen = [first is uptodate.WATCH, str(tmp_path / "read") in first.opened,
                    str(tmp_path) in first.listed]
            os.write(writer, json.dumps(seen).encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as got:
        said = got.read()
    os.waitpid(pid, 0)
    assert said == "[true, true, true]"


def test_reads_are_recorded_by_absolute_path_writes_are_not(
        tmp_path: Path, watch: uptodate.Watch, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    names = ["read", "bytes", "osopen", "w", "a", "x", "rplus", "wronly", "rdwr"]
    for name in names:
        if name != "x":
            (tmp_path / name).write_text("")
    Path("read").read_text()                           # a relative path
    with open(os.fsencode(tmp_path / "bytes"), "rb"):  # a bytes path
        pass
    os.close(os.open(tmp_path / "osopen", os.O_RDONLY))
    for name, mode in (("w", "w"), ("a", "a"), ("x", "x"), ("rplus", "r+")):
        with open(tmp_path / name, mode):
            pass
    os.close(os.open(tmp_path / "wronly", os.O_WRONLY))
    os.close(os.open(tmp_path / "rdwr", os.O_RDWR))
    mine = {p for p in watch.opened if p.startswith(f"{tmp_path}/")}
    assert mine == {str(tmp_path / n) for n in ("read", "bytes", "osopen")}


def test_an_open_event_without_flags_is_judged_by_its_mode(
        tmp_path: Path, watch: uptodate.Watch) -> None:
    # CPython's own open events carry the os flags; an extension module's may carry only the
    # mode, as sys.audit raises it here.
    for mode in ("r", "rb", "w", "a", "x", "r+"):
        sys.audit("open", str(tmp_path / mode), mode, None)
    mine = {p for p in watch.opened if p.startswith(f"{tmp_path}/")}
    assert mine == {str(tmp_path / "r"), str(tmp_path / "rb")}


def test_an_open_of_a_descriptor_is_not_a_path(tmp_path: Path, watch: uptodate.Watch) -> None:
    path = tmp_path / "f"
    path.write_text("by descriptor")
    fd = os.open(path, os.O_RDONLY)
    with open(fd) as stream:   # the open event carries the descriptor, not a path
        assert stream.read() == "by descriptor"
    assert str(path) in watch.opened


def test_listings_are_recorded_by_absolute_path(
        tmp_path: Path, watch: uptodate.Watch, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("listed", "scanned", "here", "byfd"):
        (tmp_path / name).mkdir()
    os.listdir(tmp_path / "listed")
    with os.scandir(os.fsencode(tmp_path / "scanned")):
        pass
    monkeypatch.chdir(tmp_path / "here")
    os.listdir()   # the working directory
    fd = os.open(tmp_path / "byfd", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert os.listdir(fd) == []
    finally:
        os.close(fd)
    mine = {p for p in watch.listed if p.startswith(f"{tmp_path}/")}
    assert mine == {str(tmp_path / n) for n in ("listed", "scanned", "here")}


# ---- names and places -----------------------------------------------------------------------

def test_records_live_under_the_xdg_cache_or_the_homes_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert uptodate.records_dir() == tmp_path / "xdg" / "imageforge" / "uptodate"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert uptodate.records_dir() == tmp_path / "home" / ".cache" / "imageforge" / "uptodate"


def test_the_record_name_is_a_sha256_that_a_terminal_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A build prints differently to a terminal (progress): its record is another one."""
    piped = uptodate.record_name(ARGV)
    assert re.fullmatch(r"[0-9a-f]{64}", piped)
    main, secondary = os.openpty()
    try:
        with open(secondary, "w", closefd=False) as terminal:
            monkeypatch.setattr(sys, "stdout", terminal)
            assert uptodate.record_name(ARGV) != piped
    finally:
        os.close(main)
        os.close(secondary)


def test_a_files_stat_is_size_mtime_and_inode_or_none(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("four")
    info = path.stat()
    assert uptodate._stat(str(path)) == [4, info.st_mtime_ns, info.st_ino]
    assert uptodate._stat(str(tmp_path / "missing")) is None
    assert uptodate._stat(f"{tmp_path}/a\x00b") is None   # a NUL, read from a record


def test_the_git_files_are_head_packed_refs_and_the_branch_head_names(tmp_path: Path) -> None:
    git = tmp_path / ".git"
    assert uptodate._git_files(tmp_path) == [str(git / "HEAD"), str(git / "packed-refs")]
    git.mkdir()
    (git / "HEAD").write_text("ref: refs/heads/topic/x\n")
    assert uptodate._git_files(tmp_path) == [str(git / "HEAD"), str(git / "packed-refs"),
                                             str(git / "refs" / "heads" / "topic" / "x")]
    (git / "HEAD").write_text("c" * 40 + "\n")   # a detached HEAD names no branch
    assert uptodate._git_files(tmp_path) == [str(git / "HEAD"), str(git / "packed-refs")]


# ---- remember -------------------------------------------------------------------------------

@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A stand-in engine on a real unix socket (tests/engine_socket.py) that answers every
    request with `answer`, the image's ID at first: the environment, and so the record's name,
    stays the same whatever the test makes it answer."""
    answer: dict[str, Any] = {"status": 200, "body": json.dumps({"Id": ID}).encode()}
    with serve_engine(tmp_path, monkeypatch, fixed=answer):
        yield answer


ODD = {"no image ID": json.dumps({"Config": {}}).encode(), "not JSON": b"not json"}


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> uptodate.Watch:
    # A watch of the test's own, filled by hand: what the build read is the test's to say.
    watch = uptodate.Watch()
    monkeypatch.setattr(uptodate, "WATCH", watch)
    return watch


def _build(tmp_path: Path, watch: uptodate.Watch, entries: int = 1) -> tuple[Path, list[Path]]:
    """A manifest the build read and a cache with `entries` entries."""
    manifest = tmp_path / "sample.toml"
    manifest.write_text("[image]\n")
    watch.opened.add(str(manifest))
    made = []
    for n in range(entries):
        entry = tmp_path / "cache" / "artifacts" / "entries" / (str(n) * 64)
        entry.mkdir(parents=True)
        (entry / "meta.json").write_text(json.dumps({"hits": n, "last_used": 1.0}))
        made.append(entry)
    return tmp_path / "cache", made


def _remember(cache: Path, entries: list[Path], checkout: Path,
              files: tuple[Path, ...] = (), stdout: str = STDOUT) -> None:
    uptodate.remember(ARGV, cache_dir=cache, checkout=checkout, images=[TAG], entries=entries,
                      files=files, report={"target": "smddp", "image_digest": None},
                      stdout=stdout)


def _record() -> dict[str, Any]:
    (path,) = uptodate.records_dir().iterdir()
    assert path.name == f"{uptodate.record_name(ARGV)}.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.mark.usefixtures("engine")
def test_the_record_holds_every_input_with_its_stat_and_nothing_of_its_own(
        tmp_path: Path, watched: uptodate.Watch,
        monkeypatch: pytest.MonkeyPatch) -> None:
    cache, (entry,) = _build(tmp_path, watched)
    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "refs" / "heads" / "main").write_text("a" * 40 + "\n")
    (tmp_path / "cache-other").mkdir()          # beside the cache, not in it
    (tmp_path / "cache-other" / "x").write_text("input")
    (tmp_path / "stages").mkdir()
    blob = entry / "blob"
    blob.write_text("layer")
    watched.opened |= {str(tmp_path / "cache-other" / "x"), str(cache / "artifacts" / "i.json"),
                       str(uptodate.records_dir() / "old.json"), "/proc/self/status",
                       "/sys/kernel/mm", "/dev/null"}
    watched.listed |= {str(tmp_path / "stages"), str(cache / "artifacts"), "/proc/self/fd"}
    # The cache directory as the build was given it: through a link, and relative.
    (tmp_path / "via").symlink_to("cache")
    monkeypatch.chdir(tmp_path)
    _remember(Path("via"), [entry], tmp_path, files=(blob,))

    def stat(path: Path) -> list[int] | None:
        with contextlib.suppress(FileNotFoundError):
            info = path.stat()
            return [info.st_size, info.st_mtime_ns, info.st_ino]
        return None

    files = sorted([tmp_path / "sample.toml", git / "HEAD", git / "packed-refs",
                    git / "refs" / "heads" / "main", tmp_path / "docker-config" / "config.json",
                    tmp_path / "cache-other" / "x", blob], key=str)
    assert _record() == {
        "version": 1,
        "files": [[str(p), stat(p)] for p in files],
        "dirs": [[str(tmp_path / "stages"), stat(tmp_path / "stages")]],
        "images": {TAG: ID},
        "entries": [str(entry)],
        "cache_dir": str(cache),
        "report": {"target": "smddp", "image_digest": ID},
        "stdout": STDOUT,
    }
    assert sorted(p.name for p in uptodate.records_dir().iterdir()) == [
        f"{uptodate.record_name(ARGV)}.json"]


@pytest.mark.usefixtures("engine")
def test_a_second_record_of_the_same_command_replaces_the_first(
        tmp_path: Path, watched: uptodate.Watch) -> None:
    cache, entries = _build(tmp_path, watched)
    _remember(cache, entries, tmp_path, stdout="first")
    _remember(cache, entries, tmp_path, stdout="second")
    assert _record()["stdout"] == "second"


@pytest.mark.parametrize("body", ODD.values(), ids=ODD.keys())
def test_nothing_is_recorded_when_the_engine_answers_what_no_engine_would(
        tmp_path: Path, engine: dict[str, Any], watched: uptodate.Watch, body: bytes) -> None:
    cache, entries = _build(tmp_path, watched)
    engine["body"] = body
    _remember(cache, entries, tmp_path)
    assert not uptodate.records_dir().exists()


# ---- answer ---------------------------------------------------------------------------------

@pytest.fixture
def build(tmp_path: Path, engine: dict[str, Any],  # noqa: ARG001 - serving the build's image
          watched: uptodate.Watch) -> tuple[Path, list[Path]]:
    """A build with two cache entries, to be remembered by the test itself: the record's
    name is the environment's, and pytest's own variable says which phase runs."""
    return _build(tmp_path, watched, entries=2)


def _remembered(build: tuple[Path, list[Path]], checkout: Path) -> tuple[Path, list[Path]]:
    """The build remembered; the record answers as it stands."""
    _remember(*build, checkout, stdout="line one\nline two")
    return build


def _record_path() -> Path:
    return uptodate.records_dir() / f"{uptodate.record_name(ARGV)}.json"


def test_every_entry_is_used_once_more_and_the_summary_printed_whole(
        build: tuple[Path, list[Path]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _, entries = _remembered(build, tmp_path)
    before = time.time()
    assert uptodate.answer(ARGV)
    assert capsys.readouterr().out == "line one\nline two\n"
    for n, entry in enumerate(entries):
        meta = json.loads((entry / "meta.json").read_text())
        assert meta["hits"] == n + 1
        assert before <= meta["last_used"] <= time.time()


@pytest.mark.parametrize("text", ["", "{", "[]", '{"version": 2}'])
def test_a_record_that_is_not_one_sends_it_to_the_full_build(
        build: tuple[Path, list[Path]], tmp_path: Path, text: str) -> None:
    cache, _ = _remembered(build, tmp_path)
    _record_path().write_text(text)
    assert not uptodate.answer(ARGV)
    assert not (cache / "reports").exists()


def test_no_record_sends_it_to_the_full_build(build: tuple[Path, list[Path]],
                                              tmp_path: Path) -> None:
    _remembered(build, tmp_path)
    _record_path().unlink()
    assert not uptodate.answer(ARGV)


def test_a_cache_without_its_artifact_store_sends_it_to_the_full_build(
        build: tuple[Path, list[Path]], tmp_path: Path) -> None:
    # Another cache directory at the same path: the report would go to the wrong place.
    cache, _ = _remembered(build, tmp_path)
    (cache / "artifacts").rename(cache / "moved")
    assert not uptodate.answer(ARGV)
    assert not (cache / "reports").exists()


@pytest.mark.usefixtures("engine")
def test_a_cache_without_an_artifact_store_answers_nothing_even_with_no_entries(
        tmp_path: Path, watched: uptodate.Watch) -> None:
    """The store is looked for itself: a build of no cache entries has none to miss."""
    cache, entries = _build(tmp_path, watched, entries=0)
    cache.mkdir()
    _remember(cache, entries, tmp_path)
    assert not uptodate.answer(ARGV)
    (cache / "artifacts").mkdir()
    assert uptodate.answer(ARGV)


def test_a_cache_that_cannot_take_the_report_sends_it_to_the_full_build(
        build: tuple[Path, list[Path]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    cache, entries = _remembered(build, tmp_path)
    (cache / "reports").write_text("a file where the reports directory goes")
    assert not uptodate.answer(ARGV)
    assert capsys.readouterr().out == ""
    assert json.loads((entries[1] / "meta.json").read_text())["hits"] == 1


def test_an_engine_gone_since_sends_it_to_the_full_build(
        build: tuple[Path, list[Path]], tmp_path: Path) -> None:
    _remembered(build, tmp_path)
    (tmp_path / "docker.sock").unlink()   # nobody listens there any more
    assert not uptodate.answer(ARGV)


@pytest.mark.parametrize("body", ODD.values(), ids=ODD.keys())
def test_an_engine_answering_what_no_engine_would_sends_it_to_the_full_build(
        build: tuple[Path, list[Path]], tmp_path: Path, engine: dict[str, Any],
        body: bytes) -> None:
    cache, _ = _remembered(build, tmp_path)
    engine["body"] = body
    assert not uptodate.answer(ARGV)
    assert not (cache / "reports").exists()


# ---- the shape of a record ------------------------------------------------------------------

def _good() -> dict[str, Any]:
    return {"version": 1, "files": [["/m.toml", [1, 2, 3]], ["/gone", None]],
            "dirs": [["/stages", [4, 5, 6]]], "images": {TAG: ID},
            "entries": ["/cache/artifacts/entries/e"], "cache_dir": "/cache",
            "report": {"target": "smddp-2.1_x"}, "stdout": "line one\nline two"}


def _edit(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    record = copy.deepcopy(_good())
    node = record
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return record


MALFORMED = {
    "version 2": ("version", 2),
    "files not a list": ("files", {"/m.toml": [1, 2, 3]}),
    "a file not a pair": ("files", 0, "/m.toml"),
    "a file of three": ("files", 0, ["/m.toml", [1, 2, 3], None]),
    "a path not text": ("files", 0, 0, 7),
    "a stat not a list": ("files", 0, 1, "1 2 3"),
    "a float in a stat": ("files", 0, 1, [1, 2.0, 3]),
    "a bool in a stat": ("files", 0, 1, [True, 2, 3]),
    "dirs not a list": ("dirs", None),
    "a dir's stat not a list": ("dirs", 0, 1, 5),
    "images not a table": ("images", [TAG, ID]),
    "an image ID not text": ("images", TAG, None),
    "entries not a list": ("entries", "/cache/e"),
    "an entry not text": ("entries", 0, 5),
    "a relative entry": ("entries", 0, "cache/e"),
    "cache_dir not text": ("cache_dir", ["/cache"]),
    "a relative cache_dir": ("cache_dir", "cache"),
    "report not a table": ("report", "smddp"),
    "a target not text": ("report", "target", 5),
    "a target that is a path": ("report", "target", "../smddp"),
    "a target starting with a dot": ("report", "target", ".smddp"),
    "stdout not text": ("stdout", 5),
    "stdout with a control": ("stdout", "done\x1b[2J"),
}


@pytest.mark.parametrize("edit", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_record_of_another_shape_is_not_well_formed(edit: tuple[Any, ...]) -> None:
    assert uptodate._well_formed(_good())
    assert not uptodate._well_formed(_edit(edit[:-1], edit[-1]))


@pytest.mark.parametrize("record", [None, [], "record"])
def test_what_is_not_a_table_is_not_a_record(record: Any) -> None:
    assert not uptodate._well_formed(record)


def test_a_record_with_a_key_missing_is_not_well_formed() -> None:
    for key in _good():
        record = _good()
        del record[key]
        assert not uptodate._well_formed(record), key
    record = _good()
    record["images"] = {7: ID}   # only JSON's keys are always text
    assert not uptodate._well_formed(record)


# ---- the report and the entries' uses -------------------------------------------------------

def test_a_report_is_named_by_the_utc_time_and_target_and_made_with_its_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Nine hours east of UTC: a stamp in local time would be nine hours off.
    monkeypatch.setenv("TZ", "JST-9")
    time.tzset()
    try:
        cache = tmp_path / "new" / "cache"
        before = datetime.now(UTC)
        first = uptodate.save_report(cache, {"target": "smddp", "stages": []})
        second = uptodate.save_report(cache, {"target": "smddp", "stages": [1]})
        after = datetime.now(UTC)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert first.parent == second.parent == cache / "reports"
    assert first != second
    match = re.fullmatch(r"(\d{8}T\d{12}Z)-smddp\.json", first.name)
    assert match, first.name
    stamp = datetime.strptime(match[1], "%Y%m%dT%H%M%S%fZ").replace(tzinfo=UTC)
    assert before - timedelta(milliseconds=1) <= stamp <= after
    assert first.read_text() == '{\n  "target": "smddp",\n  "stages": []\n}\n'


def test_a_use_is_counted_from_none_and_written_sorted_and_indented(tmp_path: Path) -> None:
    meta = tmp_path / "meta.json"
    meta.write_text('{"size": 3, "key": "k"}')
    before = time.time()
    uptodate._touch(meta)
    data = json.loads(meta.read_text())
    assert data["hits"] == 1
    assert before <= data["last_used"] <= time.time()
    assert meta.read_text() == json.dumps(
        {"hits": 1, "key": "k", "last_used": data["last_used"], "size": 3},
        indent=2) + "\n"
    assert [p.name for p in tmp_path.iterdir()] == ["meta.json"]


# A list, a string or a null meta.json, and hits of another type, raised TypeError out of
# the up-to-date answer: a traceback at the start of `invoke build`.
@pytest.mark.parametrize("text", [None, "{", '{"hits": "many"}', "[1, 2]", '"meta"', "null",
                                  '{"hits": [1]}', '{"hits": null}'],
                         ids=["gone", "not JSON", "hits not a number", "a list", "a string",
                              "null", "hits a list", "hits null"])
def test_an_entry_whose_use_cannot_be_counted_is_left_as_it_is(tmp_path: Path,
                                                               text: str | None) -> None:
    meta = tmp_path / "meta.json"
    if text is not None:
        meta.write_text(text)
    uptodate._touch(meta)
    assert (meta.read_text() if text is not None else None) == text
    assert [p.name for p in tmp_path.iterdir()] == ([] if text is None else ["meta.json"])

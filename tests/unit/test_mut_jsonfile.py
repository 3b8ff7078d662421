"""imageforge/jsonfile.py at its edges: what read_bounded refuses (what is not a regular file,
one byte over the cap, what is not UTF-8), what read_object turns into None, and how write_text
fails: the error a directory gets, the old file a reader still holds, and what a writer that
fails or dies mid-write leaves behind. On real files, FIFOs, device nodes made in tmp_path and
real resource limits of a forked writer."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from imageforge import jsonfile

ROOT = Path(__file__).resolve().parents[2]


def _null_device(folder: Path) -> Path:
    # A null device of the test's own (never the machine's /dev/null: a broken writer would
    # rename a plain file over it).
    null = folder / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return null


def test_read_bounded_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)   # opened, it would wait for a writer that never comes
    for path in (tmp_path, _null_device(tmp_path), fifo):
        with pytest.raises(ValueError, match=r"^not a regular file$"):
            jsonfile.read_bounded(path)


def test_read_bounded_reads_the_cap_whole_and_refuses_one_byte_more(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(b"a" * jsonfile.MAX_BYTES)
    assert jsonfile.read_bounded(path) == "a" * jsonfile.MAX_BYTES
    path.write_bytes(b"a" * (jsonfile.MAX_BYTES + 1))
    with pytest.raises(ValueError, match=r"^larger than 16 MiB$"):
        jsonfile.read_bounded(path)


def test_a_huge_file_is_refused_from_its_first_bytes_not_read_whole(tmp_path: Path) -> None:
    # A sparse file of 1 TiB takes no disk: read whole, it would not fit in memory.
    path = tmp_path / "huge.json"
    with path.open("wb") as huge:
        huge.truncate(1 << 40)
    with pytest.raises(ValueError, match=r"^larger than 16 MiB$"):
        jsonfile.read_bounded(path)


def test_read_bounded_decodes_utf8_and_refuses_anything_else(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_bytes("\"caf\u00e9\"".encode())
    assert jsonfile.read_bounded(path) == "\"caf\u00e9\""
    path.write_bytes(b"\"caf\xe9\"")   # Latin-1
    with pytest.raises(UnicodeDecodeError):
        jsonfile.read_bounded(path)


def test_load_gives_the_value_and_raises_on_a_missing_file_or_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('[1, {"a": null}]')
    assert jsonfile.load(path) == [1, {"a": None}]
    path.write_text("[1,")
    with pytest.raises(ValueError, match="Expecting value"):
        jsonfile.load(path)
    with pytest.raises(FileNotFoundError):
        jsonfile.load(tmp_path / "missing.json")


@pytest.mark.parametrize(("content", "why"), [
    (None, "missing"), (b"[1, 2]", "a list, not an object"), (b'{"a": ', "not JSON"),
    (b'{"a": "\xe9"}', "not UTF-8"), (b"dir", "a directory")])
def test_read_object_is_none_for_anything_but_an_object(tmp_path: Path, content: bytes | None,
                                                        why: str) -> None:
    path = tmp_path / "r.json"
    if content == b"dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    assert jsonfile.read_object(path) is None, why


def test_read_object_gives_an_object(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"hits": 2}')
    assert jsonfile.read_object(path) == {"hits": 2}


def test_a_directory_is_refused_as_the_system_refuses_it_naming_the_path_given(
        tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    link = tmp_path / "link"
    link.symlink_to("dir")
    with pytest.raises(IsADirectoryError) as refused:
        jsonfile.write_text(link, "x")
    assert refused.value.errno == errno.EISDIR
    assert str(refused.value) == f"[Errno 21] Is a directory: '{link}'"


def test_a_regular_file_is_replaced_whole_so_a_reader_keeps_the_old_text(
        tmp_path: Path) -> None:
    """A reader that opened the record before the write reads the old text to its end, never
    a mix: the new text is a new file renamed over the old one, not written into it."""
    path = tmp_path / "record.json"
    path.write_text("old text")
    before = path.stat().st_ino
    with path.open() as reader:
        jsonfile.write_text(path, "new")
        assert reader.read() == "old text"
    assert path.read_text() == "new"
    assert path.stat().st_ino != before


def test_a_write_that_fails_leaves_the_old_file_and_no_scratch(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    path.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        jsonfile.write_text(path, "half \ud800 written")   # a lone surrogate: not UTF-8
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def _write_in_a_child(path: Path, text: str, *, die: bool) -> int:
    """write_text in a forked child whose files may not grow past 4 KiB (RLIMIT_FSIZE, as a
    full quota does): by default the write fails with EFBIG (Python ignores SIGXFSZ); with
    `die`, SIGXFSZ kills the child mid-write, as a kill -9 or a power cut would. Returns the
    child's wait status."""
    pid = os.fork()
    if pid == 0:   # the child: never returns into pytest
        code = 0
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
            if die:
                signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
            jsonfile.write_text(path, text)
        except OSError as exc:
            code = exc.errno or 1
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def test_a_write_past_a_full_quota_leaves_the_old_file_and_no_scratch(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    jsonfile.write_text(path, "old")
    status = _write_in_a_child(path, "x" * 100_000, die=False)
    assert os.WIFEXITED(status)
    assert os.WEXITSTATUS(status) == errno.EFBIG
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_writer_killed_mid_write_leaves_the_old_file_and_a_hidden_scratch_beside_it(
        tmp_path: Path) -> None:
    """What a dead writer leaves is a hidden .NAME.*.tmp in the same directory (the rename
    needs one file system), never a file a reader or a `*.json` glob would take for a record."""
    path = tmp_path / "record.json"
    jsonfile.write_text(path, "old")
    status = _write_in_a_child(path, "x" * 100_000, die=True)
    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGXFSZ
    assert path.read_text() == "old"
    (scratch,) = sorted(p.name for p in tmp_path.iterdir() if p != path)
    assert re.fullmatch(r"\.record\.json\.[a-z0-9_]+\.tmp", scratch), scratch
    assert (tmp_path / scratch).stat().st_size == 4096


def test_missing_folders_are_made_however_deep(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "c" / "record.json"
    jsonfile.write_text(path, "whole")
    assert path.read_text() == "whole"


def test_the_text_is_utf8_whatever_the_locale_says(tmp_path: Path) -> None:
    """A user's locale may say ASCII (LC_ALL=C, Python's UTF-8 mode off) or Latin-1: records,
    reports and what goes to a pipe are UTF-8 all the same. The write under such a locale runs
    in a child Python (a locale's encoding is fixed at start-up) importing this checkout."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    path = tmp_path / "record.json"
    text = "caf\u00e9 \u2713"
    jsonfile.write_text(path, text)
    assert path.read_bytes() == text.encode()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    env = {**os.environ, "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0",
           "PYTHONPATH": str(ROOT)}
    try:
        result = subprocess.run(
            [sys.executable, "-c", "import locale, sys\n"
             "assert locale.getpreferredencoding(False) == 'ANSI_X3.4-1968'\n"
             "from pathlib import Path\n"
             "from imageforge import jsonfile\n"
             "for name in sys.argv[1:]:\n"
             f"    jsonfile.write_text(Path(name), {text!a})\n",
             str(path), str(fifo)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    finally:
        # The child has exited: a reader still waiting for a writer gets one, and EOF.
        with contextlib.suppress(OSError):   # ENXIO: the reader has read and gone
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=20)
    assert result.returncode == 0, result.stderr
    assert path.read_bytes() == text.encode()
    assert got[0] == text.encode()


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_a_new_file_gets_mode_0666_less_the_umask_as_open_makes_files(
        tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        jsonfile.write_text(tmp_path / "record.json", "{}\n")
        with (tmp_path / "plain.json").open("w") as plain:
            plain.write("{}\n")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "record.json").stat().st_mode)
    assert mode == 0o666 & ~umask
    assert mode == stat.S_IMODE((tmp_path / "plain.json").stat().st_mode)

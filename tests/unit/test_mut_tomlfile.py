"""imageforge/model/tomlfile.py in process: the exact sentence for each thing that is not a file,
for a path the system refuses, for an empty or silent pipe, for a manifest over the cap and
for bytes that are not UTF-8; a pipe whose writer is slow is waited for, and no more than one
byte past the cap is ever taken from a pipe. tests/unit/test_manifest_limits.py runs the same
through the installed `imageforge` command. On real files, pipes, FIFOs, sockets, device
nodes made in tmp_path (refused from their stat, or opened only as a null device) and a
pseudo-terminal of the test's own; what another process could do between the stat and the
open is done at os.open's audit event, through a real audit hook."""

from __future__ import annotations

import codecs
import contextlib
import os
import socket
import stat
import sys
import threading
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from imageforge.errors import ManifestError
from imageforge.model import tomlfile

MAX = tomlfile.MAX_BYTES

# What a test does at a given audit event of this process, while it runs. An audit hook cannot
# be removed: this module's one hook calls only what a running test put here.
_AT_EVENT: list[Callable[[str, tuple[Any, ...]], None]] = []


def _forward(event: str, args: tuple[Any, ...]) -> None:
    for action in list(_AT_EVENT):
        action(event, args)


sys.addaudithook(_forward)


def _refused(path: Path, *, what: str = "manifest", context: str = "") -> str:
    with pytest.raises(ManifestError) as refused:
        tomlfile.read_text(path, what=what, context=context)
    return str(refused.value)


@pytest.fixture
def pipe() -> Iterator[tuple[Path, int]]:
    """A real pipe: its read end as a path (as /dev/stdin is one) and its write end."""
    reader, writer = os.pipe()
    try:
        yield Path(f"/proc/self/fd/{reader}"), writer
    finally:
        os.close(reader)
        with contextlib.suppress(OSError):   # unless the test closed it
            os.close(writer)


def _not_files(folder: Path) -> list[tuple[Path, str]]:
    char = folder / "char"
    os.mknod(char, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    # A block device number no driver has (240 is free on this kind of host): never opened.
    block = folder / "block"
    os.mknod(block, stat.S_IFBLK | 0o600, os.makedev(240, 0))
    sock = folder / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    server.close()
    (folder / "dir").mkdir()
    return [(folder / "dir", "a directory"), (char, "a character device"),
            (block, "a block device"), (sock, "a socket")]


def test_each_thing_that_is_not_a_file_is_named_in_one_sentence(tmp_path: Path) -> None:
    for path, kind in _not_files(tmp_path):
        assert _refused(path) == (f"{path}: {kind}, not a file; a manifest is read from a file "
                                  "(or a pipe): name one.")
        assert _refused(path, what="matrix file", context=f"inherited by {tmp_path}/a.toml") \
            == (f"{path} (inherited by {tmp_path}/a.toml): {kind}, not a file; a matrix file is "
                "read from a file (or a pipe): name one.")


def test_a_long_path_is_named_whole(tmp_path: Path) -> None:
    # Paths are bounded by the system: the message never cuts one short.
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    assert _refused(deep).startswith(f"{deep}: a directory, not a file")


def test_a_path_swapped_for_a_device_after_its_stat_is_refused_as_the_device(
        tmp_path: Path) -> None:
    """What was opened is checked, not only what the path named a moment before: here the
    link is pointed at a device just as it is opened (at os.open's audit event, which comes
    before the open itself), as another process could."""
    (tmp_path / "m.toml").write_text("a = 1\n")
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    link = tmp_path / "link.toml"
    link.symlink_to("m.toml")
    swapped: list[str] = []

    def swap(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and args[0] == str(link) and not swapped:
            swapped.append(event)
            (tmp_path / "next").symlink_to("null")
            os.replace(tmp_path / "next", link)

    _AT_EVENT.append(swap)
    try:
        said = _refused(link, what="matrix file", context="inherited by a.toml")
    finally:
        _AT_EVENT.remove(swap)
    assert swapped
    assert said == (f"{link} (inherited by a.toml): a character device, not a file; a matrix "
                    "file is read from a file (or a pipe): name one.")


def test_a_terminal_swapped_in_never_becomes_the_controlling_terminal(tmp_path: Path) -> None:
    """A terminal is refused from its stat; one swapped in at the open (as in the test above)
    is opened with O_NOCTTY, so a session leader without a terminal (a daemon, a CI job) that
    reads it does not make it its controlling terminal. Checked in a forked child that is
    such a session leader, on a pseudo-terminal of the test's own."""
    (tmp_path / "m.toml").write_text("a = 1\n")
    assert tomlfile.read_text(tmp_path / "m.toml", what="manifest") == "a = 1\n"
    link = tmp_path / "link.toml"
    link.symlink_to("m.toml")
    main, secondary = os.openpty()
    terminal = os.ttyname(secondary)

    def swap(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and args[0] == str(link):
            (tmp_path / "next").symlink_to(terminal)
            os.replace(tmp_path / "next", link)

    pid = os.fork()
    if pid == 0:   # the child: never returns into pytest
        code = 3
        try:
            os.setsid()
            _AT_EVENT.append(swap)
            try:
                tomlfile.read_text(link, what="manifest")
            except ManifestError as refused:
                code = 4 if "a character device, not a file" not in str(refused) else 0
            # Field 7 of /proc/self/stat: the controlling terminal's device, 0 for none.
            stat_line = Path("/proc/self/stat").read_text()
            if code == 0 and int(stat_line.rpartition(")")[2].split()[4]) != 0:
                code = 5
        finally:
            os._exit(code)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(main)
        os.close(secondary)
    assert os.WIFEXITED(status)
    assert os.WEXITSTATUS(status) == 0   # 5: it took the terminal; 3, 4: it failed otherwise


def test_a_missing_file_is_left_to_the_caller(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        tomlfile.read_text(tmp_path / "missing.toml", what="manifest")


def test_a_path_with_a_nul_is_named_escaped() -> None:
    assert _refused(Path("a\x00b.toml"), context="inherited by x.toml") == (
        "a\\x00b.toml (inherited by x.toml): not a path (it holds a NUL character); name a "
        "manifest file.")


def test_a_path_the_system_refuses_is_named_with_the_systems_reason(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "m.toml"
    assert _refused(path, what="matrix file") == (
        f"{path}: cannot read the matrix file (Not a directory); check that path and its "
        "permissions.")


def test_an_empty_file_is_empty_text(tmp_path: Path) -> None:
    (tmp_path / "empty.toml").write_text("")
    assert tomlfile.read_text(tmp_path / "empty.toml", what="manifest") == ""


def test_two_files_read_in_turn_give_each_its_own_text(tmp_path: Path) -> None:
    # Only pipes are remembered (by their inode): a file is read afresh each time.
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    first.write_text("a = 1\n")
    second.write_text("b = 2\n")
    assert tomlfile.read_text(first, what="manifest") == "a = 1\n"
    assert tomlfile.read_text(second, what="manifest") == "b = 2\n"
    first.write_text("a = 3\n")
    assert tomlfile.read_text(first, what="manifest") == "a = 3\n"


def test_a_pipe_closed_with_nothing_written_is_refused(pipe: tuple[Path, int]) -> None:
    path, writer = pipe
    os.close(writer)
    assert _refused(path, what="matrix file") == (
        f"{path}: a pipe with nothing written to it; write the matrix file into it, or name a "
        "file.")


def test_a_fifo_nobody_writes_to_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "m.toml"
    os.mkfifo(fifo)
    got: list[BaseException] = []

    def read() -> None:
        try:
            tomlfile.read_text(fifo, what="manifest")
        except BaseException as exc:   # handed to the test's thread
            got.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=20)
    if reader.is_alive():
        # It waits for a writer: be that writer so the thread ends, then fail.
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=20)
        pytest.fail("reading a FIFO with no writer waited for one")
    assert [str(e) for e in got] == [f"{fifo}: a pipe with nothing written to it; write the "
                                     "manifest into it, or name a file."]


def test_a_slow_writer_is_waited_for(pipe: tuple[Path, int]) -> None:
    """The FIFO is opened without waiting, then read like any pipe: data that comes later is
    read, not taken for an empty pipe or an error."""
    path, writer = pipe
    started = threading.Event()

    def write_later() -> None:
        started.wait()
        threading.Event().wait(0.3)
        os.write(writer, b"a = 1\n")
        os.close(writer)

    thread = threading.Thread(target=write_later)
    thread.start()
    started.set()
    try:
        assert tomlfile.read_text(path, what="manifest") == "a = 1\n"
    finally:
        thread.join(timeout=20)


def test_no_more_than_one_byte_past_the_cap_is_taken_from_a_pipe(
        pipe: tuple[Path, int]) -> None:
    path, writer = pipe
    extra = 1000
    data = b"#" * (MAX + extra)

    def feed() -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(writer, view):]
        os.close(writer)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        assert _refused(path, context="piped") == (
            f"{path} (piped): larger than 1 MiB, the most a manifest may be; name the right "
            "file (a manifest is a few KiB of TOML).")
        left = b""
        reader = int(path.name)
        while chunk := os.read(reader, 1 << 16):
            left += chunk
    finally:
        feeder.join(timeout=20)
    assert len(left) == extra - 1


def test_a_file_of_the_cap_is_read_whole_one_byte_more_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_bytes(b"#" * MAX)
    assert tomlfile.read_text(path, what="manifest") == "#" * MAX
    path.write_bytes(b"#" * (MAX + 1))
    assert _refused(path, what="matrix file") == (
        f"{path}: larger than 1 MiB, the most a matrix file may be; name the right file (a "
        "matrix file is a few KiB of TOML).")


@pytest.mark.parametrize("mark", [codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE])
def test_utf16_is_refused_by_its_byte_order_mark(tmp_path: Path, mark: bytes) -> None:
    path = tmp_path / "m.toml"
    path.write_bytes(mark + "a = 1\n".encode("utf-16-le" if mark == codecs.BOM_UTF16_LE
                                             else "utf-16-be"))
    assert _refused(path) == (f"{path}: starts with a UTF-16 byte-order mark; a manifest must "
                              "be UTF-8: save it as UTF-8.")


def test_a_utf8_byte_order_mark_is_dropped_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_bytes(codecs.BOM_UTF8 + "a = 'é'\n".encode())
    assert tomlfile.read_text(path, what="manifest") == "a = 'é'\n"
    path.write_bytes("é = 1\n".encode())
    assert tomlfile.read_text(path, what="manifest") == "é = 1\n"


def test_a_byte_that_is_not_utf8_is_named_with_line_column_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_bytes("# é".encode() + b"\xff\xfe rest\n")
    assert _refused(path, what="matrix file") == (
        f"{path}: byte 0xff at line 1, column 4 (offset 4) is not UTF-8; a matrix file must "
        "be UTF-8: save it as UTF-8.")
    path.write_bytes(b"\n\xff")   # after a newline that opens the file
    assert _refused(path).startswith(f"{path}: byte 0xff at line 2, column 1 (offset 1) is ")
    path.write_bytes(b"a = 1\n\nb = '\xc3\xa9\xc3\xa9\x80'\n")
    assert _refused(path).startswith(f"{path}: byte 0x80 at line 3, column 8 (offset 16) is ")


def test_parse_gives_the_table() -> None:
    assert tomlfile.parse("a = 1\n[b]\nc = 'd'\n") == {"a": 1, "b": {"c": "d"}}


def test_parse_keeps_tomllibs_own_reason_for_bad_toml() -> None:
    with pytest.raises(tomllib.TOMLDecodeError) as refused:
        tomlfile.parse("a = \n")
    assert str(refused.value) == "Invalid value (at line 1, column 5)"


def test_parse_turns_a_number_too_long_to_read_into_bad_toml() -> None:
    with pytest.raises(tomllib.TOMLDecodeError) as refused:
        tomlfile.parse("x = " + "9" * 5000 + "\n")
    assert str(refused.value) == "a number of more than 4300 digits"

"""imageforge.jsonfile.write_text, the one writer of reports and records: whole files through
a temporary file of the writer's own, and never a rename over what is not a plain file (a
device, a FIFO, a symlink), checked on real ones."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from imageforge import jsonfile


def test_a_new_file_is_written_whole_and_nothing_else_is_left(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "report.json"
    jsonfile.write_json(path, {"passed": True})
    assert path.read_text() == '{\n  "passed": true\n}\n'
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]


def test_a_symlink_stays_a_link_and_its_target_gets_the_text(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    jsonfile.write_text(link, "new")
    assert link.is_symlink()
    assert target.read_text() == "new"


def test_a_fifo_is_written_in_place_not_replaced(tmp_path: Path) -> None:
    """A shell's >(jq .) is a FIFO: renaming over it would leave a plain file and the reader
    waiting forever."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    jsonfile.write_text(fifo, "through the pipe")
    reader.join(timeout=10)
    assert got == ["through the pipe"]
    assert fifo.is_fifo()


def test_a_device_is_written_in_place_not_replaced(tmp_path: Path) -> None:
    # A null device of the test's own, not /dev/null: when write_text breaks (a mutation
    # run), the rename replaces the device it was given, and the machine's /dev/null once
    # became a plain file that way.
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    jsonfile.write_text(null, "discarded")
    assert null.is_char_device()


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        jsonfile.write_text(tmp_path, "x")
    assert list(tmp_path.iterdir()) == []


def test_two_writers_at_once_each_leave_a_whole_file(tmp_path: Path) -> None:
    """The old fixed PATH.tmp name let one writer rename the other's half-written file."""
    path = tmp_path / "record.json"
    texts = {name: name * 200_000 for name in ("a", "b")}

    def write(name: str) -> None:
        for _ in range(30):
            jsonfile.write_text(path, texts[name])

    threads = [threading.Thread(target=write, args=(name,)) for name in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert path.read_text() in texts.values()
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


WRITER = """
import sys
from pathlib import Path
from imageforge import jsonfile
path, name = Path(sys.argv[1]), sys.argv[2]
for i in range(40):
    jsonfile.write_json(path, {"writer": name, "i": i, "pad": name * 100_000})
"""


def test_two_processes_writing_at_once_never_show_a_reader_half_a_file(tmp_path: Path) -> None:
    """Two real processes replace one record 40 times each while this one reads it: every
    read is a whole document of one writer, and no temporary file is left."""
    path = tmp_path / "meta.json"
    jsonfile.write_json(path, {"writer": "none", "i": -1, "pad": ""})
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name])
               for name in ("a", "b")]
    seen = set()
    while any(w.poll() is None for w in writers):
        document = json.loads(path.read_text())
        assert document["pad"] == document["writer"] * (100_000 if document["i"] >= 0 else 0)
        seen.add(document["writer"])
    assert [w.returncode for w in writers] == [0, 0]
    assert json.loads(path.read_text())["i"] == 39
    assert [p.name for p in tmp_path.iterdir()] == ["meta.json"]
    assert seen & {"a", "b"}


def test_a_new_file_gets_the_mode_open_gives_under_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        jsonfile.write_text(tmp_path / "r.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o640

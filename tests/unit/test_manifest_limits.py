"""A manifest, a manifest it inherits and a matrix file are read only from something that
ends, never more than 1 MiB of it, and only as UTF-8: anything else is one sentence and exit
2, at once. Run through the installed `imageforge` command, as users run it; a subprocess
timeout, not a stopwatch, says that nothing waits."""

from __future__ import annotations

import codecs
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imageforge.errors import ManifestError
from imageforge.model import tomlfile
from tests.unit.conftest import imageforge as run_imageforge

ROOT = Path(__file__).resolve().parents[2]
ENTRY = Path(sys.executable).parent / "imageforge"
SMDDP = ROOT / "manifests" / "smddp.toml"
# Far above a start-up on a busy machine, far below "forever".
PROMPT = 60


def imageforge(*args: str, cwd: Path, stdin: int | None = None,
               input: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return run_imageforge(*args, cwd=cwd, stdin=stdin, input=input, timeout=PROMPT)


def refused(result: subprocess.CompletedProcess[str], *parts: str) -> None:
    """Exit 2 with one sentence holding every part, and nothing else said."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    for part in parts:
        assert part in lines[0], result.stderr


def padded(size: int) -> bytes:
    """The smddp manifest, grown with comment lines to exactly `size` bytes."""
    text = SMDDP.read_bytes()
    filler = size - len(text)
    line = b"#" * 99 + b"\n"
    return text + line * (filler // len(line)) + b"#" * (filler % len(line))


def test_a_character_device_is_refused_at_once_not_read_forever(tmp_path: Path) -> None:
    result = imageforge("check", "--manifest", "/dev/zero", cwd=tmp_path)
    refused(result, "/dev/zero: a character device, not a file", "name one")


def test_a_directory_is_refused_naming_it(tmp_path: Path) -> None:
    refused(imageforge("check", "--manifest", str(tmp_path), cwd=tmp_path),
            f"{tmp_path}: a directory, not a file")


def test_a_fifo_nobody_writes_to_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "manifest.toml"
    os.mkfifo(fifo)
    result = imageforge("check", "--manifest", str(fifo), cwd=tmp_path)
    refused(result, f"{fifo}: a pipe with nothing written to it")


def test_a_manifest_piped_in_is_read(tmp_path: Path) -> None:
    result = imageforge("check", "--manifest", "/dev/stdin", cwd=tmp_path,
                        input=SMDDP.read_bytes())
    assert result.returncode == 0, result.stderr
    assert "/dev/stdin: valid" in result.stdout


def test_a_pipe_read_twice_gives_the_same_text() -> None:
    # build and fetch read their manifest twice; a pipe gives its bytes only once.
    reader, writer = os.pipe()
    os.write(writer, SMDDP.read_bytes())
    os.close(writer)
    try:
        piped = Path(f"/proc/self/fd/{reader}")
        first = tomlfile.read_text(piped, what="manifest")
        assert tomlfile.read_text(piped, what="manifest") == first == SMDDP.read_text()
    finally:
        os.close(reader)


def test_an_endless_pipe_is_cut_off_at_the_cap(tmp_path: Path) -> None:
    with subprocess.Popen(["yes", "# padding"], stdout=subprocess.PIPE) as endless:
        assert endless.stdout is not None
        result = imageforge("check", "--manifest", "/dev/stdin", cwd=tmp_path,
                            stdin=endless.stdout.fileno())
        endless.kill()
    refused(result, "/dev/stdin: larger than 1 MiB, the most a manifest may be")


def test_sigterm_stops_a_wait_for_a_slow_writer(tmp_path: Path) -> None:
    env = {**os.environ, "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("INVOKE_IMAGEFORGE_MANIFEST", None)
    with subprocess.Popen([str(ENTRY), "check", "--manifest", "/dev/stdin"], cwd=tmp_path,
                          env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as waiting:
        # Signalled once it waits in the manifest's read, not while it starts up.
        wchan = Path(f"/proc/{waiting.pid}/wchan")
        deadline = time.monotonic() + PROMPT
        while "pipe" not in wchan.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        waiting.send_signal(signal.SIGTERM)
        _, stderr = waiting.communicate(timeout=PROMPT)
    assert waiting.returncode == 130, stderr
    assert "interrupted" in stderr
    assert "Traceback" not in stderr


def test_a_manifest_over_the_cap_is_refused_naming_the_cap(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_bytes(padded(tomlfile.MAX_BYTES + 1))
    refused(imageforge("check", "--manifest", str(big), cwd=tmp_path),
            f"{big}: larger than 1 MiB, the most a manifest may be", "name the right file")


def test_a_manifest_of_exactly_the_cap_is_read(tmp_path: Path) -> None:
    full = tmp_path / "full.toml"
    full.write_bytes(padded(tomlfile.MAX_BYTES))
    assert len(tomlfile.read_text(full, what="manifest")) == tomlfile.MAX_BYTES
    full.write_bytes(padded(tomlfile.MAX_BYTES + 1))
    with pytest.raises(ManifestError, match="larger than 1 MiB"):
        tomlfile.read_text(full, what="manifest")


def test_a_utf8_byte_order_mark_is_dropped(tmp_path: Path) -> None:
    marked = tmp_path / "smddp.toml"
    marked.write_bytes(codecs.BOM_UTF8 + SMDDP.read_bytes())
    result = imageforge("check", "--manifest", str(marked), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"{marked}: valid" in result.stdout


def test_latin1_is_refused_naming_the_byte_and_where(tmp_path: Path) -> None:
    latin1 = tmp_path / "smddp.toml"
    latin1.write_bytes(b"# built by Ren\xe9\n" + SMDDP.read_bytes())
    refused(imageforge("check", "--manifest", str(latin1), cwd=tmp_path),
            f"{latin1}: byte 0xe9 at line 1, column 15 (offset 14) is not UTF-8",
            "a manifest must be UTF-8")


def test_the_column_counts_characters_and_the_offset_counts_the_mark(tmp_path: Path) -> None:
    marked = tmp_path / "m.toml"
    marked.write_bytes(codecs.BOM_UTF8 + 'a = 1\nb = "éé'.encode() + b'\xe9"\n')
    with pytest.raises(ManifestError, match=r"byte 0xe9 at line 2, column 8 \(offset 18\)"):
        tomlfile.read_text(marked, what="manifest")


def test_utf16_is_refused_naming_its_byte_order_mark(tmp_path: Path) -> None:
    wide = tmp_path / "smddp.toml"
    wide.write_bytes(SMDDP.read_text().encode("utf-16"))
    refused(imageforge("check", "--manifest", str(wide), cwd=tmp_path),
            "starts with a UTF-16 byte-order mark", "save it as UTF-8")


def test_an_inherited_device_is_refused_naming_the_child(tmp_path: Path) -> None:
    (tmp_path / "zero.toml").symlink_to("/dev/zero")
    child = tmp_path / "child.toml"
    child.write_text('inherit = "zero.toml"\n')
    refused(imageforge("check", "--manifest", str(child), cwd=tmp_path),
            f"/dev/zero (inherited by {child}): a character device")


def test_an_inherited_latin1_manifest_is_refused_naming_both(tmp_path: Path) -> None:
    (tmp_path / "parent.toml").write_bytes(b"# caf\xe9\n" + SMDDP.read_bytes())
    child = tmp_path / "child.toml"
    child.write_text('inherit = "parent.toml"\n')
    refused(imageforge("check", "--manifest", str(child), cwd=tmp_path),
            f"(inherited by {child}): byte 0xe9 at line 1, column 6")


def test_an_inherit_with_a_nul_is_refused_without_a_traceback(tmp_path: Path) -> None:
    child = tmp_path / "child.toml"
    child.write_text('inherit = "a\\u0000b.toml"\n')
    refused(imageforge("check", "--manifest", str(child), cwd=tmp_path),
            f"{child}: inherit: expected the path of another manifest")


def test_a_matrix_file_from_a_device_is_refused_at_once(tmp_path: Path) -> None:
    refused(imageforge("matrix.plan", "--file", "/dev/zero", cwd=tmp_path),
            "/dev/zero: a character device, not a file; a matrix file is read from a file")


def test_a_matrix_file_over_the_cap_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "images.toml"
    big.write_bytes(b"#" * (tomlfile.MAX_BYTES + 1))
    refused(imageforge("matrix.plan", "--file", str(big), cwd=tmp_path),
            f"{big}: larger than 1 MiB, the most a matrix file may be")


def test_a_number_too_long_to_read_is_invalid_toml_not_a_traceback(tmp_path: Path) -> None:
    manifest = tmp_path / "smddp.toml"
    manifest.write_text(SMDDP.read_text().replace("[image]\n", "[image]\nx = " + "9" * 5000 +
                                                  "\n", 1))
    refused(imageforge("check", "--manifest", str(manifest), cwd=tmp_path),
            f"{manifest}: invalid TOML: a number of more than 4300 digits")

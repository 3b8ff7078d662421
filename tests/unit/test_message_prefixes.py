"""What imageforge says on stderr is told apart by its prefix: `imageforge: error:` for the one
sentence a failing command ends with, `imageforge: warning:` and `imageforge: note:` for the
rest. Run through the installed `imageforge` command, as users run it."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

from tests.unit.conftest import imageforge

ROOT = Path(__file__).resolve().parents[2]
PREFIXED = re.compile(r"imageforge: (error|warning|note): \S")


def levels(stderr: str) -> list[str]:
    """The level of each stderr line; every line must carry a prefix."""
    found = [PREFIXED.match(line) for line in stderr.splitlines()]
    assert all(found), stderr
    return [match.group(1) for match in found if match]


def test_an_error_is_the_last_line_after_a_note_each_with_its_prefix(tmp_path: Path) -> None:
    # A manifest with no lock beside it: planning notes that its pins are unresolved.
    shutil.copy(ROOT / "manifests" / "smddp.toml", tmp_path)
    result = imageforge("plan", "--target", "nope", "--manifest", "smddp.toml", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert levels(result.stderr) == ["note", "error"]
    note, error = result.stderr.splitlines()
    assert note.startswith("imageforge: note: no smddp.lock.json: ")
    assert error.startswith("imageforge: error: --target nope: unknown stage; ")
    assert "Traceback" not in result.stderr


def test_a_warning_carries_its_prefix_and_the_command_succeeds(tmp_path: Path) -> None:
    # An artifact record that is not one: listing the cache warns and goes on.
    entry = tmp_path / "cache" / "artifacts" / "entries" / ("a" * 64)
    entry.mkdir(parents=True)
    (entry / "meta.json").write_text("{}")
    result = imageforge("cache.ls", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert set(levels(result.stderr)) == {"warning"}
    assert result.stderr.startswith(f"imageforge: warning: {entry / 'meta.json'}: ")
    # Once, though cache.ls reads the record more than once.
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "0 artifacts" in result.stdout


def test_only_the_logger_writes_the_prefix() -> None:
    """A message that spells `imageforge: ` itself would bypass the levels."""
    sources = [ROOT / "tasks.py", *sorted((ROOT / "imageforge").rglob("*.py"))]
    found = []
    for path in sources:
        if path == ROOT / "imageforge" / "log.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.startswith("imageforge: ")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []

"""Stage modules reach imageforge through one module, imageforge.stageapi: its `__all__` is
what a stage may use, and the stage guide teaches it (docs/adding-a-stage.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from imageforge import stageapi

ROOT = Path(__file__).resolve().parents[2]


def imported_from_imageforge(path: Path) -> dict[str, set[str]]:
    """module -> names, for every import of imageforge in `path` (in functions too)."""
    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("imageforge"):
            found.setdefault(str(node.module), set()).update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("imageforge"):
                    found.setdefault(alias.name, set())
    return found


def test_stage_modules_import_imageforge_only_through_the_stage_api() -> None:
    found = {str(p.relative_to(ROOT)): sorted(m for m in imported_from_imageforge(p)
                                              if m != "imageforge.stageapi")
             for p in sorted((ROOT / "stages").glob("*.py"))}
    assert {path: modules for path, modules in found.items() if modules} == {}


def test_every_name_of_the_api_is_exported_and_used() -> None:
    used = set().union(*(imported_from_imageforge(p).get("imageforge.stageapi", set())
                         for p in (ROOT / "stages").glob("*.py")))
    assert sorted(used - set(stageapi.__all__)) == []
    # A name no stage uses is dead weight in the one list authors read.
    assert sorted(set(stageapi.__all__) - used) == []
    assert all(hasattr(stageapi, name) for name in stageapi.__all__)


def test_the_guide_imports_what_the_api_exports() -> None:
    guide = (ROOT / "docs/adding-a-stage.md").read_text()
    blocks = re.findall(r"from imageforge\.stageapi import (?:\(([^)]*)\)|([^(\n]+)$)", guide,
                        flags=re.MULTILINE)
    names = {n.strip() for block in blocks for n in "".join(block).replace("\n", ",").split(",")
             if n.strip()}
    assert names, "the guide imports nothing from imageforge.stageapi"
    assert sorted(names - set(stageapi.__all__)) == []
    assert re.findall(r"from imageforge\.(?!stageapi)[\w.]+ import", guide) == []

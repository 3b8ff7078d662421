"""The engine knows no stage module: the registry is passed in by the front end (tasks.py),
so a team's stages plug in without editing imageforge/, and imageforge/ never imports the
`stages` package (which imports the engine: the two used to form an import cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_engine_module_imports_the_stages_package() -> None:
    found = {str(p.relative_to(ROOT)): sorted(n for n in imported(p)
                                              if n == "stages" or n.startswith("stages."))
             for p in sorted((ROOT / "imageforge").rglob("*.py"))}
    assert {path: names for path, names in found.items() if names} == {}


def test_the_front_end_passes_the_registry_in() -> None:
    assert "stages" in imported(ROOT / "tasks.py")

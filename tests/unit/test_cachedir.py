"""One owner of the cache directory's layout: imageforge/cachedir.py names every place under it,
and no other module spells a path below a cache directory itself."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def spelled_paths(path: Path) -> list[str]:
    """`cache_dir / "…"` (or `x.cache_dir / "…"`) in `path`: a place named outside cachedir.py."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
                and isinstance(node.right, ast.Constant | ast.JoinedStr)):
            left = node.left
            name = left.id if isinstance(left, ast.Name) else \
                left.attr if isinstance(left, ast.Attribute) else ""
            if name == "cache_dir":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_cachedir_spells_places_in_the_cache_directory() -> None:
    found = [hit for p in sorted((ROOT / "imageforge").rglob("*.py"))
             if p.name != "cachedir.py" for hit in spelled_paths(p)]
    assert found == []


def test_the_guard_sees_a_spelled_place() -> None:
    module = ROOT / "imageforge" / "cachedir.py"
    assert spelled_paths(module)  # the owner itself spells them: the check can find them
    assert len(spelled_paths(module)) == len([line for line in module.read_text().splitlines()
                                              if "return cache_dir / " in line])

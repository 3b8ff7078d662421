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


# The engine's own words that are also stage names: "base" is the root of every stage graph
# (the manifest's base image, Stage.parent's default) and "python" is a key of [image].
ENGINE_WORDS = frozenset({"base", "python"})


def stage_names_in(path: Path, names: frozenset[str]) -> list[str]:
    """String constants of `path` that are exactly a stage name, outside docstrings and
    Literal[...] types (a check's needs, "efa", is not the efa stage)."""
    tree = ast.parse(path.read_text())
    ignored: set[int] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and node.body and isinstance(node.body[0], ast.Expr)):
            ignored.add(id(node.body[0].value))
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                and node.value.id == "Literal"):
            ignored.update(id(inner) for inner in ast.walk(node.slice))
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in ignored and node.value in names]


def test_no_engine_module_names_a_stage() -> None:
    from stages import STAGES

    names = frozenset(STAGES) - ENGINE_WORDS
    found = {str(p.relative_to(ROOT)): stage_names_in(p, names)
             for p in sorted((ROOT / "imageforge").rglob("*.py"))}
    assert {path: words for path, words in found.items() if words} == {}


def test_the_stage_name_check_sees_a_name_where_the_engine_could_hide_one(
        tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""The smddp stage."""\n'
                      'Needs = Literal["none", "efa"]\n'
                      'def target(labels):\n'
                      '    return labels.get("target") or "smddp"\n')
    assert stage_names_in(module, frozenset({"smddp", "efa"})) == ["smddp"]

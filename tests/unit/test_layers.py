"""The engine is a stack: each sub-package imports only from the layers below it, in this one
order, and no two modules import each other, directly or around a loop.

    base       errors, exits, log, textsafe, jsonfile, cmd, engineapi, docker, diskfull, uptodate
    model      manifests, stages, their inputs, sources and rules as values; the DAG
    sources    downloads, the source cache, upstream resolution, the lock
    planning   keys, plans, Dockerfile text, labels, the compatibility verdict
    cache      the artifact store, its key locks, the remote
    buildkit   bake, its progress and results, artifact transfer, the build report
    image      image checks and their reports, golden tags, CI pipelines
    sagemaker  the training contract and run-local
    app        one command's flow: the project, build, verify, export, cache and nightly
               commands (imageforge/app/), the front end (front.py, cli.py) and what
               stage modules import (stageapi.py)

Every import counts: those inside functions and those only for type checking too (a type is a
dependency as much as a call). A cycle is judged on the imports that run: a stage names its
rules' types and a rule names Stage, for the type checker only, within one layer."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = ("errors", "exits", "log", "textsafe", "jsonfile", "cachedir", "cmd", "engineapi", "docker",
        "diskfull", "uptodate")
PACKAGES = ("model", "sources", "planning", "cache", "buildkit", "image", "sagemaker", "app")
FRONT = ("front", "cli", "stageapi")
ORDER = ("base", *PACKAGES)


@dataclass(frozen=True)
class Import:
    module: str      # the importing module, dotted
    target: str      # the imported module, dotted
    line: int
    runs: bool       # False for an import under `if TYPE_CHECKING:`


def modules(root: Path) -> dict[str, Path]:
    package = root / "imageforge"
    return {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
            for p in sorted(package.rglob("*.py"))}


def layer(module: str) -> str | None:
    """The layer of a dotted module of imageforge; None for the package itself."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    if parts[1] in PACKAGES:
        return parts[1]
    if parts[1] in BASE:
        return "base"
    if parts[1] in FRONT:
        return "app"
    raise AssertionError(f"{module} is in no layer: add it to one in {__file__}")


def imports(root: Path) -> Iterator[Import]:
    known = modules(root)
    for module, path in known.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(inner) for node in ast.walk(tree)
                       if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                       for inner in ast.walk(node)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from imageforge.x import y` imports module y when there is one, else x.
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                           else node.module for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if target in known and target != module:
                    yield Import(module, target, node.lineno, id(node) not in typing_only)


def upward(root: Path) -> list[str]:
    found = []
    for edge in imports(root):
        source, target = layer(edge.module), layer(edge.target)
        if source and target and ORDER.index(target) > ORDER.index(source):
            found.append(f"{edge.module}:{edge.line} imports {edge.target} ({source} -> "
                         f"{target})")
    return found


def cycles(root: Path) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), on imports that
    run."""
    graph: dict[str, set[str]] = {m: set() for m in modules(root)}
    for edge in imports(root):
        if edge.runs:
            graph[edge.module].add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for after in sorted(graph[node]):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_is_in_a_layer() -> None:
    assert {m for m in modules(ROOT) if m != "imageforge" and layer(m) not in ORDER} == set()


def test_a_module_outside_every_layer_is_named(tmp_path: Path) -> None:
    root = write(tmp_path, {"imageforge/newthing.py": ""})
    with pytest.raises(AssertionError, match=r"imageforge\.newthing is in no layer"):
        [layer(m) for m in modules(root)]


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    assert upward(ROOT) == []


def test_no_modules_import_each_other_around_a_loop() -> None:
    assert cycles(ROOT) == []


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in {"imageforge/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(text)
    return root


def test_the_check_sees_an_upward_import_even_inside_a_function(tmp_path: Path) -> None:
    root = write(tmp_path, {
        "imageforge/model/stage.py": "def f():\n    from imageforge.app import project\n",
        "imageforge/app/project.py": "from imageforge.model import stage\n",
    })
    assert upward(root) == ["imageforge.model.stage:2 imports imageforge.app.project "
                            "(model -> app)"]


def test_the_check_sees_an_upward_import_for_types_only(tmp_path: Path) -> None:
    root = write(tmp_path, {
        "imageforge/model/stage.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from imageforge.planning.plan import Plan\n"),
        "imageforge/planning/plan.py": "",
    })
    assert upward(root) == ["imageforge.model.stage:3 imports imageforge.planning.plan "
                            "(model -> planning)"]


def test_the_check_sees_a_loop_within_a_layer_but_not_one_for_types_only(
        tmp_path: Path) -> None:
    root = write(tmp_path, {
        "imageforge/model/a.py": "from imageforge.model import b\n",
        "imageforge/model/b.py": "def f():\n    from imageforge.model.c import x\n",
        "imageforge/model/c.py": "import imageforge.model.a\nx = 1\n",
        "imageforge/model/d.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from imageforge.model.e import E\n"),
        "imageforge/model/e.py": "from imageforge.model.d import D\n",
    })
    assert cycles(root) == [["imageforge.model.a", "imageforge.model.b", "imageforge.model.c"]]

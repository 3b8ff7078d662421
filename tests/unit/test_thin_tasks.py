"""tasks.py stays thin: parse flags, call imageforge/front.py, print. No decision is made
there (which value wins, whether a value is valid, what runs after what), and neither it nor
front.py knows a stage by name."""

from __future__ import annotations

import ast
from pathlib import Path

from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
TASKS = ast.parse((ROOT / "tasks.py").read_text())
# front.py and the modules it was split into: options (values), outputs (report files), views.
FRONT = [ast.parse((ROOT / "imageforge" / path).read_text())
         for path in ("front.py", "app/options.py", "app/outputs.py", "app/views.py")]
# The error boundary (FatalError -> message and exit code) and its SIGTERM handler.
BOUNDARY = {"boundary", "_terminate"}
# What a task body may hold besides its docstring and imports: e.g. a request, a call, a print.
MOST_STATEMENTS = 4
# The module-level data tasks.py keeps for the tests: the goldens tests/unit/test_render.py
# compares with, one (manifest, target, file) each.
TEST_DATA = {"GOLDEN_DOCKERFILES"}


def functions(tree: ast.Module) -> list[ast.FunctionDef]:
    return [node for node in tree.body if isinstance(node, ast.FunctionDef)]


def statements(function: ast.FunctionDef) -> list[ast.stmt]:
    """The body, without its docstring and imports."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return [s for s in body if not isinstance(s, ast.Import | ast.ImportFrom)]


def on_json(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "json"


def prints_each(loop: ast.For) -> bool:
    """`for line in front.<command>(...): print(line)`: printing a command's lines."""
    body = loop.body
    return (isinstance(loop.iter, ast.Call) and len(body) == 1 and not loop.orelse
            and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Call)
            and isinstance(body[0].value.func, ast.Name) and body[0].value.func.id == "print")


def decisions(function: ast.FunctionDef) -> list[str]:
    """Every construct of `function` that decides or loops, except "JSON or the table" and
    printing each line a command yields."""
    found = []
    for statement in statements(function):
        for node in ast.walk(statement):
            where = f"{function.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.For) and prints_each(node):
                continue
            if isinstance(node, ast.IfExp | ast.If) and on_json(node.test):
                continue
            if isinstance(node, ast.If | ast.IfExp | ast.For | ast.While | ast.Try | ast.With
                          | ast.Match | ast.BoolOp | ast.Compare | ast.Raise | ast.Assert
                          | ast.comprehension | ast.Lambda):
                found.append(f"{where} {type(node).__name__}")
    return found


def test_tasks_only_parse_call_and_print() -> None:
    found = {}
    for function in functions(TASKS):
        if function.name in BOUNDARY:
            continue
        body = statements(function)
        if len(body) > MOST_STATEMENTS:
            found[function.name] = f"{len(body)} statements"
        if decisions(function):
            found[function.name] = ", ".join(decisions(function))
    assert found == {}, "move the logic to imageforge/front.py"


def test_every_task_calls_front() -> None:
    def calls_front(function: ast.FunctionDef) -> bool:
        return any(isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                   and node.value.id == "front" for node in ast.walk(function))

    tasks = [f for f in functions(TASKS)
             if any("task" in ast.unparse(d) for d in f.decorator_list)]
    assert len(tasks) >= 20
    assert [f.name for f in tasks if not calls_front(f)] == []


def test_the_engine_module_tasks_py_calls_is_front() -> None:
    engine: set[str] = set()
    for node in TASKS.body:
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "imageforge"):
            continue
        assert node.module is not None
        if (ROOT / node.module.replace(".", "/")).is_dir():
            # A package (imageforge, imageforge.cache): the modules it names.
            engine.update(alias.name for alias in node.names)
        else:
            engine.add(node.module.rpartition(".")[2])
    # options: the Flags and Config a task hands front; errors, diskfull and exits: what the
    # boundary turns into exit codes; log: the line it prints.
    assert engine == {"front", "options", "errors", "diskfull", "exits", "log"}


def stage_literals(nodes: list[ast.AST]) -> list[str]:
    names = set(STAGES)
    return sorted({f"{node.value!r} (line {node.lineno})" for tree in nodes
                   for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and node.value in names})


def test_no_stage_name_in_tasks_py_or_front_py() -> None:
    # tasks.py: its code; the @task help texts are the flags' words (--code is a flag).
    code: list[ast.AST] = []
    for node in TASKS.body:
        if isinstance(node, ast.FunctionDef):
            code += [*node.body, node.args]
        elif not (isinstance(node, ast.Assign) and {getattr(t, "id", "") for t in node.targets}
                  & TEST_DATA):
            code.append(node)
    assert stage_literals(code) == []
    assert stage_literals(list(FRONT)) == []

"""The stage DAG as Graphviz DOT, coloured by status; SVG/PNG through the `dot` program."""

from __future__ import annotations

import shutil
from pathlib import Path

from imageforge.cmd import run
from imageforge.errors import FatalError, UsageError
from imageforge.planning.plan import Plan

COLOURS = {"cached": "#b7e1a1", "remote": "#a9c8f0", "build": "#f6c28b"}


def to_dot(plan: Plan) -> str:
    lines = [
        f'digraph "{plan.target}" {{',
        "  rankdir=LR;",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica"];',
    ]
    for stage in plan.stages:
        version = stage.inputs.get("version") or ""
        label = f"{stage.name}\\n{version}\\n{stage.key[7:19]}\\n{stage.status}".replace('"', "")
        lines.append(f'  "{stage.name}" [label="{label}", fillcolor="{COLOURS[stage.status]}"];')
    for stage in plan.stages:
        lines.extend(f'  "{dep}" -> "{stage.name}";' for dep in stage.deps)
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_graph(plan: Plan, path: Path) -> None:
    """Write DOT, or render it to .svg/.png with Graphviz."""
    dot = to_dot(plan)
    suffix = path.suffix.lower()
    if suffix in ("", ".dot", ".gv"):
        path.write_text(dot)
        return
    if suffix not in (".svg", ".png"):
        raise UsageError(f"--graph {path}: unknown format {suffix!r}; use .dot, .svg or .png.")
    program = shutil.which("dot")
    if program is None:
        raise UsageError(f"--graph {path}: rendering {suffix} needs Graphviz's `dot`; install "
                         "graphviz (apt-get install graphviz) or write a .dot file instead.")
    result = run([program, f"-T{suffix[1:]}", "-o", str(path)], input=dot.encode(),
                 error=UsageError)
    if result.returncode != 0:
        raise FatalError(f"--graph {path}: dot failed: {result.stderr.decode().strip()}")

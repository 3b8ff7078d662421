"""imageforge's command line: `invoke <task> --help` for each task's flags.

Tasks hold no logic: they parse flags, call the engine and turn its errors into one line
and an exit code (imageforge/errors.py lists them).
"""

from __future__ import annotations

import functools
import json as jsonlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from invoke import Collection, Context, Exit, task

from imageforge import project
from imageforge.errors import FatalError

F = TypeVar("F", bound=Callable[..., Any])

MANIFEST_HELP = "manifest TOML (default: manifests/smddp.toml, or imageforge.manifest in invoke.yaml)"
SET_HELP = "override a manifest key, e.g. stages.nccl.version=2.18.6 (repeatable)"


def boundary(func: F) -> F:
    """The one place user errors become a message and an exit code, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except FatalError as exc:
            raise Exit(f"imageforge: {exc}", code=exc.return_code) from None
        except KeyboardInterrupt:
            raise Exit("imageforge: interrupted.", code=130) from None

    return wrapper  # type: ignore[return-value]


def settings(c: Context, manifest: str | None, overrides: list[str] | None) -> project.Settings:
    config = c.config.get("imageforge", {})
    return project.Settings(
        manifest=Path(manifest or config.get("manifest") or project.DEFAULT_MANIFEST),
        overrides=tuple(overrides or ()),
        cache_dir=Path(config.get("cache_dir") or "cache"),
    )


@task(help={"manifest": MANIFEST_HELP, "set": SET_HELP}, iterable=["set"])
@boundary
def check(c: Context, manifest: str | None = None, set: list[str] | None = None) -> None:  # noqa: A002
    """Validate a manifest (keys, values, stage graph) and plan every image it defines."""
    s = settings(c, manifest, set)
    for line in project.check(s):
        print(f"ok  {line}")
    print(f"{s.manifest}: valid")


@task(
    help={"target": "stage to plan (any stage name)", "manifest": MANIFEST_HELP, "set": SET_HELP,
          "json": "print the plan as one JSON object", "graph": "also write the DAG (.dot/.svg/.png)"},
    iterable=["set"],
)
@boundary
def plan(c: Context, target: str = "smddp", manifest: str | None = None,
         set: list[str] | None = None, json: bool = False, graph: str | None = None) -> None:  # noqa: A002
    """Show the stages a target needs, in build order, with keys and cache status."""
    s = settings(c, manifest, set)
    planned = project.plan(s, target)
    if graph:
        from imageforge.graph import write_graph

        write_graph(planned, Path(graph))
    if json:
        print(jsonlib.dumps(planned.to_json(project.manifest_label(s.manifest)), indent=2))
        return
    print(f"target {planned.target}  manifest {project.manifest_label(s.manifest)}")
    print(f"{'stage':<14} {'status':<7} {'version':<12} {'key':<19} deps")
    for st in planned.stages:
        version = str(st.inputs.get("version") or "-")
        print(f"{st.name:<14} {st.status:<7} {version:<12} {st.key[:19]} {','.join(st.deps)}")


@task(
    help={"target": "stage to render", "manifest": MANIFEST_HELP, "set": SET_HELP,
          "format": "dockerfile (default)"},
    iterable=["set"],
)
@boundary
def render(c: Context, target: str = "smddp", manifest: str | None = None,
           set: list[str] | None = None, format: str = "dockerfile") -> None:  # noqa: A002
    """Print the multi-stage Dockerfile for a target."""
    if format != "dockerfile":
        raise FatalError(f"--format {format}: unknown format; use dockerfile.")
    sys.stdout.write(project.dockerfile(project.plan(settings(c, manifest, set), target)))


ns = Collection(check, plan, render)
ns.configure({"imageforge": {"manifest": str(project.DEFAULT_MANIFEST), "cache_dir": "cache"}})

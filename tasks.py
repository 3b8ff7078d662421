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

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from imageforge import project
from imageforge.errors import FatalError

F = TypeVar("F", bound=Callable[..., Any])

MANIFEST_HELP = ("manifest TOML (default: manifests/smddp.toml, or imageforge.manifest in "
                 "invoke.yaml)")
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


def settings(c: Context, manifest: str | None, overrides: list[str] | None,
             *, locked: bool = False) -> project.Settings:
    config = c.config.get("imageforge", {})
    return project.Settings(
        manifest=Path(manifest or config.get("manifest") or project.DEFAULT_MANIFEST),
        overrides=tuple(overrides or ()),
        cache_dir=Path(config.get("cache_dir") or "cache"),
        locked=locked,
    )


@task(help={"manifest": MANIFEST_HELP, "set": SET_HELP,
            "locked": "also fail when the lock file is missing or stale"}, iterable=["set"])
@boundary
def check(c: Context, manifest: str | None = None, set: list[str] | None = None,  # noqa: A002
          locked: bool = False) -> None:
    """Validate a manifest (keys, values, compatibility rules, lock) and plan its images."""
    s = settings(c, manifest, set, locked=locked)
    for line in project.check(s):
        print(f"  {line}")
    print(f"{s.manifest}: valid")


@task(
    help={"target": "stage to plan (any stage name)", "manifest": MANIFEST_HELP, "set": SET_HELP,
          "json": "print the plan as one JSON object",
          "graph": "also write the DAG (.dot/.svg/.png)"},
    iterable=["set"],
)
@boundary
def plan(c: Context, target: str = "smddp", manifest: str | None = None,
         set: list[str] | None = None, json: bool = False, graph: str | None = None) -> None:
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
           set: list[str] | None = None, format: str = "dockerfile") -> None:
    """Print the multi-stage Dockerfile for a target."""
    if format != "dockerfile":
        raise FatalError(f"--format {format}: unknown format; use dockerfile.")
    sys.stdout.write(project.dockerfile(project.plan(settings(c, manifest, set), target)))


@task(
    help={"target": "stage to build (any stage name)", "manifest": MANIFEST_HELP, "set": SET_HELP,
          "push": "push to the registry in --tag instead of loading into Docker",
          "tag": "image reference (default imageforge/<name>:<target>-<key>)",
          "builder": "buildx builder to use (default: the current one)",
          "progress": "auto (live table on a terminal), plain, or json lines",
          "dry_run": "print the buildx command and Dockerfile, build nothing",
          "locked": "refuse a missing or stale lock file (what CI and nightly use)"},
    iterable=["set"],
)
@boundary
def build(c: Context, target: str = "smddp", manifest: str | None = None,
          set: list[str] | None = None, push: bool = False, tag: str | None = None,
          builder: str | None = None, progress: str = "auto", dry_run: bool = False,
          locked: bool = False) -> None:
    """Build a target with BuildKit: every stage it needs, in one parallel build."""
    from imageforge.build import BuildOptions, summary
    from imageforge.build import build as run_build

    if progress not in ("auto", "plain", "json", "tty"):
        raise FatalError(f"--progress {progress}: use auto, plain or json.")
    options = BuildOptions(target=target, tag=tag, push=push, builder=builder,
                           progress=progress, dry_run=dry_run)  # type: ignore[arg-type]
    result = run_build(settings(c, manifest, set, locked=locked), options)
    if result is not None:
        print(summary(result))


@task(
    help={"manifest": MANIFEST_HELP, "set": SET_HELP,
          "upgrade": "re-resolve every ref and URL, not only new or changed ones",
          "check": "only verify that the lock exists and matches the manifest"},
    iterable=["set"],
)
@boundary
def lock(c: Context, manifest: str | None = None, set: list[str] | None = None,
         upgrade: bool = False, check: bool = False) -> None:
    """Resolve every sha256, commit and base digest into <manifest>.lock.json."""
    s = settings(c, manifest, set)
    if check:
        print(f"{project.check_lock(s)}: up to date")
        return
    path, changes = project.write_lock(s, upgrade=upgrade)
    for line in changes:
        print(f"  {line}")
    print(f"{path}: {'updated' if changes else 'unchanged'}")


@task(
    help={"target": "stage whose sources to fetch (and its dependencies')",
          "manifest": MANIFEST_HELP, "set": SET_HELP},
    iterable=["set"],
)
@boundary
def fetch(c: Context, target: str = "smddp", manifest: str | None = None,
          set: list[str] | None = None) -> None:
    """Download and verify every source a target needs into the source cache."""
    for name, path in sorted(project.fetch(settings(c, manifest, set), target).items()):
        print(f"{name:<20} {path}")


@task(
    name="test-image",
    help={"target": "image target whose checks to run (efa-nccl, smddp)",
          "image": "image reference to check (default: the one `build` tags)",
          "manifest": MANIFEST_HELP, "set": SET_HELP},
    iterable=["set"],
)
@boundary
def test_image(c: Context, target: str = "smddp", image: str | None = None,
               manifest: str | None = None, set: list[str] | None = None) -> None:
    """Run every stage's smoke checks inside a built image."""
    from imageforge.build import default_tag
    from imageforge.checks import require_passed, run_checks
    from imageforge.docker import ensure_ready

    planned = project.plan(settings(c, manifest, set), target)
    if not project.is_image(target):
        raise FatalError(f"--target {target} is a builder stage; test-image checks image "
                         f"targets: {', '.join(project.image_targets())}.")
    ref = image or default_tag(planned)
    ensure_ready()
    results = run_checks(planned, ref)
    for r in results:
        print(f"{'ok  ' if r.ok else 'FAIL'} {r.stage:<14} {r.name}")
    require_passed(results, ref)
    print(f"{ref}: {len(results)} checks passed")


@task
@boundary
def docs(c: Context) -> None:
    """Regenerate the manifest reference in README.md from the stage modules."""
    from imageforge.reference import update_readme
    from stages import STAGES

    changed = update_readme(Path("README.md"), STAGES)
    print("README.md: manifest reference " + ("updated" if changed else "already current"))


ns = Collection(check, plan, render, lock, fetch, build, test_image, docs)
ns.configure({"imageforge": {"manifest": str(project.DEFAULT_MANIFEST), "cache_dir": "cache"}})

"""imageforge's command line: `invoke <task> --help` for each task's flags.

Tasks hold no logic: they parse flags, call the engine and turn its errors into one line
and an exit code (imageforge/errors.py lists them).
"""

from __future__ import annotations

import dataclasses
import functools
import json as jsonlib
import math
import os
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from imageforge import diskfull, project
from imageforge.errors import FatalError, UsageError
from imageforge.mirror import parse_rewrites
from imageforge.plan import Plan
from stages import discover

F = TypeVar("F", bound=Callable[..., Any])

MANIFEST_HELP = ("manifest TOML (default: manifests/smddp.toml, or imageforge.manifest in "
                 "invoke.yaml)")
SET_HELP = "override a manifest key, e.g. stages.nccl.version=2.18.6 (repeatable)"
REMOTE_HELP = ("registry repository of the shared artifact cache, e.g. "
               "127.0.0.1:5000/imageforge-cache (default: imageforge.remote in invoke.yaml)")
MIRROR_HELP = ("fetch only from this mirror (a directory or URL made by mirror.sync); "
               "the original URLs are never contacted")
TARGET_DEFAULT = "default: the image the manifest defines"



def _terminate(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def boundary(func: F) -> F:
    """The one place user errors become a message and an exit code, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # CI cancels jobs with SIGTERM: unwind like Ctrl-C, so downloads, builds and cache
        # writes clean up after themselves instead of dying mid-write.
        signal.signal(signal.SIGTERM, _terminate)
        # A shell starts background jobs with SIGINT ignored, and Python keeps it so: Ctrl-C
        # (or a CI runner's SIGINT) must still stop a run that way, cleaning up.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return func(*args, **kwargs)
        except FatalError as exc:
            raise Exit(f"imageforge: {exc}", code=exc.return_code) from None
        except OSError as exc:
            # The modules that write name their place; this catches any write they missed.
            if diskfull.is_full(exc):
                full = diskfull.error(Path(exc.filename).parent if exc.filename else Path.cwd())
                raise Exit(f"imageforge: {full}", code=full.return_code) from None
            if exc.filename is None:
                raise
            # A path given by a flag (or a setting) that cannot be read or written.
            raise Exit(f"imageforge: {exc.filename}: {exc.strerror or exc}; check that path and "
                       "the flag or setting that names it.", code=UsageError.return_code) from None
        except KeyboardInterrupt:
            raise Exit("imageforge: interrupted.", code=130) from None

    return wrapper  # type: ignore[return-value]


def whole_number(flag: str, value: str | int, *, minimum: int) -> int:
    """A flag's whole-number value; invoke would raise a traceback on a typed flag."""
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise UsageError(f"--{flag} {value}: give a whole number of at least {minimum}.")
    return number


def ratio(flag: str, value: str | float) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        raise UsageError(f"--{flag} {value}: give a number above 0, e.g. 1.2.")
    return number


def write_output(flag: str, path: str, text: str, *, append: bool = False) -> None:
    """Write (or append to) the file a flag names; refusing a path names that flag."""
    try:
        with open(path, "a" if append else "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        if diskfull.is_full(exc):
            raise
        raise UsageError(f"{flag} {path}: cannot write it ({exc.strerror or exc}); give a file "
                         "in an existing, writable directory.") from None


def settings(c: Context, manifest: str | None, overrides: list[str] | None,
             *, locked: bool = False, remote: str | None = None,
             mirror: str | None = None) -> project.Settings:
    config = c.config.get("imageforge", {})
    return project.Settings(
        manifest=Path(manifest or config.get("manifest") or project.DEFAULT_MANIFEST),
        overrides=tuple(overrides or ()),
        cache_dir=Path(config.get("cache_dir") or "cache"),
        locked=locked,
        remote=remote or config.get("remote") or None,
        rewrites=parse_rewrites(config.get("rewrite")),
        mirror=mirror,
        registry=discover(stage_dirs(config.get("stage_dirs"))),
    )


def stage_dirs(value: Any) -> tuple[Path, ...]:
    """`imageforge.stage_dirs` (invoke.yaml, or INVOKE_IMAGEFORGE_STAGE_DIRS): a list of
    directories, or one string of them separated like PATH."""
    if not value:
        return ()
    if isinstance(value, str):
        return tuple(Path(v) for v in value.split(os.pathsep) if v)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(Path(v) for v in value)
    raise UsageError(f"imageforge.stage_dirs = {value!r}: give a directory or a list of "
                     "directories of stage modules.")


@task(help={"manifest": MANIFEST_HELP, "set": SET_HELP,
            "locked": "also fail when the lock file is missing or stale"}, iterable=["set"])
@boundary
def check(c: Context, manifest: str | None = None, set: list[str] | None = None,
          locked: bool = False) -> None:
    """Validate a manifest (keys, values, compatibility rules, lock) and plan its images."""
    s = settings(c, manifest, set, locked=locked)
    for line in project.check(s):
        print(f"  {line}")
    print(f"{s.manifest}: valid")


@task(help={"manifest": MANIFEST_HELP, "set": SET_HELP}, iterable=["set"])
@boundary
def show(c: Context, manifest: str | None = None, set: list[str] | None = None) -> None:
    """Print the effective manifest, each value with the file and line it comes from.

    Tables a manifest inherits (`inherit = "smddp.toml"`) are merged in, --set applied."""
    from imageforge.manifest import show as show_manifest

    s = settings(c, manifest, set)
    print(show_manifest(s.manifest, s.overrides, registry=s.registry))


@task(
    help={"target": f"stage to plan (any stage name; {TARGET_DEFAULT})", "manifest": MANIFEST_HELP,
          "set": SET_HELP,
          "json": "print the plan as one JSON object",
          "graph": "also write the DAG (.dot/.svg/.png)", "remote": REMOTE_HELP},
    iterable=["set"],
)
@boundary
def plan(c: Context, target: str | None = None, manifest: str | None = None,
         set: list[str] | None = None, json: bool = False, graph: str | None = None,
         remote: str | None = None) -> None:
    """Show the stages a target needs, in build order, with keys and cache status."""
    from imageforge import remote as remote_mod

    s = settings(c, manifest, set, remote=remote)
    target = target or project.default_target(s)
    with remote_mod.session(s.remote) as registry:
        planned = project.plan(s, target, remote=registry)
    verdict = project.waived(s, planned.manifest)
    if graph:
        from imageforge.graph import write_graph

        write_graph(planned, Path(graph))
    if json:
        document = planned.to_json(project.manifest_label(s.manifest))
        if verdict.accepted:
            document["waived"] = [accepted.to_json() for accepted in verdict.accepted]
        print(jsonlib.dumps(document, indent=2))
        return
    print(f"target {planned.target}  manifest {project.manifest_label(s.manifest)}")
    for line in verdict.lines():
        print(line)
    extended = planned.manifest.image.get("extends")
    if extended:
        print(f"on {extended}, which already has: {', '.join(planned.manifest.image['provides'])}")
    print(f"{'stage':<18} {'status':<7} {'version':<12} {'key':<19} deps")
    for st in planned.stages:
        version = str(st.inputs.get("version") or "-")
        print(f"{st.name:<18} {st.status:<7} {version:<12} {st.key[:19]} {','.join(st.deps)}")


@task(
    help={"target": f"stage to render ({TARGET_DEFAULT})", "manifest": MANIFEST_HELP,
          "set": SET_HELP,
          "format": "dockerfile (default), or bake: a docker-bake.json with one target per "
                    "stage (run `invoke fetch` first: it names the fetched sources)",
          "output": "write to this file instead of standard output"},
    iterable=["set"],
)
@boundary
def render(c: Context, target: str | None = None, manifest: str | None = None,
           set: list[str] | None = None, format: str = "dockerfile",
           output: str | None = None) -> None:
    """Print the multi-stage Dockerfile (or a docker-bake.json) for a target."""
    if format not in ("dockerfile", "bake"):
        raise UsageError(f"--format {format}: unknown format; use dockerfile or bake.")
    s = settings(c, manifest, set)
    planned = project.plan(s, target or project.default_target(s))
    if format == "dockerfile":
        text = project.dockerfile(planned)
    else:
        text = jsonlib.dumps(project.bake(s, planned), indent=2) + "\n"
    if output:
        write_output("--output", output, text)
    else:
        sys.stdout.write(text)


@task(
    help={"target": f"stage to build (any stage name; {TARGET_DEFAULT})",
          "manifest": MANIFEST_HELP, "set": SET_HELP,
          "push": "push to the registry in --tag instead of loading into Docker",
          "tag": "image reference (default imageforge/<name>:<target>-<key>)",
          "builder": "buildx builder to use (default: the current one)",
          "progress": "auto (live table on a terminal), plain, or json lines",
          "dry_run": "print the buildx command and Dockerfile, build nothing",
          "locked": "refuse a missing or stale lock file (what CI and nightly use)",
          "remote": REMOTE_HELP, "mirror": MIRROR_HELP,
          "layer_cache": "also keep BuildKit's layer cache per stage in this directory or "
                         "registry repository (default imageforge.layer_cache)",
          "summary": "also write a Markdown summary here ($GITHUB_STEP_SUMMARY is appended to "
                     "when set)",
          "test": "run test-image on a built image target (default; --no-test skips it); "
                  "a failed check exits 10 after the image is tagged",
          "ca_bundle": "CA bundle that steps downloading from PyPI trust (a TLS-intercepting "
                       "proxy's; passed as a BuildKit secret). Default: SSL_CERT_FILE, "
                       "REQUESTS_CA_BUNDLE or the system bundle; `none` turns it off",
          "code": "directory of training code to add on top of the image (stage `code`)",
          "program": "with --code: the script in it SageMaker runs, e.g. train.py",
          "output": "also write the files the target's stages made (not the base's) to this "
                    "directory, or to FILE.tar: NCCL, the plugin, nccl-tests for hosts that "
                    "run them outside containers",
          "expect_key": "refuse to build unless the target's key is this one (what a job of "
                        "`ci.generate` passes: pins moved since generation fail it, exit 8)"},
    iterable=["set"],
)
@boundary
def build(c: Context, target: str | None = None, manifest: str | None = None,
          set: list[str] | None = None, push: bool = False, tag: str | None = None,
          builder: str | None = None, progress: str = "auto", dry_run: bool = False,
          locked: bool = False, remote: str | None = None, test: bool = True,
          mirror: str | None = None, summary: str | None = None,
          layer_cache: str | None = None, ca_bundle: str | None = None,
          code: str | None = None, program: str | None = None,
          output: str | None = None, expect_key: str | None = None) -> None:
    """Build a target with BuildKit, then run its image checks.

    Every stage the target needs is built in one parallel BuildKit run, and what no cache
    holds is stored under its key; then test-image runs the image's checks."""
    from imageforge import cabundle, export
    from imageforge.build import BuildOptions, markdown_summary
    from imageforge.build import build as run_build
    from imageforge.build import summary as summary_table

    if progress not in ("auto", "plain", "json", "tty"):
        raise UsageError(f"--progress {progress}: use auto, plain or json.")
    overrides, code_target = code_overrides(code, program, target)
    bundle = cabundle.resolve(ca_bundle or c.config.get("imageforge", {}).get("ca_bundle") or None)
    s = settings(c, manifest, [*(set or []), *overrides], locked=locked, remote=remote,
                 mirror=mirror)
    target = code_target or project.default_target(s)
    options = BuildOptions(target=target, tag=tag, push=push, builder=builder,
                           progress=progress, dry_run=dry_run,  # type: ignore[arg-type]
                           ca_bundle=bundle, expect_key=expect_key)
    s = dataclasses.replace(s, layer_cache=layer_cache or c.config.get("imageforge", {}).get(
        "layer_cache") or None)
    if output is not None:
        export.check_destination(Path(output))
    result = run_build(s, options)
    if result is None:
        return
    print(summary_table(result))
    if output is not None:
        print(f"exported {result.target}'s files to "
              f"{export.export(s, result.target, Path(output))}")
    if summary:
        write_output("--summary", summary, markdown_summary(result), append=True)
    github = os.environ.get("GITHUB_STEP_SUMMARY")
    if github:
        write_output("$GITHUB_STEP_SUMMARY", github, markdown_summary(result), append=True)
    if not test or not project.is_image(s, target):
        return
    if push:
        # Nothing local to run: the image went to the registry without being loaded.
        print(f"checks not run: --push does not load {result.tag} here; "
              "build without --push, then `invoke test-image`.")
        return
    print()
    check_image(s, project.plan(s, target), result.tag)


def code_overrides(code: str | None, program: str | None, target: str | None
                   ) -> tuple[list[str], str | None]:
    """`--code DIR --program FILE` as --set overrides of the code stage, which they make the
    target when no target or the image the code goes on (smddp) is given."""
    if code is None and program is None:
        return [], target
    if code is None or program is None:
        raise UsageError("--code and --program go together: --code names the directory of "
                         "the training code, --program the script in it SageMaker runs.")
    overrides = [f"stages.code.dir={Path(code).resolve()}", f"stages.code.program={program}"]
    return overrides, "code" if target in (None, "smddp") else target


@task(
    help={"manifest": MANIFEST_HELP, "set": SET_HELP,
          "upgrade": "re-resolve every ref and URL, and move stages with a version policy "
                     "to the newest release it allows",
          "stage": "limit --upgrade to this stage (repeatable)",
          "check": "only verify that the lock exists and matches the manifest"},
    iterable=["set", "stage"],
)
@boundary
def lock(c: Context, manifest: str | None = None, set: list[str] | None = None,
         upgrade: bool = False, stage: list[str] | None = None, check: bool = False) -> None:
    """Resolve every sha256, commit and base digest into <manifest>.lock.json."""
    s = settings(c, manifest, set)
    if check:
        print(f"{project.check_lock(s)}: up to date")
        return
    path, changes = project.write_lock(s, upgrade=upgrade, stages=tuple(stage or ()))
    for line in changes:
        print(f"  {line}")
    print(f"{path}: {'updated' if changes else 'unchanged'}")


@task(
    help={"target": f"stage whose sources to fetch, and its dependencies' ({TARGET_DEFAULT})",
          "manifest": MANIFEST_HELP, "set": SET_HELP, "mirror": MIRROR_HELP},
    iterable=["set"],
)
@boundary
def fetch(c: Context, target: str | None = None, manifest: str | None = None,
          set: list[str] | None = None, mirror: str | None = None) -> None:
    """Download and verify every source a target needs into the source cache."""
    s = settings(c, manifest, set, mirror=mirror)
    fetched = project.fetch(s, target or project.default_target(s))
    for name, path in sorted(fetched.items()):
        print(f"{name:<20} {path}")


@task(
    name="test-image",
    help={"target": f"image target whose checks to run, e.g. efa-nccl ({TARGET_DEFAULT})",
          "image": "image reference to check (default: the one `build` tags)",
          "manifest": MANIFEST_HELP, "set": SET_HELP,
          "hardware": "also run the checks that need a GPU or an EFA device (real instances)",
          "json": "write every check's result to this JSON file",
          "junit": "write JUnit XML to this file",
          "report": "write DIR/test-image-<target>.json and DIR/test-image-<target>.xml"},
    iterable=["set"],
    # Long flags only: an automatic -h for --hardware would read as --help.
    auto_shortflags=False,
)
@boundary
def test_image(c: Context, target: str | None = None, image: str | None = None,
               manifest: str | None = None, set: list[str] | None = None,
               hardware: bool = False, json: str | None = None, junit: str | None = None,
               report: str | None = None) -> None:
    """Run every stage's smoke checks inside a built image; exit 10 when one fails.

    The checks run in one container. Passing runs are recorded by image digest in
    cache/tests/."""
    from imageforge.build import default_tag

    s = settings(c, manifest, set)
    if target is not None and not project.is_image(s, target):
        raise UsageError(f"--target {target} is not an image; test-image checks image "
                         f"targets: {', '.join(project.image_targets(s))}.")
    target = target or project.default_target(s)
    planned = project.plan(s, target)
    json_path = Path(json) if json else None
    junit_path = Path(junit) if junit else None
    if report:
        json_path = json_path or Path(report) / f"test-image-{target}.json"
        junit_path = junit_path or Path(report) / f"test-image-{target}.xml"
    check_image(s, planned, image or default_tag(planned), hardware=hardware,
                json_path=json_path, junit_path=junit_path)


def check_image(s: project.Settings, planned: Plan, image: str, *, hardware: bool = False,
                json_path: Path | None = None, junit_path: Path | None = None) -> None:
    """test-image's output, shared with build: the table, the report files, the record of a
    passing digest, and exit 10 naming every failed check."""
    from imageforge.checkreport import publish, table
    from imageforge.checks import require_passed, run_image_tests

    run = run_image_tests(planned, image, hardware=hardware)
    print(table(run))
    for path in publish(s.cache_dir, run, json_path=json_path, junit_path=junit_path):
        print(f"wrote {path}")
    require_passed(run)


@task
@boundary
def docs(c: Context) -> None:
    """Regenerate the manifest reference (README.md, docs/manifest.md) from the stages."""
    from imageforge.reference import update_page, update_readme
    from stages import STAGES

    changed = update_readme(Path("README.md"), STAGES)
    print("README.md: manifest reference " + ("updated" if changed else "already current"))
    changed = update_page(Path("docs/manifest.md"), STAGES)
    print("docs/manifest.md: " + ("updated" if changed else "already current"))


@task(name="ls", help={"json": "print entries as JSON"})
@boundary
def cache_ls(c: Context, json: bool = False) -> None:
    """List the local artifact cache: stage, key, size, age, last used, hits."""
    from imageforge.cachecmd import list_entries

    print(list_entries(settings(c, None, None), as_json=json))


@task(name="prune", help={"max_size": "keep at most this much, e.g. 20G or 500M",
                          "older_than": "remove entries unused for this long, e.g. 7d or 12h",
                          "keep_last": "always keep the N most recently used entries per stage"})
@boundary
def cache_prune(c: Context, max_size: str | None = None, older_than: str | None = None,
                keep_last: str = "0") -> None:
    """Remove artifacts by age and size (never while a build uses them)."""
    from imageforge.cachecmd import prune

    print(prune(settings(c, None, None), max_size=max_size, older_than=older_than,
                keep_last=whole_number("keep-last", keep_last, minimum=0)))


@task(name="push", help={"remote": REMOTE_HELP, "target": "only the stages of this target",
                         "manifest": MANIFEST_HELP, "set": SET_HELP}, iterable=["set"])
@boundary
def cache_push(c: Context, remote: str | None = None, target: str | None = None,
               manifest: str | None = None, set: list[str] | None = None) -> None:
    """Push local artifacts to the remote cache (all, or a target's)."""
    from imageforge.cachecmd import push

    print(push(settings(c, manifest, set, remote=remote), target))


@task(name="pull", help={"remote": REMOTE_HELP,
                         "target": f"the target whose stages to pull ({TARGET_DEFAULT})",
                         "manifest": MANIFEST_HELP, "set": SET_HELP}, iterable=["set"])
@boundary
def cache_pull(c: Context, target: str | None = None, remote: str | None = None,
               manifest: str | None = None, set: list[str] | None = None) -> None:
    """Download a target's artifacts from the remote cache into the local one."""
    from imageforge.cachecmd import pull

    s = settings(c, manifest, set, remote=remote)
    print(pull(s, target or project.default_target(s)))


@task(help={"target": f"stage to explain ({TARGET_DEFAULT})", "manifest": MANIFEST_HELP,
            "set": SET_HELP,
            "remote": REMOTE_HELP}, iterable=["set"])
@boundary
def explain(c: Context, target: str | None = None, manifest: str | None = None,
            set: list[str] | None = None, remote: str | None = None) -> None:
    """For each stage that must rebuild, what differs from its last build here."""
    from imageforge.cachecmd import explain as explain_plan

    s = settings(c, manifest, set, remote=remote)
    print(explain_plan(s, target or project.default_target(s)))


@task(name="sync", help={"to": "directory to write the mirror into", "manifest": MANIFEST_HELP,
                         "set": SET_HELP}, iterable=["set"])
@boundary
def mirror_sync(c: Context, to: str | None = None, manifest: str | None = None,
                set: list[str] | None = None) -> None:
    """Copy every source of a locked manifest into DIR, for air-gapped builds (--mirror).

    DIR gets the files, bare git repositories and an index.json; build with --mirror DIR."""
    if not to:
        raise UsageError("mirror.sync needs --to DIR: the directory to write the mirror into.")
    print(project.mirror_sync(settings(c, manifest, set), Path(to)))


@task(
    help={"manifest": MANIFEST_HELP, "set": SET_HELP,
          "target": f"image target ({TARGET_DEFAULT})",
          "push": "push the dated tag (and promote in the registry)",
          "repository": "registry repository for the tags, e.g. registry:5000/training",
          "channel": "tag promoted on success (default golden)",
          "tag_template": "tag template, e.g. {name}:pt{pytorch}-cu{cuda_nodot}-{date}",
          "size_budget": "fail when the image is more than this ratio over the last golden "
                         "one (default 1.2)",
          "report": "directory for nightly.json, nightly.md and nightly.xml (JUnit)",
          "webhook": "URL to POST the summary to (default imageforge.webhook)",
          "remote": REMOTE_HELP,
          "matrix": "every image of this matrix file ([[image]] tables), one report; a "
                    "stage key the images share is built once"},
    iterable=["set"],
)
@boundary
def nightly(c: Context, manifest: str | None = None, set: list[str] | None = None,
            target: str | None = None, push: bool = False, repository: str | None = None,
            channel: str = "golden", tag_template: str | None = None,
            size_budget: str = "1.2", report: str | None = None, webhook: str | None = None,
            remote: str | None = None, matrix: str | None = None) -> None:
    """lock --upgrade, rebuild what changed, test-image, push a dated tag, promote."""
    from imageforge.nightly import NightlyOptions, run

    config = c.config.get("imageforge", {})
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
    options = NightlyOptions(
        target=target, push=push, repository=repository or config.get("repository") or None,
        channel=channel, template=tag_template, size_budget=ratio("size-budget", size_budget),
        report_dir=Path(report) if report else None,
        webhook=webhook or config.get("webhook") or os.environ.get("IMAGEFORGE_WEBHOOK_URL"))
    if matrix:
        if manifest or set or target or tag_template:
            raise UsageError("nightly --matrix: the matrix file names each image's manifest, "
                             "--set overrides, target and tag; drop --manifest, --set, --target "
                             "and --tag-template.")
        matrix_nightly(c, matrix, options, remote)
        return
    result = run(settings(c, manifest, set, remote=remote), options)
    print(f"nightly {result.target}: {result.status}"
          + (f"; promoted {result.promoted}" if result.promoted else ""))
    if summary_file:
        from imageforge.nightly import markdown

        write_output("$GITHUB_STEP_SUMMARY", summary_file, markdown(result), append=True)


def matrix_nightly(c: Context, file: str, options: Any, remote: str | None) -> None:
    from imageforge import matrix as matrix_mod
    from imageforge.nightly import MatrixImage, matrix_markdown, run_matrix

    images = [MatrixImage(settings=settings(c, str(e.manifest), list(e.overrides), remote=remote),
                          target=e.target, tag=e.tag, label=e.label)
              for e in matrix_mod.load(Path(file))]
    result = run_matrix(file, images, options)
    for image in result.images:
        print(f"nightly {image.manifest} {image.target}: {image.status}"
              + (f"; promoted {image.promoted}" if image.promoted else ""))
    print(f"{len(result.images)} images: {result.status}; {len(result.built_keys)} stage "
          f"builds, {len(set(result.built_keys))} distinct keys")
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_file:
        write_output("$GITHUB_STEP_SUMMARY", summary_file, matrix_markdown(result), append=True)


@task(help={"image": "image by digest, REPOSITORY@sha256:...",
            "tag": "tag to point at it, e.g. golden"})
@boundary
def promote(c: Context, image: str | None = None, tag: str = "golden") -> None:
    """Point a tag at a digest that passed test-image, without rebuilding."""
    from imageforge import golden
    from imageforge import remote as remote_mod

    if not image:
        raise UsageError("promote needs --image REPOSITORY@sha256:<digest>: the tested image "
                         "to point the tag at.")
    s = settings(c, None, None)
    with remote_mod.credentials(image.split("/", 1)[0]) as env:
        print(golden.promote(image, tag, cache_dir=s.cache_dir, env=env))


def matrix_settings(c: Context, entry: Any) -> project.Settings:
    return settings(c, str(entry.manifest), list(entry.overrides))


def matrix_plans(c: Context, entries: list[Any]) -> list[Any]:
    from imageforge.matrix import Planned

    plans = []
    for entry in entries:
        s = matrix_settings(c, entry)
        target = entry.target or project.default_target(s)
        planned = project.plan(s, target)
        plans.append(Planned(entry=entry, target=target,
                             keys={st.name: st.key for st in planned.stages},
                             statuses={st.name: st.status for st in planned.stages}))
    return plans


@task(name="plan", help={"file": "the matrix file ([[image]] tables)",
                         "json": "print the summary as one JSON object"})
@boundary
def matrix_plan(c: Context, file: str | None = None, json: bool = False) -> None:
    """Plan every image of a matrix: what each builds, and what the images share."""
    from imageforge import matrix as matrix_mod

    if not file:
        raise UsageError("matrix.plan needs --file: the matrix file ([[image]] tables).")
    found = matrix_mod.summary(matrix_plans(c, matrix_mod.load(Path(file))))
    if json:
        print(jsonlib.dumps(found, indent=2))
        return
    for image in found["images"]:
        print(f"{image['image']}: {image['stages']} stages, builds "
              f"{', '.join(image['builds']) or 'nothing'}"
              + (f"; shares {', '.join(image['shared'])}" if image["shared"] else ""))
    print(f"{len(found['images'])} images, {found['stage_slots']} stage slots, "
          f"{found['distinct_keys']} distinct keys, {found['keys_to_build']} to build")


@task(name="build", help={"file": "the matrix file ([[image]] tables)",
                          "test": "run test-image on each image target (--no-test skips it)",
                          "progress": "auto, plain or json (as build)",
                          "report": "also write the matrix report (JSON) to this file"})
@boundary
def matrix_build(c: Context, file: str | None = None, test: bool = True,
                 progress: str = "auto", report: str | None = None) -> None:
    """Build every image of a matrix; a stage several images share is built once."""
    from imageforge import matrix as matrix_mod
    from imageforge.build import BuildOptions
    from imageforge.build import build as run_build
    from imageforge.build import summary as summary_table

    if not file:
        raise UsageError("matrix.build needs --file: the matrix file ([[image]] tables).")
    if progress not in ("auto", "plain", "json", "tty"):
        raise UsageError(f"--progress {progress}: use auto, plain or json.")
    entries = matrix_mod.load(Path(file))
    results: list[dict[str, Any]] = []
    for entry in entries:
        s = matrix_settings(c, entry)
        target = entry.target or project.default_target(s)
        print(f"== {entry.label}: {target}")
        result = run_build(s, BuildOptions(target=target, tag=entry.tag,
                                           progress=progress))  # type: ignore[arg-type]
        assert result is not None
        print(summary_table(result))
        if test and project.is_image(s, target):
            check_image(s, project.plan(s, target), result.tag)
        results.append({"image": entry.label, "target": target, "tag": result.tag,
                        "stages": {st.name: {"key": st.key, "state": st.state}
                                   for st in result.stages}})
    built = [st["key"] for r in results for st in r["stages"].values() if st["state"] == "built"]
    document = {"file": file, "images": results, "built": len(built),
                "distinct_built": len(set(built))}
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    path = settings(c, None, None).cache_dir / "reports" / f"{stamp}-matrix.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jsonlib.dumps(document, indent=2) + "\n")
    if report:
        write_output("--report", report, jsonlib.dumps(document, indent=2) + "\n")
    print(f"{len(results)} images; {len(built)} stage builds, each key once; report {path}")


@task(name="generate",
      help={"format": "github (a GitHub Actions workflow) or gitlab (a GitLab CI pipeline)",
            "file": "the matrix file ([[image]] tables); default: one image, --manifest",
            "manifest": MANIFEST_HELP, "set": SET_HELP,
            "target": f"image target without --file ({TARGET_DEFAULT})",
            "remote": REMOTE_HELP + "; required: jobs hand artifacts on through it",
            "out": "write the pipeline here (default: print it)",
            "json": "print the jobs as one JSON object instead of YAML"},
      iterable=["set"])
@boundary
def ci_generate(c: Context, format: str = "github", file: str | None = None,
                manifest: str | None = None, set: list[str] | None = None,
                target: str | None = None, remote: str | None = None, out: str | None = None,
                json: bool = False) -> None:
    """Write a CI pipeline with one job per stage key the registry cache lacks."""
    from imageforge import cigen
    from imageforge import matrix as matrix_mod
    from imageforge import remote as remote_mod

    if format not in cigen.FORMATS:
        raise UsageError(f"--format {format}: use github or gitlab.")
    repository = remote or c.config.get("imageforge", {}).get("remote")
    if not repository:
        raise UsageError("ci.generate needs --remote REPOSITORY (or imageforge.remote): the "
                         "registry cache through which the jobs hand artifacts on.")
    remote_mod.check_repository(repository)
    if file:
        if manifest or set or target:
            raise UsageError("ci.generate: --file lists the images; --manifest, --set and "
                             "--target go in its [[image]] tables instead.")
        entries = matrix_mod.load(Path(file))
    else:
        entries = [matrix_mod.Entry(manifest=settings(c, manifest, None).manifest,
                                    target=target, tag=None, overrides=tuple(set or ()))]
    images = []
    for entry in entries:
        s = matrix_settings(c, entry)
        planned = project.plan(s, entry.target or project.default_target(s), resolve=True)
        images.append(cigen.Image(manifest=project.manifest_label(entry.manifest),
                                  overrides=entry.overrides, tag=entry.tag, plan=planned))
    with remote_mod.credentials(repository.split("/", 1)[0]) as env:
        found = cigen.pipeline(images, repository,
                               cigen.registry_holds(remote_mod.Remote(repository=repository,
                                                                      env=env)))
    text = (jsonlib.dumps(cigen.as_json(found), indent=2) + "\n" if json else
            cigen.render(found, format, source=file or project.manifest_label(entries[0].manifest)))
    if out:
        write_output("--out", out, text)
        print(f"{out}: {cigen.summary(found)}")
    else:
        print(text, end="")
        print(cigen.summary(found), file=sys.stderr)


cache = Collection("cache", cache_ls, cache_prune, cache_push, cache_pull)
ci = Collection("ci", ci_generate)
matrix = Collection("matrix", matrix_plan, matrix_build)
mirror = Collection("mirror", mirror_sync)
ns = Collection(check, show, plan, render, lock, fetch, build, test_image, docs, explain, nightly,
               promote, cache, mirror, matrix, ci)
ns.configure({"imageforge": {"manifest": str(project.DEFAULT_MANIFEST), "cache_dir": "cache",
                             "remote": "", "rewrite": "", "repository": "", "webhook": "",
                             "layer_cache": "", "ca_bundle": "", "stage_dirs": ""}})


# (manifest, target, golden file): the Dockerfiles tests/unit/test_render.py compares with.
GOLDEN_DOCKERFILES = (
    ("manifests/smddp.toml", "smddp", "tests/unit/golden/smddp.Dockerfile"),
    ("manifests/efa-nccl.toml", "efa-nccl", "tests/unit/golden/efa-nccl.Dockerfile"),
)


@task(name="goldens")
@boundary
def goldens(c: Context) -> None:
    """Rewrite the golden Dockerfiles of the render tests after an intended change.

    Review the diff before committing it (the tests only ever compare)."""
    for manifest, target, path in GOLDEN_DOCKERFILES:
        text = project.dockerfile(project.plan(project.Settings(manifest=Path(manifest),
                                                                registry=discover(())),
                                               target))
        golden = Path(path)
        changed = not golden.exists() or golden.read_text() != text
        if changed:
            golden.write_text(text)
        print(f"{path}: " + ("updated" if changed else "already current"))


ns.add_task(goldens)


@task(help={"repeats": "no-op rebuilds per tool, median reported (cold and one-pin builds "
                       "run once: repeating them needs a prune and a cold rebuild)",
            "out": "results file (default bench/results.json)",
            "sizes": "synthetic graph sizes for planning at scale, e.g. 10,100,1000",
            "builds": "run the image builds (--no-builds: planning at scale only)",
            "keep": "keep the work directory (upstream, manifest, Dockerfiles)",
            "engine": "own (default): a Docker engine of the benchmark's own, pruned before "
                      "each cold build; host: the host's engine, never pruned (cold builds "
                      "may then find cached steps)"})
@boundary
def bench(c: Context, repeats: str = "3", out: str = "bench/results.json",
          sizes: str = "10,100,1000", builds: bool = True, keep: bool = False,
          engine: str = "own") -> None:
    """Benchmark imageforge against one plain Dockerfile on the sample upstream.

    Several minutes; best on an idle machine. Builds run on a Docker engine of the
    benchmark's own, whose BuildKit cache it prunes before each cold build; the host's is
    left alone."""
    from bench.run import Options, run_benchmark

    print(run_benchmark(Options(repeats=whole_number("repeats", repeats, minimum=1),
                                out=Path(out),
                                sizes=tuple(whole_number("sizes", s, minimum=1)
                                            for s in sizes.split(",") if s.strip()),
                                builds=builds, keep=keep,
                                engine=bench_engine(engine))))


ns.add_task(bench)


def bench_engine(value: str) -> Literal["own", "host"]:
    if value == "own":
        return "own"
    if value == "host":
        return "host"
    raise UsageError(f"--engine {value!r}: use `own` (the benchmark's own Docker engine) or "
                     "`host`.")


@task(
    name="run-local",
    help={"image": "image to run, from the local Docker store (never pulled)",
          "program": "training program, relative to --code (sets sagemaker_program)",
          "code": "directory mounted read-only at /opt/ml/code (sets "
                  "sagemaker_submit_directory)",
          "hosts": "number of hosts (containers algo-1 .. algo-N; default 1)",
          "hp": "hyperparameter KEY=VALUE; VALUE is read as JSON when it parses, else as a "
                "string (repeatable)",
          "channel": "input channel NAME=DIR, mounted read-only at /opt/ml/input/data/NAME "
                     "(repeatable)",
          "output": "new or empty directory for the job's files (default "
                    "cache/run-local/<job>); the model lands in <output>/algo-N/model",
          "timeout": "stop the job after this many seconds (default 3600)",
          "json": "print a JSON report instead of the summary (logs go to stderr)",
          "verbose": "show each host's output ([algo-N] lines) as it runs; it always goes to "
                     "<output>/algo-N/log.txt"},
    iterable=["hp", "channel"],
    # Long flags only: an automatic -h for --hosts would read as --help.
    auto_shortflags=False,
)
@boundary
def run_local(c: Context, image: str | None = None, program: str | None = None,
              code: str | None = None, hosts: str = "1", hp: list[str] | None = None,
              channel: list[str] | None = None, output: str | None = None,
              timeout: str = "3600", json: bool = False, verbose: bool = False) -> None:
    """Run an image as a SageMaker training job on this machine, before paying for instances.

    One container per host, the /opt/ml files SageMaker writes, a private network; exit 11
    when a host fails or the job runs out of time."""
    from imageforge import sagemaker

    spec = sagemaker.make_spec(image=image, output=output,
                              hosts=whole_number("hosts", hosts, minimum=1), program=program,
                              code=code, hp=hp or [], channel=channel or [],
                              timeout=whole_number("timeout", timeout, minimum=1),
                              cache_dir=settings(c, None, None).cache_dir, verbose=verbose)
    result = sagemaker.run(spec, log=sys.stderr if json else sys.stdout)
    print(jsonlib.dumps(result.to_json(), indent=2) if json else sagemaker.summary(result))
    sagemaker.require_success(result)


ns.add_task(run_local)

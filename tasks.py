"""imageforge's command line: `invoke <task> --help` for each task's flags.

Tasks hold no logic: they parse flags into the arguments of imageforge/front.py, print what
it returns and turn its errors into one line and an exit code (imageforge/errors.py lists
them).
"""

from __future__ import annotations

import functools
import json as jsonlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import Task
from invoke.tasks import task as invoke_task

from imageforge import diskfull, exits, front, log
from imageforge.app import options
from imageforge.errors import FatalError, UsageError
from stages import STAGES, discover

F = TypeVar("F", bound=Callable[..., Any])

MANIFEST_HELP = ("manifest TOML (default: manifests/smddp.toml, or imageforge.manifest in "
                 "invoke.yaml)")
SET_HELP = "override a manifest key, e.g. stages.nccl.version=2.18.6 (repeatable)"
REMOTE_HELP = ("registry repository of the shared artifact cache, e.g. "
               "127.0.0.1:5000/imageforge-cache (default: imageforge.remote in invoke.yaml)")
MIRROR_HELP = ("fetch only from this mirror (a directory or URL made by mirror.sync); "
               "the original URLs are never contacted")
TARGET_DEFAULT = "default: the image the manifest defines"
# The only short flags, each the same option in every task that has that option. invoke
# would give every option the first letter of its name not yet taken in its task, so -s was
# --set in one task and --stage in another, and -t meant --target, --tag, --to or --test.
SHORT_FLAGS: dict[str, tuple[str, ...]] = {"manifest": ("m",), "target": ("t",), "set": ("s",)}


class ShortFlagTask(Task[Any]):
    """A task whose short flags are SHORT_FLAGS' alone; every other option is long only."""

    def __init__(self, body: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(body, **kwargs)
        self.auto_shortflags = False

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        opts["names"] = [*opts["names"], *SHORT_FLAGS.get(name, ())]
        return opts


task = functools.partial(invoke_task, klass=ShortFlagTask)


# invoke reads invoke.yaml after importing this module: see exits.config_file_error.
sys.excepthook = exits.config_file_error


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
            raise Exit(log.error_line(str(exc)), code=exc.return_code) from None
        except BrokenPipeError:
            # The reader of the output went away (`| head`): stop as a shell pipeline's writer
            # would (128 + SIGPIPE), without a traceback, and without the interpreter's own
            # complaint when it flushes the dead pipe at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise Exit(code=exits.EXIT_PIPE) from None
        except OSError as exc:
            if diskfull.is_full(exc) and exc.filename is None and exits.output_full():
                raise Exit(log.error_line("standard output: no space left on its device; "
                                          "send the output somewhere with room."),
                           code=UsageError.return_code) from None
            # The modules that write name their place; this catches any write they missed.
            if diskfull.is_full(exc):
                full = diskfull.error(Path(exc.filename).parent if exc.filename else Path.cwd())
                raise Exit(log.error_line(str(full)), code=full.return_code) from None
            if exc.filename is None:
                raise
            # A path given by a flag (or a setting) that cannot be read or written.
            raise Exit(log.error_line(f"{exc.filename}: {exc.strerror or exc}; check that path "
                                      "and the flag or setting that names it."),
                       code=UsageError.return_code) from None
        except KeyboardInterrupt:
            raise Exit(log.error_line("interrupted."), code=130) from None

    return wrapper  # type: ignore[return-value]


def config(c: Context) -> options.Config:
    """invoke's `imageforge` configuration, and the loader of the stage registry: the engine
    never imports `stages`, the front end passes it in."""
    return options.Config(table=c.config.get("imageforge", {}), discover=discover)


@task(help={"manifest": MANIFEST_HELP, "set": SET_HELP,
            "locked": "also fail when the lock file is missing or stale"}, iterable=["set"])
@boundary
def check(c: Context, manifest: str | None = None, set: list[str] | None = None,
          locked: bool = False) -> None:
    """Validate a manifest (keys, values, compatibility rules, lock) and plan its images."""
    for line in front.check(config(c), options.Flags(manifest=manifest, overrides=set,
                                                       locked=locked)):
        print(line)


@task(help={"manifest": MANIFEST_HELP, "set": SET_HELP}, iterable=["set"])
@boundary
def show(c: Context, manifest: str | None = None, set: list[str] | None = None) -> None:
    """Print the effective manifest, each value with the file and line it comes from.

    Tables a manifest inherits (`inherit = "smddp.toml"`) are merged in, --set applied."""
    print(front.show(config(c), options.Flags(manifest=manifest, overrides=set)))


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
    found = front.plan(config(c), options.Flags(manifest=manifest, overrides=set, remote=remote),
                       target, graph)
    print(jsonlib.dumps(found.to_json(), indent=2) if json else found.table())


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
    sys.stdout.write(front.render(config(c), options.Flags(manifest=manifest, overrides=set),
                                  target, format, output))


@task(
    help={"target": f"stage to build (any stage name; {TARGET_DEFAULT})",
          "manifest": MANIFEST_HELP, "set": SET_HELP,
          "push": "push to the registry in --tag instead of loading into Docker",
          "tag": "image reference (default imageforge/<name>:<target>-<key>)",
          "builder": "buildx builder to use (default: the current one)",
          "progress": "auto (live table on a terminal), plain, or json lines",
          "dry_run": "print each bake it would run (command, bake file, Dockerfile), build nothing",
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
    flags = options.Flags(manifest=manifest, overrides=set, locked=locked, remote=remote,
                        mirror=mirror, layer_cache=layer_cache, code=code, program=program)
    request = front.BuildRequest(target=target, push=push, tag=tag, builder=builder,
                                 progress=progress, dry_run=dry_run, test=test, summary=summary,
                                 ca_bundle=ca_bundle, output=output, expect_key=expect_key)
    for line in front.build(config(c), flags, request):
        print(line)


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
    for line in front.lock(config(c), options.Flags(manifest=manifest, overrides=set),
                           upgrade=upgrade, stages=stage, check=check):
        print(line)


@task(
    help={"target": f"stage whose sources to fetch, and its dependencies' ({TARGET_DEFAULT})",
          "manifest": MANIFEST_HELP, "set": SET_HELP, "mirror": MIRROR_HELP},
    iterable=["set"],
)
@boundary
def fetch(c: Context, target: str | None = None, manifest: str | None = None,
          set: list[str] | None = None, mirror: str | None = None) -> None:
    """Download and verify every source a target needs into the source cache."""
    for line in front.fetch(config(c), options.Flags(manifest=manifest, overrides=set,
                                                       mirror=mirror), target):
        print(line)


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
)
@boundary
def test_image(c: Context, target: str | None = None, image: str | None = None,
               manifest: str | None = None, set: list[str] | None = None,
               hardware: bool = False, json: str | None = None, junit: str | None = None,
               report: str | None = None) -> None:
    """Run every stage's smoke checks inside a built image; exit 10 when one fails.

    The checks run in one container. Passing runs are recorded by image digest in
    cache/tests/."""
    request = front.CheckRequest(target=target, image=image, hardware=hardware, json_file=json,
                                 junit_file=junit, report_dir=report)
    for line in front.test_image(config(c), options.Flags(manifest=manifest, overrides=set),
                                 request):
        print(line)


@task
@boundary
def docs(c: Context) -> None:
    """Regenerate the manifest reference (docs/manifest.md) from the stages."""
    for line in front.docs(STAGES):
        print(line)


@task(name="ls", help={"json": "print entries as JSON"})
@boundary
def cache_ls(c: Context, json: bool = False) -> None:
    """List the local artifact cache: stage, key, size, age, last used, hits."""
    print(front.cache_ls(config(c), as_json=json))


@task(name="prune", help={"max_size": "keep at most this much, e.g. 20G or 500M",
                          "older_than": "remove entries unused for this long, e.g. 7d or 12h",
                          "keep_last": "always keep the N most recently used entries per stage"})
@boundary
def cache_prune(c: Context, max_size: str | None = None, older_than: str | None = None,
                keep_last: str = "0") -> None:
    """Remove artifacts by age and size (never while a build uses them)."""
    print(front.cache_prune(config(c), max_size=max_size, older_than=older_than,
                            keep_last=keep_last))


@task(name="push", help={"remote": REMOTE_HELP, "target": "only the stages of this target",
                         "manifest": MANIFEST_HELP, "set": SET_HELP}, iterable=["set"])
@boundary
def cache_push(c: Context, remote: str | None = None, target: str | None = None,
               manifest: str | None = None, set: list[str] | None = None) -> None:
    """Push local artifacts to the remote cache (all, or a target's)."""
    print(front.cache_push(config(c), options.Flags(manifest=manifest, overrides=set,
                                                 remote=remote), target))


@task(name="pull", help={"remote": REMOTE_HELP,
                         "target": f"the target whose stages to pull ({TARGET_DEFAULT})",
                         "manifest": MANIFEST_HELP, "set": SET_HELP}, iterable=["set"])
@boundary
def cache_pull(c: Context, target: str | None = None, remote: str | None = None,
               manifest: str | None = None, set: list[str] | None = None) -> None:
    """Download a target's artifacts from the remote cache into the local one."""
    print(front.cache_pull(config(c), options.Flags(manifest=manifest, overrides=set,
                                                 remote=remote), target))


@task(help={"rebuild": "build the stages again from scratch (no layer cache, cache mounts "
                       "of their own) and compare them with their stored artifacts",
            "target": f"the target whose stages to verify ({TARGET_DEFAULT})",
            "stage": "verify only this stage (repeatable; default every stage the target "
                     "builds)",
            "image": "instead: build the image its labels describe from nothing (a cache "
                     "directory of its own) and compare, e.g. reg:5000/training/smddp@sha256:...",
            "manifest": MANIFEST_HELP, "set": SET_HELP,
            "remote": REMOTE_HELP + "; its artifacts are compared too, and those a rebuild "
                      "matches are recorded as verified (what cache_trust = verified uses)",
            "builder": "buildx builder to use (default: the current one)",
            "progress": "auto, plain, or json lines", "json": "print the verdicts as JSON"},
      iterable=["set", "stage"])
@boundary
def verify(c: Context, rebuild: bool = False, target: str | None = None,
           stage: list[str] | None = None, manifest: str | None = None,
           set: list[str] | None = None, remote: str | None = None, image: str | None = None,
           builder: str | None = None, progress: str = "auto", json: bool = False) -> None:
    """Rebuild stages from scratch and compare them with their artifacts.

    Each is compared with its stored artifact and the remote cache's (or an image alone with
    what its pins give): exit 13 naming the stage and its first differing file."""
    flags = options.Flags(manifest=manifest, overrides=set, remote=remote)
    for line in front.verify(config(c), flags, target,
                             stage, rebuild=rebuild, image=image, builder=builder,
                             progress=progress, as_json=json):
        print(line)


@task(help={"target": f"stage to explain ({TARGET_DEFAULT})", "manifest": MANIFEST_HELP,
            "set": SET_HELP,
            "remote": REMOTE_HELP}, iterable=["set"])
@boundary
def explain(c: Context, target: str | None = None, manifest: str | None = None,
            set: list[str] | None = None, remote: str | None = None) -> None:
    """For each stage that must rebuild, what differs from its last build here."""
    print(front.explain(config(c), options.Flags(manifest=manifest, overrides=set, remote=remote),
                        target))


@task(name="sync", help={"to": "directory to write the mirror into", "manifest": MANIFEST_HELP,
                         "set": SET_HELP}, iterable=["set"])
@boundary
def mirror_sync(c: Context, to: str | None = None, manifest: str | None = None,
                set: list[str] | None = None) -> None:
    """Copy every source of a locked manifest into DIR, for air-gapped builds (--mirror).

    DIR gets the files, bare git repositories and an index.json; build with --mirror DIR."""
    print(front.mirror_sync(config(c), options.Flags(manifest=manifest, overrides=set), to))


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
                    "stage key the images share is built once",
          "verify": "also rebuild this many stages from scratch (those verified longest "
                    "ago) and compare them with their artifacts before promoting (default 0)"},
    iterable=["set"],
)
@boundary
def nightly(c: Context, manifest: str | None = None, set: list[str] | None = None,
            target: str | None = None, push: bool = False, repository: str | None = None,
            channel: str = "golden", tag_template: str | None = None,
            size_budget: str = "1.2", report: str | None = None, webhook: str | None = None,
            remote: str | None = None, matrix: str | None = None, verify: str = "0") -> None:
    """lock --upgrade, rebuild what changed, test-image, push a dated tag, promote."""
    request = front.NightlyRequest(target=target, push=push, repository=repository,
                                   channel=channel, tag_template=tag_template,
                                   size_budget=size_budget, report=report, webhook=webhook,
                                   matrix=matrix, verify=verify)
    for line in front.nightly(config(c), options.Flags(manifest=manifest, overrides=set,
                                                     remote=remote), request):
        print(line)


@task(help={"image": "image by digest, REPOSITORY@sha256:...",
            "tag": "tag to point at it, e.g. golden"})
@boundary
def promote(c: Context, image: str | None = None, tag: str = "golden") -> None:
    """Point a tag at a digest that passed test-image, without rebuilding."""
    print(front.promote(config(c), image, tag))


@task(name="plan", help={"file": "the matrix file ([[image]] tables)",
                         "json": "print the summary as one JSON object"})
@boundary
def matrix_plan(c: Context, file: str | None = None, json: bool = False) -> None:
    """Plan every image of a matrix: what each builds, and what the images share."""
    found = front.matrix_plan(config(c), file)
    print(jsonlib.dumps(found.to_json(), indent=2) if json else found.table())


@task(name="build", help={"file": "the matrix file ([[image]] tables)",
                          "test": "run test-image on each image target (--no-test skips it)",
                          "progress": "auto, plain or json (as build)",
                          "report": "also write the matrix report (JSON) to this file"})
@boundary
def matrix_build(c: Context, file: str | None = None, test: bool = True,
                 progress: str = "auto", report: str | None = None) -> None:
    """Build every image of a matrix; a stage several images share is built once."""
    for line in front.matrix_build(config(c), file, test=test, progress=progress, report=report):
        print(line)


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
    found = front.ci_generate(config(c), options.Flags(manifest=manifest, overrides=set,
                                                     remote=remote),
                              fmt=format, file=file, target=target, out=out, as_json=json)
    sys.stdout.write(found.out)
    sys.stderr.write(found.err)


cache = Collection("cache", cache_ls, cache_prune, cache_push, cache_pull)
ci = Collection("ci", ci_generate)
matrix = Collection("matrix", matrix_plan, matrix_build)
mirror = Collection("mirror", mirror_sync)
ns = Collection(check, show, plan, render, lock, fetch, build, test_image, docs, explain,
               verify, nightly, promote, cache, mirror, matrix, ci)
# No `imageforge` defaults declared to invoke: options.Config applies them, reads the
# INVOKE_IMAGEFORGE_* variables itself and checks every value's type, so a wrongly typed
# invoke.yaml is one sentence, not a traceback from invoke's merge.


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
    for line in front.goldens(GOLDEN_DOCKERFILES, discover(())):
        print(line)


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

    chosen = front.bench_choices(repeats=repeats, sizes=sizes, engine=engine)
    print(run_benchmark(Options(repeats=chosen.repeats, out=Path(out), sizes=chosen.sizes,
                                builds=builds, keep=keep, engine=chosen.engine)))


ns.add_task(bench)


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
)
@boundary
def run_local(c: Context, image: str | None = None, program: str | None = None,
              code: str | None = None, hosts: str = "1", hp: list[str] | None = None,
              channel: list[str] | None = None, output: str | None = None,
              timeout: str = "3600", json: bool = False, verbose: bool = False) -> None:
    """Run an image as a SageMaker training job on this machine, before paying for instances.

    One container per host, the /opt/ml files SageMaker writes, a private network; exit 11
    when a host fails or the job runs out of time."""
    request = front.RunLocalRequest(image=image, program=program, code=code, hosts=hosts, hp=hp,
                                    channel=channel, output=output, timeout=timeout,
                                    verbose=verbose)
    for text in front.run_local(config(c), request, log=sys.stderr if json else sys.stdout,
                                as_json=json):
        print(text)


ns.add_task(run_local)

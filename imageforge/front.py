"""The one module tasks.py calls: every command as a function of plain, typed arguments.

tasks.py parses flags into these arguments, prints what comes back and turns FatalError into
an exit code. Which value wins and whether it is valid is app/options.py's (a flag, else
invoke's configuration, else the environment, else the default); where a report goes is
app/outputs.py's; what `plan` and `matrix.plan` show is app/views.py's. What is left here is
each command's flow: the chain build -> summary -> test-image, and the planning of matrix
images (ci.generate, matrix.plan, matrix.build, nightly --matrix).

Commands whose output comes while they run (build, test-image, matrix.build, nightly, ...)
are generators of the lines to print: each line is yielded when the command gets there, so
a failure later (a failed check: exit 10) still finds the earlier lines printed. The engine
never imports `stages`: the front end passes the registry in (`Config.discover`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from imageforge import cachedir, jsonfile
from imageforge.app import project
from imageforge.app.options import (
    RENDER_FORMATS,
    TAG,
    Config,
    Flags,
    bench_engine,
    ca_bundle,
    ci_format,
    code_flags,
    code_overrides,
    count,
    image_tag,
    pick,
    progress_mode,
    ratio,
    whole_number,
    workspace,
)
from imageforge.app.outputs import output_file, stdout_or_file, write_output
from imageforge.app.views import MatrixView, Output, PlanView
from imageforge.app.workspace import Workspace
from imageforge.errors import FatalError, UsageError
from imageforge.model.manifest import manifest_label
from imageforge.model.stage import Stage
from imageforge.planning.plan import Plan

if TYPE_CHECKING:
    from imageforge.app.nightly import NightlyOptions
    from imageforge.buildkit.results import BuildResult
    from imageforge.model.matrix import Entry, Planned


def _target(ws: Workspace, target: str | None) -> str:
    return target or project.default_target(ws)


# ---- commands on one manifest --------------------------------------------------------------

def check(config: Config, flags: Flags) -> list[str]:
    s = workspace(config, flags)
    return [f"  {line}" for line in project.check(s)] + [f"{s.manifest}: valid"]


def show(config: Config, flags: Flags) -> str:
    from imageforge.model.manifest import show as show_manifest

    s = workspace(config, flags)
    return show_manifest(s.manifest, s.overrides, registry=s.registry)


def plan(config: Config, flags: Flags, target: str | None, graph: str | None) -> PlanView:
    """The plan with each stage's status (the remote cache asked when one is set); `graph`:
    also write the DAG there."""
    from imageforge.cache import remote as remote_mod

    s = workspace(config, flags)
    target = _target(s, target)
    with remote_mod.session(s.remote, verified_in=s.verified_in) as registry:
        planned = project.plan(s, target, remote=registry)
    verdict = project.waived(s, planned.manifest)
    if graph:
        from imageforge.planning.graph import write_graph

        write_graph(planned, Path(graph))
    return PlanView(plan=planned, manifest=manifest_label(s.manifest), verdict=verdict)


def render(config: Config, flags: Flags, target: str | None, fmt: str,
           output: str | None) -> str:
    """The Dockerfile (or docker-bake.json) of a target; written to `output` when given.
    Returns what is left for standard output."""
    if fmt not in RENDER_FORMATS:
        raise UsageError(f"--format {fmt}: unknown format; use dockerfile or bake.")
    s = workspace(config, flags)
    planned = project.plan(s, _target(s, target))
    if fmt == "dockerfile":
        text = project.dockerfile(planned)
    else:
        text = json.dumps(project.bake(s, planned), indent=2) + "\n"
    return stdout_or_file("--output", output, text)


def lock(config: Config, flags: Flags, *, upgrade: bool, stages: Sequence[str] | None,
         check: bool) -> list[str]:
    if check and upgrade:
        raise UsageError("lock --check and --upgrade contradict each other: --check changes "
                         "nothing, --upgrade rewrites the lock; give one of them.")
    s = workspace(config, flags)
    if check:
        return [f"{project.check_lock(s)}: up to date"]
    path, changes = project.write_lock(s, upgrade=upgrade, stages=tuple(stages or ()))
    return [f"  {line}" for line in changes] + [
        f"{path}: {'updated' if changes else 'unchanged'}"]


def fetch(config: Config, flags: Flags, target: str | None) -> list[str]:
    s = workspace(config, flags)
    fetched = project.fetch(s, _target(s, target))
    return [f"{name:<20} {path}" for name, path in sorted(fetched.items())]


def explain(config: Config, flags: Flags, target: str | None) -> str:
    from imageforge.app.cachecmd import explain as explain_plan

    s = workspace(config, flags)
    return explain_plan(s, _target(s, target))


def mirror_sync(config: Config, flags: Flags, to: str | None) -> str:
    if not to:
        raise UsageError("mirror.sync needs --to DIR: the directory to write the mirror into.")
    return str(project.mirror_sync(workspace(config, flags), Path(to)))


def docs(registry: Mapping[str, Stage]) -> list[str]:
    """Regenerate the manifest reference, docs/manifest.md (the README only links to it)."""
    from imageforge.model.reference import update_page

    changed = update_page(Path("docs/manifest.md"), registry)
    return ["docs/manifest.md: " + ("updated" if changed else "already current")]


def goldens(files: Sequence[tuple[str, str, str]],
            registry: Mapping[str, Stage]) -> Iterator[str]:
    """Rewrite each (manifest, target, golden file)'s Dockerfile where it changed."""
    for manifest, target, path in files:
        text = project.dockerfile(project.plan(Workspace(manifest=Path(manifest),
                                                                registry=registry), target))
        golden = Path(path)
        changed = not golden.exists() or golden.read_text() != text
        if changed:
            golden.write_text(text)
        yield f"{path}: " + ("updated" if changed else "already current")


# ---- the artifact cache ----------------------------------------------------------------------

def cache_ls(config: Config, *, as_json: bool) -> str:
    from imageforge.app.cachecmd import list_entries

    return list_entries(workspace(config), as_json=as_json)


def cache_prune(config: Config, *, max_size: str | None, older_than: str | None,
                keep_last: str) -> str:
    from imageforge.app.cachecmd import prune

    s = workspace(config)
    return prune(s, max_size=max_size, older_than=older_than,
                 keep_last=whole_number("keep-last", keep_last, minimum=0))


def cache_push(config: Config, flags: Flags, target: str | None) -> str:
    from imageforge.app.cachecmd import push

    return push(workspace(config, flags), target)


def cache_pull(config: Config, flags: Flags, target: str | None) -> str:
    from imageforge.app.cachecmd import pull

    s = workspace(config, flags)
    return pull(s, _target(s, target))


# ---- verify ----------------------------------------------------------------------------------

def verify(config: Config, flags: Flags, target: str | None, stages: Sequence[str] | None, *,
           rebuild: bool, image: str | None = None, builder: str | None = None,
           progress: str = "auto", as_json: bool = False) -> Iterator[str]:
    """`invoke verify --rebuild`: the lines to print, then NotReproducibleError naming the
    first stage whose rebuild differs from its stored artifact (or from `image`)."""
    from imageforge.app import verify as verify_mod

    if not rebuild:
        raise UsageError("verify needs --rebuild: it builds the stages again from scratch and "
                         "compares them with their stored artifacts.")
    if image and (target or stages):
        raise UsageError(f"verify --image {image}: the image's labels name its target and "
                         "stages; drop --target and --stage.")
    s = workspace(config, flags)
    bundle = ca_bundle(config, None)
    if image:
        from imageforge.app.verifyimage import verify_image

        verdicts = [verify_image(s, image, builder=builder, progress=progress_mode(progress),
                                 ca_bundle=bundle)]
        target = verdicts[0].stage
    else:
        target = _target(s, target)
        verdicts = verify_mod.rebuild(s, target, list(stages or ()), builder=builder,
                                      progress=progress_mode(progress), ca_bundle=bundle)
    if as_json:
        yield json.dumps({"target": target, "stages": [v.to_json() for v in verdicts]},
                         indent=2)
    else:
        yield from verify_mod.lines(verdicts)
    verify_mod.raise_if_failed(verdicts, image or "its stored artifact")


# ---- build and test-image ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildRequest:
    """`invoke build`'s flags besides those of Flags."""

    target: str | None = None
    push: bool = False
    tag: str | None = None
    builder: str | None = None
    progress: str = "auto"
    dry_run: bool = False
    test: bool = True
    summary: str | None = None
    ca_bundle: str | None = None
    output: str | None = None
    expect_key: str | None = None


def build(config: Config, flags: Flags, request: BuildRequest) -> Iterator[str]:
    """Build a target, then (an image, --test) run its checks: the lines to print, each when
    it is known. A failed check raises ImageCheckError after the image is tagged."""
    from imageforge.app import build as build_mod
    from imageforge.app import export
    from imageforge.buildkit.buildreport import markdown_summary, summary
    from imageforge.buildkit.results import BuildOptions

    progress = progress_mode(request.progress)
    code_flags(flags.code, flags.program)
    if request.push and not request.tag:
        # The default tag names no registry: a push would go to Docker Hub.
        raise UsageError("build --push needs --tag REGISTRY/REPOSITORY:TAG: without it the "
                         "image would be pushed to Docker Hub under its default name.")
    if request.tag:
        image_tag("--tag", request.tag)
    bundle = ca_bundle(config, request.ca_bundle)
    s = workspace(config, flags, layer_cache=True)
    _, code_target = code_overrides(flags.code, flags.program, request.target, s.registry)
    target = _target(s, code_target)
    if request.output is not None:
        export.check_destination(Path(request.output))
    options = BuildOptions(target=target, tag=request.tag, push=request.push,
                           builder=request.builder, progress=progress,
                           dry_run=request.dry_run, ca_bundle=bundle,
                           expect_key=request.expect_key, exports=request.output is not None)
    result = build_mod.build(s, options)
    if result is None:
        return
    yield summary(result)
    will_test = request.test and project.is_image(s, target)
    if result.uptodate and request.output is None and not request.summary and not will_test \
            and not config.environ.get("GITHUB_STEP_SUMMARY"):
        _remember(s, result)
    if request.output is not None:
        yield (f"exported {result.target}'s files to "
               f"{export.export(s, result.target, Path(request.output))}")
    _write_summaries(config, request.summary, markdown_summary(result))
    if not request.test or not project.is_image(s, target):
        return
    if request.push:
        # Nothing local to run: the image went to the registry without being loaded.
        yield (f"checks not run: --push does not load {result.tag} here; "
               "build without --push, then `invoke test-image`.")
        return
    yield ""
    yield from check_image(s, project.plan(s, target), result.tag)


def _remember(s: Workspace, result: BuildResult) -> None:
    """Let `imageforge build` answer the same command from a record while nothing changes
    (imageforge/uptodate.py); not after a warning, which the next build must give again."""
    import sys

    from imageforge import log, uptodate
    from imageforge.buildkit.buildreport import summary
    from imageforge.buildkit.results import as_noop

    facts = result.uptodate
    if facts is None or log.warned:
        return
    uptodate.remember(sys.argv[1:], cache_dir=s.cache_dir, checkout=Path(__file__).parents[1],
                      images=facts.images, entries=facts.entries, files=facts.files,
                      report=facts.report, stdout=summary(as_noop(result)))


def _write_summaries(config: Config, summary: str | None, text: str) -> None:
    """Append a Markdown summary to --summary's file and to $GITHUB_STEP_SUMMARY's."""
    if summary:
        write_output("--summary", summary, text, append=True)
    github = config.environ.get("GITHUB_STEP_SUMMARY")
    if github:
        write_output("$GITHUB_STEP_SUMMARY", github, text, append=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckRequest:
    """`invoke test-image`'s flags besides those of Flags."""

    target: str | None = None
    image: str | None = None
    hardware: bool = False
    json_file: str | None = None
    junit_file: str | None = None
    report_dir: str | None = None


def test_image(config: Config, flags: Flags, request: CheckRequest) -> Iterator[str]:
    """Run an image target's checks in a built image; the lines to print. ImageCheckError
    (exit 10) names every failed check."""
    from imageforge.planning.labels import default_tag

    s = workspace(config, flags)
    if request.target is not None and not project.is_image(s, request.target):
        raise UsageError(f"--target {request.target} is not an image; test-image checks image "
                         f"targets: {', '.join(project.image_targets(s))}.")
    json_path = output_file("--json", request.json_file)
    junit_path = output_file("--junit", request.junit_file)
    target = _target(s, request.target)
    planned = project.plan(s, target)
    if request.report_dir:
        json_path = json_path or Path(request.report_dir) / f"test-image-{target}.json"
        junit_path = junit_path or Path(request.report_dir) / f"test-image-{target}.xml"
    yield from check_image(s, planned, request.image or default_tag(planned),
                           hardware=request.hardware, json_path=json_path,
                           junit_path=junit_path)


def check_image(s: Workspace, planned: Plan, image: str, *, hardware: bool = False,
                json_path: Path | None = None, junit_path: Path | None = None
                ) -> Iterator[str]:
    """test-image's output, shared with build and matrix.build: the table, the report files,
    the record of a passing digest, and exit 10 naming every failed check."""
    from imageforge.image.checkreport import publish, table
    from imageforge.image.checks import require_passed, run_image_tests

    run = run_image_tests(planned, image, hardware=hardware)
    yield table(run)
    for path in publish(s.cache_dir, run, json_path=json_path, junit_path=junit_path):
        yield f"wrote {path}"
    require_passed(run)


# ---- nightly and promote -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class NightlyRequest:
    """`invoke nightly`'s flags besides those of Flags."""

    target: str | None = None
    push: bool = False
    repository: str | None = None
    channel: str = "golden"
    tag_template: str | None = None
    size_budget: str = "1.2"
    report: str | None = None
    webhook: str | None = None
    matrix: str | None = None
    verify: str = "0"


def nightly_options(config: Config, request: NightlyRequest) -> NightlyOptions:
    """The repository and webhook: a flag, else imageforge.repository / imageforge.webhook,
    else (the webhook) $IMAGEFORGE_WEBHOOK_URL."""
    from imageforge.app.nightly import NightlyOptions

    repository = pick(request.repository, config, "repository")
    if repository:
        image_tag("--repository (imageforge.repository)", repository)
    return NightlyOptions(
        target=request.target, push=request.push,
        repository=repository,
        channel=request.channel, template=request.tag_template,
        size_budget=ratio("size-budget", request.size_budget),
        report_dir=Path(request.report) if request.report else None,
        webhook=pick(request.webhook, config, "webhook", "IMAGEFORGE_WEBHOOK_URL"),
        verify=count("verify", request.verify))


def nightly(config: Config, flags: Flags, request: NightlyRequest) -> Iterator[str]:
    """One nightly (or a matrix file's, `request.matrix`); the lines to print."""
    from imageforge.app.nightly import markdown, run

    summary_file = config.environ.get("GITHUB_STEP_SUMMARY")
    options = nightly_options(config, request)
    if request.matrix:
        if flags.manifest or flags.overrides or request.target or request.tag_template:
            raise UsageError("nightly --matrix: the matrix file names each image's manifest, "
                             "--set overrides, target and tag; drop --manifest, --set, --target "
                             "and --tag-template.")
        yield from _matrix_nightly(config, request.matrix, options, flags.remote)
        return
    result = run(workspace(config, flags), options)
    yield (f"nightly {result.target}: {result.status}"
           + (f"; promoted {result.promoted}" if result.promoted else ""))
    if summary_file:
        write_output("$GITHUB_STEP_SUMMARY", summary_file, markdown(result), append=True)


def _matrix_nightly(config: Config, file: str, options: NightlyOptions,
                    remote: str | None) -> Iterator[str]:
    from imageforge.app.nightly import MatrixImage, matrix_markdown, run_matrix
    from imageforge.model import matrix as matrix_mod

    images = [MatrixImage(ws=_entry_workspace(config, e, remote=remote),
                          target=e.target, tag=e.tag, label=e.label)
              for e in matrix_mod.load(Path(file))]
    result = run_matrix(file, images, options)
    for image in result.images:
        yield (f"nightly {image.manifest} {image.target}: {image.status}"
               + (f"; promoted {image.promoted}" if image.promoted else ""))
    yield (f"{len(result.images)} images: {result.status}; {len(result.built_keys)} stage "
           f"builds, {len(set(result.built_keys))} distinct keys")
    summary_file = config.environ.get("GITHUB_STEP_SUMMARY")
    if summary_file:
        write_output("$GITHUB_STEP_SUMMARY", summary_file, matrix_markdown(result), append=True)


def promote(config: Config, image: str | None, tag: str) -> str:
    from imageforge.cache import remote as remote_mod
    from imageforge.image import golden

    if not image:
        raise UsageError("promote needs --image REPOSITORY@sha256:<digest>: the tested image "
                         "to point the tag at.")
    if not TAG.fullmatch(tag):
        raise UsageError(f"--tag {tag[:80]!r}: not a tag; use letters, digits, '_', '.' and '-' "
                         "(at most 128, not starting with '.' or '-').")
    s = workspace(config)
    with remote_mod.credentials(image.split("/", 1)[0]) as env:
        return golden.promote(image, tag, cache_dir=s.cache_dir, env=env)


# ---- matrices --------------------------------------------------------------------------------

def _entry_workspace(config: Config, entry: Entry, *,
                    remote: str | None = None) -> Workspace:
    """A matrix image's workspace: its manifest with its --set overrides."""
    return workspace(config, Flags(manifest=str(entry.manifest), overrides=entry.overrides,
                                  remote=remote))


def _matrix_file(file: str | None, command: str) -> Path:
    if not file:
        raise UsageError(f"{command} needs --file: the matrix file ([[image]] tables).")
    return Path(file)


def matrix_plans(config: Config, entries: Sequence[Entry]) -> list[Planned]:
    """Each matrix image planned: its target and every stage's key and status."""
    from imageforge.model.matrix import Planned, blame

    plans = []
    for entry in entries:
        try:
            s = _entry_workspace(config, entry)
            target = _target(s, entry.target)
            planned = project.plan(s, target)
        except FatalError as exc:
            raise blame(entry, exc) from None
        plans.append(Planned(entry=entry, target=target,
                             keys={st.name: st.key for st in planned.stages},
                             statuses={st.name: st.status for st in planned.stages}))
    return plans


def matrix_plan(config: Config, file: str | None) -> MatrixView:
    from imageforge.model import matrix as matrix_mod

    entries = matrix_mod.load(_matrix_file(file, "matrix.plan"))
    return MatrixView(summary=matrix_mod.summary(matrix_plans(config, entries)))


def matrix_build(config: Config, file: str | None, *, test: bool, progress: str,
                 report: str | None) -> Iterator[str]:
    """Build every image of a matrix (a key several share is built once), each followed by
    its checks; the matrix report goes to the cache's reports/ and to `report`."""
    from imageforge.app import build as build_mod
    from imageforge.buildkit.buildreport import summary
    from imageforge.buildkit.results import BuildOptions
    from imageforge.model import matrix as matrix_mod

    path = _matrix_file(file, "matrix.build")
    mode = progress_mode(progress)
    # As `build` does: without it a pip step behind a TLS-intercepting proxy fails, unless
    # BuildKit's layer cache happens to hold that step already.
    bundle = ca_bundle(config, None)
    entries = matrix_mod.load(path)
    results: list[dict[str, Any]] = []
    for entry in entries:
        s = _entry_workspace(config, entry)
        target = _target(s, entry.target)
        yield f"== {entry.label}: {target}"
        result = build_mod.build(s, BuildOptions(target=target, tag=entry.tag, progress=mode,
                                                     ca_bundle=bundle))
        assert result is not None
        yield summary(result)
        if test and project.is_image(s, target):
            yield from check_image(s, project.plan(s, target), result.tag)
        results.append({"image": entry.label, "target": target, "tag": result.tag,
                        "stages": {st.name: {"key": st.key, "state": st.state}
                                   for st in result.stages}})
    built = [st["key"] for r in results for st in r["stages"].values() if st["state"] == "built"]
    document = {"file": file, "images": results, "built": len(built),
                "distinct_built": len(set(built))}
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    written = cachedir.reports(workspace(config).cache_dir) / f"{stamp}-matrix.json"
    jsonfile.write_json(written, document)
    if report:
        write_output("--report", report, json.dumps(document, indent=2) + "\n")
    yield f"{len(results)} images; {len(built)} stage builds, each key once; report {written}"


def ci_generate(config: Config, flags: Flags, *, fmt: str, file: str | None,
                target: str | None, out: str | None, as_json: bool) -> Output:
    """A CI pipeline with one job per stage key the registry cache lacks, for one image
    (flags' manifest and --set, `target`) or every image of the matrix `file`."""
    from imageforge.cache import remote as remote_mod
    from imageforge.image import cigen
    from imageforge.model import matrix as matrix_mod

    chosen = ci_format(fmt)
    repository = pick(flags.remote, config, "remote")
    if not repository:
        raise UsageError("ci.generate needs --remote REPOSITORY (or imageforge.remote): the "
                         "registry cache through which the jobs hand artifacts on.")
    remote_mod.check_repository(repository)
    if file:
        if flags.manifest or flags.overrides or target:
            raise UsageError("ci.generate: --file lists the images; --manifest, --set and "
                             "--target go in its [[image]] tables instead.")
        entries = matrix_mod.load(Path(file))
    else:
        entries = [matrix_mod.Entry(manifest=workspace(config, Flags(manifest=flags.manifest))
                                    .manifest,
                                    target=target, tag=None,
                                    overrides=tuple(flags.overrides or ()))]
    images = []
    for entry in entries:
        s = _entry_workspace(config, entry)
        planned = project.plan(s, _target(s, entry.target), resolve=True)
        images.append(cigen.Image(manifest=manifest_label(entry.manifest),
                                  overrides=entry.overrides, tag=entry.tag, plan=planned))
    # Under cache_trust = "verified" a key whose remote artifact no rebuild verified gets a
    # job, as the build that needs it would not use that artifact either.
    trust = workspace(config, Flags()).verified_in
    with remote_mod.credentials(repository.split("/", 1)[0]) as env:
        registry = remote_mod.Remote(repository=repository, env=env, verified_in=trust)
        found = cigen.pipeline(images, repository, cigen.registry_holds(registry))
    text = (json.dumps(cigen.as_json(found), indent=2) + "\n" if as_json else
            cigen.render(found, chosen,
                         source=file or manifest_label(entries[0].manifest)))
    if out:
        write_output("--out", out, text)
        return Output(out=f"{out}: {cigen.summary(found)}\n")
    return Output(out=text, err=cigen.summary(found) + "\n")


# ---- bench and run-local -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchChoices:
    """`invoke bench`'s validated numbers and engine (bench.run.Options takes them)."""

    repeats: int
    sizes: tuple[int, ...]
    engine: Literal["own", "host"]


def bench_choices(*, repeats: str, sizes: str, engine: str) -> BenchChoices:
    return BenchChoices(repeats=whole_number("repeats", repeats, minimum=1),
                        sizes=tuple(whole_number("sizes", s, minimum=1)
                                    for s in sizes.split(",") if s.strip()),
                        engine=bench_engine(engine))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunLocalRequest:
    """`invoke run-local`'s flags."""

    image: str | None = None
    program: str | None = None
    code: str | None = None
    hosts: str = "1"
    hp: Sequence[str] | None = None
    channel: Sequence[str] | None = None
    output: str | None = None
    timeout: str = "3600"
    verbose: bool = False


def run_local(config: Config, request: RunLocalRequest, *, log: TextIO,
              as_json: bool) -> Iterator[str]:
    """Run an image as a SageMaker training job (the hosts' output goes to `log`); yields the
    report (JSON with `as_json`), then TrainingJobError (exit 11) when a host failed."""
    from imageforge import sagemaker

    spec = sagemaker.make_spec(image=request.image, output=request.output,
                              hosts=whole_number("hosts", request.hosts, minimum=1),
                              program=request.program, code=request.code,
                              hp=request.hp or [], channel=request.channel or [],
                              timeout=whole_number("timeout", request.timeout, minimum=1),
                              cache_dir=workspace(config).cache_dir, verbose=request.verbose)
    result = sagemaker.run(spec, log=log)
    yield json.dumps(result.to_json(), indent=2) if as_json else sagemaker.summary(result)
    sagemaker.require_success(result)

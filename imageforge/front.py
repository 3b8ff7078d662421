"""The one module tasks.py calls: every command as a function of plain, typed arguments.

tasks.py parses flags into these arguments, prints what comes back and turns FatalError into
an exit code; everything else a command decides is here: which value wins (a flag, else
invoke's configuration, else the environment, else the default: `workspace` and `pick`),
whether a flag's value is valid (the same UsageErrors the flags always gave), the chain
build -> summary -> test-image, and the planning of matrix images (ci.generate, matrix.plan,
matrix.build, nightly --matrix).

Commands whose output comes while they run (build, test-image, matrix.build, nightly, ...)
are generators of the lines to print: each line is yielded when the command gets there, so
a failure later (a failed check: exit 10) still finds the earlier lines printed. The engine
never imports `stages`: the front end passes the registry in (`Config.discover`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from imageforge import cachedir, diskfull, jsonfile
from imageforge.app import project
from imageforge.app.workspace import DEFAULT_MANIFEST, Workspace
from imageforge.errors import CacheError, FatalError, UsageError
from imageforge.model import validate
from imageforge.model.manifest import manifest_label
from imageforge.model.stage import Stage
from imageforge.planning.plan import Plan
from imageforge.sources.mirror import parse_rewrites
from imageforge.textsafe import escaped

if TYPE_CHECKING:
    from imageforge.app.nightly import NightlyOptions
    from imageforge.buildkit.progress import Mode
    from imageforge.buildkit.results import BuildResult
    from imageforge.image.cigen import Format
    from imageforge.model.matrix import Entry, Planned
    from imageforge.planning.rules import Verdict

# The stage registry of some directories of team stage modules (tasks.py: stages.discover).
Discover = Callable[[Sequence[Path]], Mapping[str, Stage]]

# The `imageforge` table of invoke's configuration, as tasks.py declares it: "" is "not set".
CONFIG_DEFAULTS: Mapping[str, str] = {
    "manifest": str(DEFAULT_MANIFEST), "cache_dir": "cache", "remote": "",
    "rewrite": "", "repository": "", "webhook": "", "layer_cache": "", "ca_bundle": "",
    "stage_dirs": "", "image_artifacts": "", "cache_trust": ""}
# Where whole-image artifacts are kept (imageforge.image_artifacts): by name in the engine's
# image store (no second copy), or as OCI layouts in the cache directory (self-contained: a
# directory a CI system can save and restore).
IMAGE_ARTIFACTS = ("image-store", "oci-layout")

PROGRESS: tuple[Mode, ...] = ("auto", "plain", "json", "tty")
RENDER_FORMATS = ("dockerfile", "bake")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """What a command reads besides its flags: the `imageforge` table of invoke's
    configuration (invoke.yaml, INVOKE_IMAGEFORGE_* variables, CONFIG_DEFAULTS), the process
    environment, and the front end's loader of the stage registry."""

    table: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    discover: Discover
    environ: Mapping[str, str] = dataclasses.field(default_factory=lambda: os.environ)

    def get(self, key: str) -> Any:
        """A configured value; an empty one counts as not set (None)."""
        return self.value(key) or None

    def value(self, key: str) -> Any:
        """$INVOKE_IMAGEFORGE_<KEY>, else invoke.yaml's `imageforge.<key>` (invoke's order).
        The variables are read here, not by invoke: invoke maps them only onto keys declared
        as defaults, and declared defaults make a wrongly typed invoke.yaml value fail inside
        invoke's own merge, with a traceback."""
        name = ENV_PREFIX + key.upper()
        return self.environ[name] if name in self.environ else self.table.get(key)

    def __post_init__(self) -> None:
        if not isinstance(self.table, Mapping):
            raise UsageError(f"imageforge in the invoke config is {self.table!r:.40}, not a table "
                             "of settings; write `imageforge:` with `key: value` lines under it "
                             "in invoke.yaml.")
        for key, value in self.table.items():
            # stage_dirs and rewrite take lists too, and say so where they are read.
            if key in CONFIG_DEFAULTS and key not in LIST_SETTINGS \
                    and not (value is None or isinstance(value, str)):
                raise UsageError(f"imageforge.{key} in the invoke config is {value!r:.60}; give "
                                 "a string in invoke.yaml.")
        # invoke keeps unknown keys and ignores unknown INVOKE_* variables: a misspelt setting
        # would otherwise be dropped without a word.
        for key in self.table:
            if key not in CONFIG_DEFAULTS:
                raise UsageError(f"imageforge.{key} in the invoke config is not a setting"
                                 f"{_closest(str(key), list(CONFIG_DEFAULTS))}; the settings are "
                                 f"{', '.join(CONFIG_DEFAULTS)}.")
        for name in self.environ:
            key = name.removeprefix(ENV_PREFIX).lower()
            if name.startswith(ENV_PREFIX) and key not in CONFIG_DEFAULTS:
                known = [ENV_PREFIX + k.upper() for k in CONFIG_DEFAULTS]
                raise UsageError(f"${name} is not a setting{_closest(name, known)}; unset it, or "
                                 f"use one of {', '.join(known)}.")


ENV_PREFIX = "INVOKE_IMAGEFORGE_"
# Settings that take lists as well as strings (stage_dirs(), parse_rewrites() check them).
LIST_SETTINGS = ("stage_dirs", "rewrite")


def _closest(word: str, choices: list[str]) -> str:
    found = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {found[0]}?)" if found else ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Flags:
    """The flags that make a command's Workspace, as given (None: not given)."""

    manifest: str | None = None
    overrides: Sequence[str] | None = None    # --set, in order
    locked: bool = False
    remote: str | None = None
    mirror: str | None = None
    layer_cache: str | None = None
    # --code DIR --program FILE: --set overrides of the stage that takes the user's code.
    code: str | None = None
    program: str | None = None


# ---- precedence and validation -------------------------------------------------------------

def workspace(config: Config, flags: Flags = Flags(), *,
             layer_cache: bool = False) -> Workspace:
    """The one place a flag, invoke's configuration and the defaults are weighed: a flag wins,
    then the configured value, then the default. `layer_cache`: the command keeps BuildKit's
    layer cache (build), so imageforge.layer_cache applies when --layer-cache is not given."""
    manifest = Path(flags.manifest or config.get("manifest") or DEFAULT_MANIFEST)
    if flags.mirror and "://" in flags.mirror and not re.match(r"(https?|file)://",
                                                               flags.mirror):
        # Anything else with a scheme would be read as a relative directory named "ftp:".
        raise UsageError(f"--mirror {flags.mirror}: give a directory mirror.sync wrote, or an "
                         "http(s):// or file:// URL serving one.")
    rewrites = parse_rewrites(config.value("rewrite"))
    registry = config.discover(stage_dirs(config.value("stage_dirs")))
    code, _ = code_overrides(flags.code, flags.program, None, registry)
    return Workspace(
        manifest=manifest,
        overrides=(*(flags.overrides or ()), *code),
        cache_dir=cache_dir(config),
        locked=flags.locked,
        remote=pick(flags.remote, config, "remote"),
        layer_cache=pick(flags.layer_cache, config, "layer_cache") if layer_cache else None,
        rewrites=rewrites,
        mirror=flags.mirror,
        registry=registry,
        image_store=image_artifacts(config) == "image-store",
        trust_verified=cache_trust(config) == "verified",
    )


def cache_dir(config: Config) -> Path:
    """imageforge.cache_dir, refused at once when it cannot be a cache (exit 9): a file or a
    symlink to nothing would otherwise read as an empty cache, and fail only on the first
    write, blamed on a path nobody named."""
    path = Path(config.get("cache_dir") or "cache")
    where = "imageforge.cache_dir (invoke.yaml or INVOKE_IMAGEFORGE_CACHE_DIR)"
    problem = None
    if path.is_symlink() and not path.exists():
        problem = f"is a symlink to {os.readlink(path)}, which does not exist"
    elif path.exists() and not path.is_dir():
        problem = "is not a directory"
    elif path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        problem = "is not writable by this user"
    if problem:
        raise CacheError(f"{where} = {path}: {problem}; point it at a directory imageforge "
                         "may write (it is created when missing).")
    return path


def ca_bundle(config: Config, flag: str | None) -> Path | None:
    """--ca-bundle, else imageforge.ca_bundle, else the environment's; a bad one is blamed on
    whichever gave it."""
    from imageforge.sources import cabundle

    if flag is not None:
        return cabundle.resolve(flag, "--ca-bundle")
    return cabundle.resolve(config.get("ca_bundle"),
                            "imageforge.ca_bundle (invoke.yaml or INVOKE_IMAGEFORGE_CA_BUNDLE)")


def cache_trust(config: Config) -> str:
    from imageforge.cache.verified import TRUST

    chosen = str(config.get("cache_trust") or TRUST[0])
    if chosen not in TRUST:
        raise UsageError(f"imageforge.cache_trust = {chosen!r}: give one of "
                         f"{', '.join(TRUST)} (invoke.yaml or INVOKE_IMAGEFORGE_CACHE_TRUST).")
    return chosen


def image_artifacts(config: Config) -> str:
    chosen = str(config.get("image_artifacts") or IMAGE_ARTIFACTS[0])
    if chosen not in IMAGE_ARTIFACTS:
        raise UsageError(f"imageforge.image_artifacts = {chosen!r}: give one of "
                         f"{', '.join(IMAGE_ARTIFACTS)} (invoke.yaml or "
                         "INVOKE_IMAGEFORGE_IMAGE_ARTIFACTS).")
    return chosen


def pick(flag: str | None, config: Config, key: str, env: str | None = None) -> str | None:
    """A flag's value, else the configured one (imageforge.`key`), else the environment
    variable `env`; None when none is set (an empty value is not set)."""
    return flag or config.get(key) or (config.environ.get(env) if env else None) or None


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


def bench_engine(value: str) -> Literal["own", "host"]:
    if value == "own":
        return "own"
    if value == "host":
        return "host"
    raise UsageError(f"--engine {value!r}: use `own` (the benchmark's own Docker engine) or "
                     "`host`.")


def progress_mode(value: str) -> Mode:
    for mode in PROGRESS:
        if value == mode:
            return mode
    raise UsageError(f"--progress {value}: use auto, plain or json.")


def ci_format(value: str) -> Format:
    from imageforge.image import cigen

    for fmt in cigen.FORMATS:
        if value == fmt:
            return fmt
    raise UsageError(f"--format {value}: use github or gitlab.")


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


def output_file(flag: str, path: str | None) -> Path | None:
    """The report file a flag names, refused before any work when it could not be written:
    a directory, a missing directory, or one this user cannot write to."""
    if not path:
        return None
    target = Path(path).resolve()
    if target.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file path.")
    if not target.parent.is_dir():
        raise UsageError(f"{flag} {path}: its directory {target.parent} does not exist; create "
                         "it or give another path.")
    writable = os.access(target, os.W_OK) if target.exists() else \
        os.access(target.parent, os.W_OK | os.X_OK)
    if not writable:
        raise UsageError(f"{flag} {path}: cannot write it (permission denied); give a file in a "
                         "directory you can write to.")
    return Path(path)


def _stdout_or_file(flag: str, path: str | None, text: str) -> str:
    """`text` written to the file `flag` names; what is left for standard output."""
    if path:
        write_output(flag, path, text)
        return ""
    return text


def _target(ws: Workspace, target: str | None) -> str:
    return target or project.default_target(ws)


def code_stage(registry: Mapping[str, Stage]) -> Stage:
    """The stage that takes the user's code (`Stage.takes_code`; the first, when several do):
    --code and --program set its `dir` and `program`."""
    for stage in registry.values():
        if stage.takes_code:
            return stage
    raise UsageError("--code: no stage takes training code (none sets takes_code); build "
                     "without --code and --program.")


def code_flags(code: str | None, program: str | None) -> tuple[str, str] | None:
    """--code and --program when both are given, None when neither is; one without the other
    is refused."""
    if code is None and program is None:
        return None
    if code is None or program is None:
        raise UsageError("--code and --program go together: --code names the directory of "
                         "the training code, --program the script in it SageMaker runs.")
    return code, program


def code_overrides(code: str | None, program: str | None, target: str | None,
                   registry: Mapping[str, Stage]) -> tuple[list[str], str | None]:
    """`--code DIR --program FILE` as --set overrides of the stage that takes the user's code,
    which they make the target when no target, or the image that stage builds on, is given."""
    given = code_flags(code, program)
    if given is None:
        return [], target
    stage = code_stage(registry)
    overrides = [f"stages.{stage.name}.dir={Path(given[0]).resolve()}",
                 f"stages.{stage.name}.program={given[1]}"]
    return overrides, stage.name if target in (None, stage.parent) else target


# ---- commands on one manifest --------------------------------------------------------------

def check(config: Config, flags: Flags) -> list[str]:
    s = workspace(config, flags)
    return [f"  {line}" for line in project.check(s)] + [f"{s.manifest}: valid"]


def show(config: Config, flags: Flags) -> str:
    from imageforge.model.manifest import show as show_manifest

    s = workspace(config, flags)
    return show_manifest(s.manifest, s.overrides, registry=s.registry)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanView:
    """`invoke plan`: the plan, the manifest as reports name it, and what waivers accept."""

    plan: Plan
    manifest: str
    verdict: Verdict

    def to_json(self) -> dict[str, Any]:
        document = self.plan.to_json(self.manifest)
        if self.verdict.accepted:
            document["waived"] = [accepted.to_json() for accepted in self.verdict.accepted]
        return document

    def table(self) -> str:
        planned = self.plan
        lines = [f"target {planned.target}  manifest {self.manifest}", *self.verdict.lines()]
        extended = planned.manifest.image.get("extends")
        if extended:
            lines.append(f"on {extended}, which already has: "
                         f"{', '.join(planned.manifest.image['provides'])}")
        lines.append(f"{'stage':<18} {'status':<7} {'version':<12} {'key':<19} deps")
        for st in planned.stages:
            version = str(st.inputs.get("version") or "-")
            lines.append(f"{st.name:<18} {st.status:<7} {version:<12} {st.key[:19]} "
                         f"{','.join(st.deps)}")
        lines += [f"not reproducible: {st.name}: {planned.registry[st.name].reproducible_reason}"
                  for st in planned.stages if not planned.registry[st.name].reproducible]
        return "\n".join(lines)


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
    return _stdout_or_file("--output", output, text)


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


# A tag as Docker's reference grammar has it.
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


def image_tag(flag: str, value: str) -> None:
    """Refuse an image reference Docker would refuse, before any work rather than after it."""
    if validate.problem("image", value) is not None:
        raise UsageError(f"{flag} {value[:80]!r}: not an image reference; give "
                         "[REGISTRY/]REPOSITORY[:TAG] in lower case, e.g. "
                         "registry.example.com/training:2026-12-05.")


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


def count(flag: str, value: str) -> int:
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses; and a few digits,
    # since no manifest has a million stages.
    if not (value.isascii() and value.isdigit() and len(value) <= 6):
        raise UsageError(f"--{flag} {escaped(value)}: give a number of stages, e.g. 2 "
                         "(0: none).")
    return int(value)


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatrixView:
    """`invoke matrix.plan`: what each image builds, and what the images share."""

    summary: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.summary

    def table(self) -> str:
        found = self.summary
        lines = [f"{image['image']}: {image['stages']} stages, builds "
                 f"{', '.join(image['builds']) or 'nothing'}"
                 + (f"; shares {', '.join(image['shared'])}" if image["shared"] else "")
                 for image in found["images"]]
        lines.append(f"{len(found['images'])} images, {found['stage_slots']} stage slots, "
                     f"{found['distinct_keys']} distinct keys, {found['keys_to_build']} to build")
        return "\n".join(lines)


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Output:
    """What a command prints to standard output and to standard error."""

    out: str
    err: str = ""


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

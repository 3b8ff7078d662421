"""A command's options: which value wins, and whether it is valid.

A flag wins, then invoke's configuration (the `imageforge` table of invoke.yaml, or an
INVOKE_IMAGEFORGE_* variable), then the environment, then the default: `workspace` and `pick`
weigh them. Every value is checked here, before any work, with the UsageError (exit 1) or
CacheError (exit 9) that names the flag or setting that gave it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from imageforge.app.workspace import DEFAULT_MANIFEST, Workspace
from imageforge.errors import CacheError, UsageError
from imageforge.model import validate
from imageforge.model.stage import Stage
from imageforge.sources.mirror import parse_rewrites
from imageforge.textsafe import escaped

if TYPE_CHECKING:
    from imageforge.buildkit.progress import Mode
    from imageforge.image.cigen import Format


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


# A tag as Docker's reference grammar has it.
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


def image_tag(flag: str, value: str) -> None:
    """Refuse an image reference Docker would refuse, before any work rather than after it."""
    if validate.problem("image", value) is not None:
        raise UsageError(f"{flag} {value[:80]!r}: not an image reference; give "
                         "[REGISTRY/]REPOSITORY[:TAG] in lower case, e.g. "
                         "registry.example.com/training:2026-12-05.")


def count(flag: str, value: str) -> int:
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses; and a few digits,
    # since no manifest has a million stages.
    if not (value.isascii() and value.isdigit() and len(value) <= 6):
        raise UsageError(f"--{flag} {escaped(value)}: give a number of stages, e.g. 2 "
                         "(0: none).")
    return int(value)

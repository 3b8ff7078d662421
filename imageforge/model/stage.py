"""What a stage module declares, and what the engine hands it when rendering.

A stage is data plus two pure functions: `sources(ctx)` lists what must be fetched on the
host, `recipe(ctx)` returns the Dockerfile instructions that follow its FROM and COPY lines.
Builder stages install into /out (a DESTDIR) so consumers copy only what the stage made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from imageforge.model.sourcetypes import GitSource, Source, UrlSource
from imageforge.model.validate import Kind

if TYPE_CHECKING:
    from imageforge.model.compat import Note, PinRule, Rule
    from imageforge.model.lockpin import LockPin

Inputs = Mapping[str, Any]
# What a check needs besides the image. "efa" means an EFA device; the instances that have
# one are GPU instances, so "efa" checks may use the GPU too.
Needs = Literal["none", "gpu", "efa"]

EXPORT_ROOT = "/out"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Field:
    """One key of a `[stages.<name>]` table."""

    kind: Kind
    help: str
    default: Any = None
    required: bool = False
    # Extra literal values accepted besides the pattern (e.g. "auto" for nccl.version).
    literals: tuple[str, ...] = ()
    # When set, the only values allowed.
    choices: tuple[str, ...] = ()
    # Values only the lock file fills in are not part of the manifest's required set.
    locked: bool = False
    # False for keys that steer resolution or verification (version policy, signing key),
    # not the build: changing them must not change the stage key and rebuild.
    keyed: bool = True
    # For a source's location (url, repo, ref): the key of the pin it resolves to (sha256,
    # commit). Once that pin is known, where the bytes came from is not part of the key, so a
    # mirror, or a ref naming the same commit, serves the same key.
    locates: str | None = None
    # An [image] key this field defaults to and must equal when given (python's version is
    # image.python: one Python per image).
    same_as: str | None = None
    # For a key added to a stage after artifacts were stored: at its default it stays out of
    # the key, so every stage key from before it existed still holds (nccl's provider).
    omit_default: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Context:
    """Everything a stage may read while rendering: the image settings and resolved inputs."""

    image: Inputs
    stages: Mapping[str, Inputs]

    def of(self, stage: str) -> Inputs:
        return self.stages[stage]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Check:
    """A smoke check run inside a built image: a bash script that exits 0 when healthy.

    Checks that need hardware run only under `invoke test-image --hardware` (on a real
    instance); elsewhere they are reported as skipped, never as passed."""

    name: str
    script: str
    needs: Needs = "none"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stage:
    """A stage module's declaration. `deps` are the true build dependencies."""

    name: str
    doc: str
    deps: tuple[str, ...]
    fields: Mapping[str, Field]
    # The deps for a manifest, given its stage tables, where a setting decides them (a wheel
    # torch needs no NCCL built first); `deps` must hold every one it can return.
    deps_for: Callable[[Mapping[str, Inputs]], tuple[str, ...]] | None = None
    recipe: Callable[[Context], str]
    # Stage this one is built FROM; None means the manifest's base image itself.
    parent: str | None = "base"
    sources: Callable[[Context], Sequence[Source]] = lambda _ctx: ()
    # Paths other stages copy out of this one; EXPORT_ROOT is copied onto "/".
    exports: tuple[str, ...] = (EXPORT_ROOT,)
    # Path-like variables this stage adds to images that contain it (PATH, LD_LIBRARY_PATH).
    env_paths: Callable[[Context], Mapping[str, Sequence[str]]] = lambda _ctx: {}
    # Plain variables this stage sets in images that contain it.
    env: Callable[[Context], Mapping[str, str]] = lambda _ctx: {}
    # True for stages that are whole images (efa-nccl, smddp): they get the image env.
    image: bool = False
    # BuildKit layer cache export for this stage (with --layer-cache): "max" keeps every
    # intermediate layer (worth it before a long compile), "min" only the result.
    layer_cache: Literal["min", "max"] = "min"
    # Smoke checks run by `invoke test-image` in any image that contains this stage.
    checks: Callable[[Context], Sequence[Check]] = lambda _ctx: ()
    # False for stages the lock has nothing to resolve for: their tables stay out of the
    # manifest digest, so editing them never makes the lock stale.
    locked: bool = True
    # Directories of the build host handed to BuildKit as named contexts (the user's code):
    # context name -> (path, sha256 of the tree). The digest must be among the stage's inputs.
    local_dirs: Callable[[Context], Mapping[str, tuple[str, str]]] = lambda _ctx: {}
    # True for the stage that adds the user's training code on top of its parent image:
    # `invoke build --code DIR --program FILE` sets its `dir` and `program` fields, and builds
    # it instead of no target or that parent.
    takes_code: bool = False
    # The PyPI project whose releases `lock --upgrade` reads, for a stage pip installs by
    # name (no URL or git ref to list).
    pypi_project: str | None = None
    # For a stage that installs a project's wheels from an index chosen in its table (pytorch
    # with provider = "wheel"): (index URL, project), whose releases `lock --upgrade` reads.
    wheel_index: Callable[[Context], tuple[str, str] | None] = lambda _ctx: None
    # The pip requirements this stage installs, as written: `invoke lock` resolves them with
    # their dependencies to exact versions and hashes (imageforge.sources.piplock).
    pip_requirements: Callable[[Context], Sequence[str]] = lambda _ctx: ()
    # True for a stage an extended image already has: only its settings remain.
    provided: bool = False
    # Plan-time preparation of this stage's table, given the table and the manifest's path,
    # before anything is keyed: e.g. the code stage makes its directory absolute and adds the
    # digest of its content.
    prepare: Callable[[Mapping[str, Any], Path], Mapping[str, Any]] | None = None
    # For an image stage: the default tag of its golden image (`invoke nightly`), with the
    # fields of golden.template_variables, e.g. "{name}:efa{efa}-nccl{nccl}-{date}".
    tag_template: str | None = None
    # Choices worth a warning whenever this stage is planned (a key baked into an image).
    warnings: Callable[[Context], Sequence[str]] = lambda _ctx: ()
    # Pins this stage resolves at lock time from other stages' pins (imageforge.model.lockpin),
    # e.g. the NCCL that PyTorch's commit pins.
    lock_pins: tuple[LockPin, ...] = ()
    # Compatibility rules of this stage (imageforge.model.compat), each with its id, the function
    # that judges a manifest and the data file beside the module (source, fix hint, version
    # tables); notes are findings `invoke check` prints that are nothing to waive.
    rules: tuple[Rule | PinRule | Note, ...] = ()
    # False for a stage whose artifact cannot be made byte-identical across builds of one key,
    # with the reason: plans and build reports show it, and `invoke verify --rebuild` reports
    # its differences without failing. Every other stage is held to it by that rebuild.
    reproducible: bool = True
    reproducible_reason: str = ""


def chosen_deps(stages: Mapping[str, Stage],
                tables: Mapping[str, Inputs]) -> Mapping[str, Stage]:
    """`stages`, each with the deps its `deps_for` picks for a manifest's stage tables; the
    same object when none changes (closures are remembered per registry object)."""
    chosen = {name: stage.deps_for(tables) for name, stage in stages.items()
              if stage.deps_for is not None}
    changed = {name: deps for name, deps in chosen.items() if deps != stages[name].deps}
    if not changed:
        return stages
    return {name: dataclasses.replace(stage, deps=changed[name]) if name in changed else stage
            for name, stage in stages.items()}


def url_source(stage: str, inputs: Inputs, *, suffix: str = "") -> UrlSource:
    """The single-file source of a stage whose manifest table has url/sha256."""
    url = str(inputs["url"])
    return UrlSource(
        name=f"src-{stage}{suffix}",
        url=url,
        sha256=inputs.get("sha256"),
        filename=filename_of(url),
    )


def git_source(stage: str, inputs: Inputs, *,
               submodules: tuple[str, ...] | bool = False) -> GitSource:
    return GitSource(
        name=f"src-{stage}",
        repo=str(inputs["repo"]),
        ref=str(inputs["ref"]),
        commit=inputs.get("commit"),
        submodules=submodules,
    )


def filename_of(url: str) -> str:
    """The file name a URL is saved under: its last path segment, or the one before a
    trailing `/download` (sourceforge-style links)."""
    path = url.split("?", 1)[0].split("#", 1)[0]
    parts = [p for p in path.split("/") if p]
    if len(parts) > 1 and parts[-1] == "download":
        return parts[-2]
    return parts[-1]


POLICY = Field(kind="specifier", keyed=False,
               help="versions `invoke lock --upgrade` may move to, e.g. ~=1.14 (none: keep)")


def keyed_inputs(stage: Stage, inputs: Inputs) -> dict[str, Any]:
    """The inputs that are part of the stage key (see Field.keyed and Field.locates)."""
    def keyed(key: str) -> bool:
        field = stage.fields.get(key)
        if field is None:
            return True
        if field.omit_default and inputs.get(key) == field.default:
            return False
        return field.keyed and not (field.locates and inputs.get(field.locates))

    return {k: v for k, v in inputs.items() if keyed(k)}


def git_fields(*, repo: str, ref: str, what: str) -> dict[str, Field]:
    """The keys every stage built from a git repository has."""
    return {
        "version": Field(kind="version", required=True, help=f"{what} version to build"),
        "repo": Field(kind="repo", default=repo, locates="commit",
                      help=f"git URL (or mirror path) of {what}"),
        "ref": Field(kind="ref", default=ref, locates="commit",
                     help="tag or branch; `{version}` is substituted"),
        "commit": Field(kind="commit", locked=True, help="commit SHA the ref resolved to (lock)"),
        "policy": POLICY,
    }


def url_fields(*, url: str, what: str) -> dict[str, Field]:
    """The keys every stage built from one downloaded file has."""
    return {
        "version": Field(kind="version", required=True, help=f"{what} version"),
        "url": Field(kind="url", default=url or None, required=not url, locates="sha256",
                     help="download URL; `{version}` is substituted"),
        "sha256": Field(kind="sha256", locked=True, help="sha256 of the file (lock)"),
        "policy": POLICY,
    }

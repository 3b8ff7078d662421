"""Compatibility rules: version combinations that are known not to work.

A rule is a hook of the stage it constrains (`Stage.rules`): its id, the function that judges
a manifest, and the data file beside the stage module with the rule's source, fix hint and
version tables (e.g. stages/efa_rules.toml). This module is the machinery and knows no stage:
`check` runs every rule of every stage in the registry it is given and returns every
violation, so a manifest is fixed in one pass rather than one error at a time. Rules only
judge versions their data knows: an EFA installer missing from its table is not guessed at.

A rule that judges one of the lock's pins (`PinRule`, e.g. the nccl stage's rule on the NCCL
that PyTorch pins) runs only when the lock records that pin for the manifest.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imageforge.errors import ManifestError
from imageforge.model.manifest import Manifest
from imageforge.model.stage import Stage

NUMERIC = re.compile(r"\d+(?:\.\d+)*")
CUDA_BASE = re.compile(r"(?:^|/)nvidia/cuda:(\d+)\.(\d+)(?:\.\d+)*-")

Registry = Mapping[str, Stage]
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Violation:
    """One broken rule: `key` is the manifest key to change."""

    rule: str
    key: str
    message: str
    source: str
    fix: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Citation:
    """A rule's `[rules.<id>]` entry in its data file: the source of its fact and its fix hint
    (`{name}` filled in per finding); its description there is for readers."""

    id: str
    source: str
    fix: str
    # The older spelling of this rule's waiver, "stages.<stage>.<key>": that key's value is a
    # reason, as `[waive] <id> = "..."` gives one.
    alias: str | None = None

    def violation(self, key: str, message: str, **fix: str) -> Violation:
        return Violation(self.id, key, message, self.source, self.fix.format(**fix))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rule:
    """A compatibility rule a stage declares: `judge` returns its violations in a manifest
    (given the rule and the registry, where other stages' facts are); `data` is the file
    beside the stage module with the rule's citation and version tables."""

    id: str
    judge: Callable[[Manifest, Rule, Registry], list[Violation]]
    data: Path

    def violation(self, key: str, message: str, **fix: str) -> Violation:
        return citation(self).violation(key, message, **fix)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PinRule:
    """A compatibility rule on one of the lock's pins (imageforge.model.lockpin): `judge` gets the
    pin recorded under `entry`, and is not asked while the lock has none."""

    id: str
    entry: str
    judge: Callable[[Manifest, PinRule, Mapping[str, Any]], list[Violation]]
    data: Path

    def violation(self, key: str, message: str, **fix: str) -> Violation:
        return citation(self).violation(key, message, **fix)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Note:
    """A finding worth a line in `invoke check` that is not a violation (nothing to waive),
    declared by a stage like a rule: `data` holds the facts `judge` reads."""

    judge: Callable[[Manifest, Note, Registry], list[str]]
    data: Path


@dataclasses.dataclass(frozen=True, kw_only=True)
class Data:
    """The `[rules.<id>]` entries of a data file."""

    rules: Mapping[str, Citation]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Floor:
    """A minimum version that holds for a range of another component's releases."""

    over: SpecifierSet
    minimum: Version


def check(manifest: Manifest, *, registry: Registry,
          pins: Mapping[str, Mapping[str, Any]] | None = None) -> list[Violation]:
    """Every violated rule of `manifest`, in registry order, then every violated rule on the
    lock's `pins` (entry -> pin) in registry order."""
    found = rules(registry)
    pinned = pin_rules(registry)
    for rule in _every(registry):
        # Every data file is read before any rule judges, and each judge reads its tables
        # first: a broken file fails whatever the manifest is.
        citation(rule)
    recorded = pins or {}
    return [violation for rule in found for violation in rule.judge(manifest, rule, registry)] + [
        violation for pin_rule in pinned if pin_rule.entry in recorded
        for violation in pin_rule.judge(manifest, pin_rule, recorded[pin_rule.entry])]


def rules(registry: Registry) -> list[Rule]:
    """Every rule of every stage, in registry order."""
    return [rule for stage in registry.values() for rule in stage.rules if isinstance(rule, Rule)]


def pin_rules(registry: Registry) -> list[PinRule]:
    """Every rule on a lock pin, of every stage, in registry order."""
    return [rule for stage in registry.values() for rule in stage.rules
            if isinstance(rule, PinRule)]


def _every(registry: Registry) -> list[Rule | PinRule]:
    return [*rules(registry), *pin_rules(registry)]


def unjudged(registry: Registry, pins: Mapping[str, Mapping[str, Any]] | None) -> set[str]:
    """The ids of the rules on a lock pin that `pins` lacks: nothing can be said about them."""
    return {rule.id for rule in pin_rules(registry) if rule.entry not in (pins or {})}


def rule_ids(*, registry: Registry) -> list[str]:
    """The id of every rule, as a manifest names it in [waive]."""
    return [rule.id for rule in _every(registry)]


def aliases(*, registry: Registry) -> dict[str, str]:
    """rule id -> the older spelling of its waiver, for the rules that have one."""
    cited = [citation(rule) for rule in _every(registry)]
    return {found.id: found.alias for found in cited if found.alias}


def citation(rule: Rule | PinRule) -> Citation:
    """The rule's entry in its data file."""
    found = _load(rule.data).rules.get(rule.id)
    if found is None:
        raise _unusable(rule.data, KeyError(f"rules.{rule.id}"))
    return found


def notes(manifest: Manifest, *, registry: Registry) -> list[str]:
    """Findings worth a line in `invoke check` that are not violations."""
    return [line for stage in registry.values() for note in stage.rules
            if isinstance(note, Note) for line in note.judge(manifest, note, registry)]


def format_violations(violations: Sequence[Violation], *, manifest: Path) -> str:
    """The report `invoke check` prints: one block per violation with its fix and source."""
    if not violations:
        return f"{manifest}: no compatibility problems."
    lines = [f"{manifest}: {len(violations)} compatibility problem(s):"]
    for found in violations:
        lines += [f"  [{found.rule}] {found.key}: {found.message}",
                  f"      fix: {found.fix}.",
                  f"      source: {found.source}"]
    return "\n".join(lines)


# ---- helpers for the rules of stages -----------------------------------------------------------


def numeric(version: object) -> Version | None:
    """The numeric part of a version ("1.1.3-aws" -> 1.1.3), or None when it has none."""
    match = NUMERIC.match(str(version)) if version is not None else None
    return Version(match.group()) if match else None


def stage_version(manifest: Manifest, stage: str) -> Version | None:
    values = manifest.stages.get(stage)
    return numeric(values.get("version")) if values else None


def image_cuda(manifest: Manifest) -> Version | None:
    """The image's CUDA as major.minor: image.cuda, else the nvidia/cuda base image tag's."""
    declared = numeric(manifest.image.get("cuda"))
    if declared is not None:
        return Version(minor(declared))
    match = CUDA_BASE.search(str(manifest.image["base"]))
    return Version(f"{match[1]}.{match[2]}") if match else None


def minor(version: Version) -> str:
    return f"{version.major}.{version.minor}"


def floor(floors: Sequence[Floor], version: Version | None) -> Version | None:
    """The minimum that holds for `version`; None when no range has it (or it is unknown)."""
    if version is None:
        return None
    return next((f.minimum for f in floors if f.over.contains(version)), None)


def floors(rows: Sequence[Mapping[str, str]], *, over: str) -> list[Floor]:
    """Data rows `{<over> = "<specifier set>", minimum = "<version>"}`, parsed."""
    return [Floor(over=SpecifierSet(row[over]), minimum=Version(row["minimum"])) for row in rows]


def data_of(registry: Registry, stage: str) -> Path | None:
    """The data file of `stage`'s rules in `registry` (None: no such stage, or no rules): how
    a rule reads facts that another stage keeps."""
    found = registry.get(stage)
    return found.rules[0].data if found is not None and found.rules else None


# ---- loading the data -----------------------------------------------------------------------


def read(path: Path, parse: Callable[[Mapping[str, Any]], T]) -> T:
    """The data file at `path`, parsed by `parse` (once per file and parser). A file or value
    that is unusable is a ManifestError naming the file."""
    parsed: T = _read(path, parse)
    return parsed


@functools.cache
def _read(path: Path, parse: Callable[[Mapping[str, Any]], Any]) -> Any:
    try:
        return parse(tomllib.loads(path.read_text(encoding="utf-8")))
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise _unusable(path, exc) from None


def _unusable(path: Path, exc: Exception) -> ManifestError:
    return ManifestError(f"{path}: unusable compatibility data ({type(exc).__name__}: {exc}); "
                         "fix that entry or restore the file from git.")


def _load(path: Path) -> Data:
    return read(path, _parse)


def _parse(raw: Mapping[str, Any]) -> Data:
    return Data(rules={rid: Citation(id=rid, source=str(r["source"]), fix=str(r["fix"]),
                                     alias=str(r["alias"]) if "alias" in r else None)
                       for rid, r in raw["rules"].items()})

"""Compatibility data in tests: each rule's raw `[rules.<id>]` entry, and a registry whose
stage reads a changed copy of its data file (the registry is what the rules are given, so a
changed table reaches every rule that reads it, the other stages' rules included)."""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from imageforge.model import compat
from imageforge.model.manifest import Manifest
from imageforge.model.stage import Stage
from stages import STAGES, nccl_pytorch_pin, nccl_rules
from stages.ncclpin import NcclPin


def data_file(stage: str) -> Path:
    """The data file of an imageforge stage's rules."""
    path = compat.data_of(STAGES, stage)
    assert path is not None, stage
    return path


def cited(rule: str) -> Mapping[str, Any]:
    """The raw `[rules.<rule>]` entry of a rule (description, source, fix)."""
    every: list[compat.Rule | compat.PinRule] = [*compat.rules(STAGES), *compat.pin_rules(STAGES)]
    paths = {r.id: r.data for r in every}
    raw = tomllib.loads(paths[rule].read_text(encoding="utf-8"))
    entry: Mapping[str, Any] = raw["rules"][rule]
    return entry


def with_data(registry: Mapping[str, Stage], stage: str, path: Path) -> dict[str, Stage]:
    """`registry` with `stage`'s rules reading `path` instead of their data file."""
    found = registry[stage]
    rules = tuple(dataclasses.replace(rule, data=path) for rule in found.rules)
    return {**registry, stage: dataclasses.replace(found, rules=rules)}


def changed(tmp_path: Path, stage: str, old: str, new: str, *,
            name: str | None = None) -> dict[str, Stage]:
    """The registry with `stage`'s data file copied to `tmp_path` (as `name`, else under its
    own name), `old` (which must be there) replaced by `new`."""
    source = data_file(stage)
    text = source.read_text(encoding="utf-8")
    assert old in text, old
    path = tmp_path / (name or source.name)
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return with_data(STAGES, stage, path)


def pins_of(pin: NcclPin | None) -> dict[str, Mapping[str, Any]]:
    """The lock pins (entry -> pin) that record `pin` as the NCCL PyTorch pins."""
    return {} if pin is None else {nccl_pytorch_pin.ENTRY: dataclasses.asdict(pin)}


def nccl_pin_rule(manifest: Manifest, pin: NcclPin | None) -> list[compat.Violation]:
    """The nccl stage's rule on PyTorch's NCCL pin, alone, as the rules judge it."""
    return compat.check(manifest, registry={"nccl": STAGES["nccl"]}, pins=pins_of(pin))


def pin_origin(pin: NcclPin) -> str:
    return nccl_rules.pin_origin(dataclasses.asdict(pin))

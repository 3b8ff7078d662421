"""The nccl stage's compatibility rule: an explicit NCCL version should be the one the pinned
PyTorch commit pins, unless the manifest says why not. It judges the lock's pin
(stages/nccl_pytorch_pin.py), so only a manifest whose lock records that pin is judged; the
rule's source and fix are data in stages/nccl_rules.toml."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from imageforge.stageapi import Manifest, PinRule, Violation, numeric
from stages.nccl_pytorch_pin import ENTRY

DATA = Path(__file__).with_name("nccl_rules.toml")


def nccl_pytorch_pin(manifest: Manifest, rule: PinRule, pin: Mapping[str, Any]
                     ) -> list[Violation]:
    """An explicit NCCL version that is not the one PyTorch pins."""
    nccl = manifest.stages.get("nccl")
    if nccl is None:
        return []
    version = str(nccl["version"])
    if version == "auto" or numeric(version) == numeric(pin["version"]):
        return []
    return [rule.violation(
        "stages.nccl.version",
        f"stages.nccl.version {version} differs from NCCL {pin['version']}, which "
        f"{_pytorch_name(manifest)} pins ({pin_origin(pin)}).",
        pinned=pin["version"], version=version)]


def pin_origin(pin: Mapping[str, Any]) -> str:
    """Where PyTorch's NCCL pin was read, e.g. "submodule third_party/nccl/nccl at 1a2b3c4d5e6f"."""
    evidence = pin.get("evidence", {})
    if evidence.get("method") == "wheel":
        return f"{evidence.get('wheel')} requires {evidence.get('requires')}"
    if evidence.get("method") == "submodule":
        return f"submodule {evidence.get('path')} at {str(pin['commit'])[:12]}"
    return f"{evidence.get('path')}: {evidence.get('pin')}"


def _pytorch_name(manifest: Manifest) -> str:
    torch = manifest.stages.get("pytorch")
    return f"PyTorch {torch['version']}" if torch else "PyTorch"


RULES = (PinRule(id="nccl-pytorch-pin", entry=ENTRY, judge=nccl_pytorch_pin, data=DATA),)

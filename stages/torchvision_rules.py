"""The torchvision stage's compatibility rules: each torchvision minor release is built for one
PyTorch minor release, for the torchvision stage and for torchvision and torchaudio wheels
installed beside a torch wheel (`[stages.pytorch] packages`). The tables and the rules'
sources are data in stages/torchvision_rules.toml."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from imageforge.stageapi import (
    Manifest,
    Registry,
    Rule,
    Violation,
    minor,
    numeric,
    read,
    stage_version,
)

DATA = Path(__file__).with_name("torchvision_rules.toml")


def _parse(raw: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw["torchvision"].items()}


def _parse_audio(raw: Mapping[str, Any]) -> Version:
    return Version(str(raw["torchaudio"]["last"]))


def built_for(path: Path = DATA) -> Mapping[str, str]:
    """torchvision major.minor -> the PyTorch major.minor it is built for."""
    return read(path, _parse)


def last_torchaudio(path: Path = DATA) -> Version:
    """The last torchaudio release's major.minor (torchaudio's versions are PyTorch's)."""
    return read(path, _parse_audio)


def _torchvision_pytorch(manifest: Manifest, rule: Rule, _registry: Registry) -> list[Violation]:
    table = built_for(rule.data)
    vision = stage_version(manifest, "torchvision")
    torch = stage_version(manifest, "pytorch")
    if vision is None or torch is None:
        return []
    made_for = table.get(minor(vision))
    wanted = {pt: tv for tv, pt in table.items()}.get(minor(torch))
    if made_for == minor(torch) or (made_for is None and wanted is None):
        return []
    name = manifest.stages["torchvision"]["version"]
    pytorch = manifest.stages["pytorch"]["version"]
    if made_for is not None:
        message = (f"torchvision {name} is built for PyTorch {made_for}, but "
                   f"stages.pytorch.version is {pytorch}.")
    else:
        message = f"torchvision {name} is not the release for PyTorch {pytorch} ({wanted}.x is)."
    action = (f"use torchvision {wanted}.x with PyTorch {minor(torch)}" if wanted else
              f"use the torchvision release for PyTorch {minor(torch)}, or PyTorch "
              f"{made_for} with torchvision {name}")
    return [rule.violation("stages.torchvision.version", message, action=action)]


def _pinned(text: object) -> tuple[str, str] | None:
    """(canonical name, version) of a `name==version` requirement; None for anything else
    (a malformed one is named by the manifest's own validation and the lock)."""
    try:
        requirement = Requirement(str(text))
    except InvalidRequirement:
        return None
    exact = [s.version for s in requirement.specifier if s.operator == "=="]
    return (canonicalize_name(requirement.name), exact[0]) if exact else None


def _vision_wheel(table: Mapping[str, str], version: str, torch: Version) -> str | None:
    """What is wrong with torchvision `version` beside torch, or None."""
    made_for = table.get(minor(numeric(version) or Version("0")))
    wanted = {pt: tv for tv, pt in table.items()}.get(minor(torch))
    if made_for == minor(torch) or (made_for is None and wanted is None):
        return None
    if made_for is not None:
        return f"torchvision {version} is built for PyTorch {made_for}" + (
            f"; use torchvision {wanted}.x with PyTorch {minor(torch)}" if wanted else "")
    return f"torchvision {version} is not the release for PyTorch {minor(torch)} ({wanted}.x is)"


def _audio_wheel(last: Version, version: str, torch: Version) -> str | None:
    """What is wrong with torchaudio `version` beside torch, or None."""
    made_for = minor(numeric(version) or Version("0"))
    if made_for == minor(torch):
        return None
    if torch > Version(f"{last.major}.{last.minor}.999999"):
        return (f"torchaudio {version} is made for PyTorch {made_for}, and torchaudio has no "
                f"release for PyTorch {minor(torch)} (its last is {last}); drop it")
    return f"torchaudio {version} is made for PyTorch {made_for}; use torchaudio {minor(torch)}.x"


def _torch_wheel_companions(manifest: Manifest, rule: Rule,
                            _registry: Registry) -> list[Violation]:
    values = manifest.stages.get("pytorch") or {}
    torch = numeric(values.get("version"))
    if values.get("provider") != "wheel" or torch is None:
        return []
    table, last = built_for(rule.data), last_torchaudio(rule.data)
    found = []
    for text in values.get("packages") or ():
        pinned = _pinned(text)
        if pinned is None:
            continue
        name, version = pinned
        wrong = (_vision_wheel(table, version, torch) if name == "torchvision" else
                 _audio_wheel(last, version, torch) if name == "torchaudio" else None)
        if wrong:
            found.append(rule.violation(
                "stages.pytorch.packages",
                f"{text} is not paired with torch {values['version']} "
                f"(stages.pytorch.version).",
                action=wrong))
    return found


RULES = (Rule(id="torchvision-pytorch", judge=_torchvision_pytorch, data=DATA),
         Rule(id="torch-wheel-companions", judge=_torch_wheel_companions, data=DATA))

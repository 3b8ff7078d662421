"""The torchvision stage's compatibility rule: each torchvision minor release is built for one
PyTorch minor release. The table and the rule's source are data in
stages/torchvision_rules.toml."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from imageforge.model.manifest import Manifest
from imageforge.planning.compat import Registry, Rule, Violation, minor, read, stage_version

DATA = Path(__file__).with_name("torchvision_rules.toml")


def _parse(raw: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw["torchvision"].items()}


def built_for(path: Path = DATA) -> Mapping[str, str]:
    """torchvision major.minor -> the PyTorch major.minor it is built for."""
    return read(path, _parse)


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


RULES = (Rule(id="torchvision-pytorch", judge=_torchvision_pytorch, data=DATA),)

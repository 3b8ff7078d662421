"""What each stage of a manifest is given: its table, or its defaults where it has none, with
the values that follow the [image] table; and which image targets a manifest defines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from imageforge.errors import LockError, ManifestError
from imageforge.model.dag import closure
from imageforge.model.manifest import Manifest
from imageforge.model.stage import Stage


def defined_targets(manifest: Manifest, registry: Mapping[str, Stage]) -> list[str]:
    """Image targets whose every stage the manifest defines (or needs no table for)."""
    def defined(name: str) -> bool:
        fields = registry[name].fields.values()
        return manifest.has_stage(name) or not any(f.required for f in fields)

    return [name for name, stage in registry.items()
            if stage.image and all(defined(n) for n in closure(name, registry))]


def stage_inputs(manifest: Manifest, stage: Stage, target: str) -> dict[str, Any]:
    """The manifest's values for `stage`, or its defaults when it has no table."""
    if manifest.has_stage(stage.name):
        values = dict(manifest.stages[stage.name])
    else:
        missing = [k for k, f in stage.fields.items() if f.required]
        if missing:
            raise ManifestError(
                f"{manifest.path}: target {target!r} needs stage {stage.name!r}, which has no "
                f"[stages.{stage.name}] table; add one with at least: {', '.join(missing)}.")
        values = {k: f.default for k, f in stage.fields.items()}
    for key, field in stage.fields.items():
        if field.same_as and not values.get(key):
            values[key] = manifest.image[field.same_as]
    if values.get("version") == "auto":
        raise LockError(f"{manifest.path}: stages.{stage.name}.version = \"auto\" must be "
                        "resolved first; run `invoke lock`.")
    return values

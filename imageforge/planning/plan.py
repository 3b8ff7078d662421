"""manifest -> resolved inputs -> ordered stages with keys. Pure: no Docker, no network.

The key of a stage is sha256 over a canonical JSON of exactly: its name, its rendered recipe
text, its resolved inputs, the base image reference and digest, the platform and the keys
of its dependencies (shared/DESIGN.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from imageforge.errors import ManifestError
from imageforge.model.dag import closure, direct_deps
from imageforge.model.inputs import stage_inputs
from imageforge.model.manifest import Manifest
from imageforge.model.sourcetypes import Source
from imageforge.model.stage import Context, Stage, chosen_deps, keyed_inputs
from imageforge.planning.artifact import exports_block, full_artifact_stages
from imageforge.planning.render import Memo, render_stage

Status = Literal["cached", "remote", "build"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannedStage:
    name: str
    deps: tuple[str, ...]
    key: str
    inputs: Mapping[str, Any]
    recipe: str
    sources: tuple[Source, ...]
    # Host directories handed to BuildKit: context name -> (path, tree digest).
    local_dirs: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    status: Status = "build"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    target: str
    manifest: Manifest
    stages: tuple[PlannedStage, ...]
    context: Context
    # The stage graph the plan was made from (without what an extended image provides).
    registry: Mapping[str, Stage]

    def stage(self, name: str) -> PlannedStage:
        return next(s for s in self.stages if s.name == name)

    @property
    def key(self) -> str:
        return self.stage(self.target).key

    def warnings(self) -> list[str]:
        return [w for s in self.stages for w in self.registry[s.name].warnings(self.context)]

    def sources(self) -> list[Source]:
        return [src for stage in self.stages for src in stage.sources]

    @property
    def not_reproducible(self) -> dict[str, str]:
        """The stages of this plan declared not reproducible, with their reasons."""
        return {s.name: self.registry[s.name].reproducible_reason for s in self.stages
                if not self.registry[s.name].reproducible}

    def to_json(self, manifest_label: str) -> dict[str, Any]:
        extended = self.manifest.image.get("extends")
        return {
            "target": self.target,
            "manifest": manifest_label,
            **({"extends": {"ref": extended, "provides": list(self.manifest.image["provides"])}}
               if extended else {}),
            "stages": [
                {"name": s.name, "deps": list(s.deps), "key": s.key, "status": s.status,
                 "inputs": dict(s.inputs)}
                for s in self.stages
            ],
            # Only when a stage declares it: each stage's object keeps DESIGN.md's shape.
            **({"not_reproducible": self.not_reproducible} if self.not_reproducible else {}),
        }


def make_plan(manifest: Manifest, target: str, registry: Mapping[str, Stage],
              statuses: Mapping[str, Status] | None = None) -> Plan:
    if target in registry and registry[target].provided:
        raise ManifestError(f"{manifest.path}: --target {target}: image.extends = "
                            f"{manifest.image['extends']!r} already has it; build a stage it "
                            "lacks, or use that image as it is.")
    registry = chosen_deps(registry, manifest.stages)
    names = closure(target, registry)
    inputs = {name: stage_inputs(manifest, registry[name], target) for name in names}
    # Recipes may read the settings of a stage outside this graph (pytorch reads python's
    # provider when an extended image has python): its table, else its defaults.
    settings = {name: dict(manifest.stages[name]) if manifest.has_stage(name) else
                {key: field.default for key, field in stage.fields.items()}
                for name, stage in registry.items() if name not in inputs}
    context = Context(image=manifest.image, stages={**settings, **inputs})
    keys: dict[str, str] = {}
    planned: list[PlannedStage] = []
    memo = Memo(context, registry)
    full = full_artifact_stages(registry)
    for name in names:
        stage = registry[name]
        recipe = render_stage(stage, context, registry, memo)
        deps = direct_deps(stage)
        # The recipe rendered for the stage: its block, and its artifact's when that is made
        # by text of its own (its exports).
        keyed = recipe if name in full else recipe + exports_block(name, stage.exports)
        keys[name] = stage_key(
            name=name, recipe=keyed, inputs=keyed_inputs(stage, inputs[name]), manifest=manifest,
            dep_keys={d: keys[d] for d in deps},
        )
        planned.append(PlannedStage(
            name=name, deps=deps, key=keys[name], inputs=inputs[name], recipe=recipe,
            sources=tuple(stage.sources(context)),
            local_dirs=dict(stage.local_dirs(context)),
            status=(statuses or {}).get(keys[name], "build"),
        ))
    return Plan(target=target, manifest=manifest, stages=tuple(planned), context=context,
                registry=registry)


def stage_key(*, name: str, recipe: str, inputs: Mapping[str, Any], manifest: Manifest,
              dep_keys: Mapping[str, str]) -> str:
    document = {
        "stage": name,
        "recipe": recipe,
        "inputs": inputs,
        "base": {"ref": manifest.image["base"], "digest": manifest.image.get("base_digest"),
                 # A local image's ID, only when there is one: other keys stay as they were.
                 **({"id": manifest.image["base_image_id"]}
                    if manifest.image.get("base_image_id") else {})},
        "platform": manifest.image["platform"],
        "deps": dict(sorted(dep_keys.items())),
    }
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()

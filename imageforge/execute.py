"""What one build run does: which stages BuildKit must build, which come from the artifact
cache, the Dockerfile and the bake file that say so."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from imageforge.plan import Plan
from imageforge.render import render_dockerfile
from imageforge.stage import Stage

FINAL = "imageforge-image"
ARTIFACT_PREFIX = "imageforge-artifact-"


def full_artifact_stages(registry: Mapping[str, Stage]) -> set[str]:
    """Stages whose artifact must be the whole image: those others are built FROM, and
    images. Every other stage's artifact holds only its exports (a FROM scratch image)."""
    return {s.parent for s in registry.values() if s.parent} | {
        name for name, s in registry.items() if s.image}


def to_build(plan: Plan) -> list[str]:
    """The stages BuildKit must build: the target unless cached, and recursively every
    dependency of a stage being built that no cache holds. Plan order."""
    available = {s.name for s in plan.stages if s.status in ("cached", "remote")}
    needed: set[str] = set()

    def need(name: str) -> None:
        if name in available or name in needed:
            return
        needed.add(name)
        for dep in plan.stage(name).deps:
            need(dep)

    need(plan.target)
    return [s.name for s in plan.stages if s.name in needed]


def reused(plan: Plan, building: list[str]) -> list[str]:
    """Cached stages this run reads: dependencies of built stages, or the target itself."""
    used = {dep for name in building for dep in plan.stage(name).deps}
    if plan.target not in building:
        used.add(plan.target)
    return [s.name for s in plan.stages if s.name in used and s.name not in building]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """One build run: the Dockerfile text, the contexts and the bake targets."""

    dockerfile: str
    contexts: Mapping[str, str]
    artifact_targets: Mapping[str, str]   # stage -> Dockerfile target to export


def make_run(plan: Plan, registry: Mapping[str, Stage], building: list[str],
             contexts: Mapping[str, str]) -> Run:
    full = full_artifact_stages(registry)
    blocks = [(name, plan.stage(name).recipe) for name in building]
    artifact_targets: dict[str, str] = {}
    for name in building:
        if name in full:
            artifact_targets[name] = name
            continue
        lines = [f"FROM scratch AS {ARTIFACT_PREFIX}{name}"]
        lines += [f"COPY --from={name} {path} {path}" for path in registry[name].exports]
        blocks.append((f"artifact of {name}", "\n".join(lines) + "\n"))
        artifact_targets[name] = ARTIFACT_PREFIX + name
    blocks.append(("image", f"FROM {plan.target} AS {FINAL}\n"))
    text = render_dockerfile(blocks, manifest=str(plan.manifest.path), target=plan.target)
    return Run(dockerfile=text, contexts=dict(contexts), artifact_targets=artifact_targets)


def bake_file(run: Run, *, workdir: Path, tag: str, labels: Mapping[str, str], platform: str,
              push: bool, artifact_dirs: Mapping[str, Path]) -> dict[str, Any]:
    """A docker-bake.json building the image and exporting every new artifact in one go."""
    common = {
        "context": str(workdir / "context"),
        "dockerfile": str(workdir / "Dockerfile"),
        "contexts": dict(sorted(run.contexts.items())),
        "platforms": [platform],
    }
    targets: dict[str, Any] = {
        "image": {**common, "target": FINAL, "tags": [tag], "labels": dict(labels),
                  "output": ["type=registry" if push else "type=docker"]},
    }
    for stage, target in run.artifact_targets.items():
        targets[f"artifact-{stage}"] = {
            **common, "target": target,
            "output": [f"type=oci,dest={artifact_dirs[stage]},tar=false"],
        }
    return {"group": {"default": {"targets": list(targets)}}, "target": targets}

"""The engine's entry points used by tasks.py: load a manifest, plan, render."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from imageforge import manifest as manifest_mod
from imageforge.manifest import Manifest
from imageforge.plan import Plan, make_plan
from imageforge.render import render_dockerfile
from stages import STAGES

DEFAULT_MANIFEST = Path("manifests/smddp.toml")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    manifest: Path = DEFAULT_MANIFEST
    overrides: tuple[str, ...] = ()
    cache_dir: Path = Path("cache")


def load_manifest(settings: Settings) -> Manifest:
    return manifest_mod.load(settings.manifest, settings.overrides, registry=STAGES)


def plan(settings: Settings, target: str) -> Plan:
    return make_plan(load_manifest(settings), target, STAGES)


def check(settings: Settings) -> list[str]:
    """Validate the manifest and plan every stage it defines; returns one line per target."""
    loaded = load_manifest(settings)
    targets = [name for name, stage in STAGES.items() if stage.image and _complete(loaded, name)]
    return [f"{t}: {len(make_plan(loaded, t, STAGES).stages)} stages" for t in targets]


def _complete(loaded: Manifest, target: str) -> bool:
    from imageforge.dag import closure

    needed = closure(target, STAGES)
    return all(loaded.has_stage(n) or not any(f.required for f in STAGES[n].fields.values())
               for n in needed)


def dockerfile(planned: Plan) -> str:
    return render_dockerfile(((s.name, s.recipe) for s in planned.stages),
                             manifest=str(planned.manifest.path), target=planned.target)


def manifest_label(path: Path) -> str:
    """The manifest path as written in reports: relative to the project when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def targets() -> Sequence[str]:
    return list(STAGES)

"""Extending a prebuilt image: `[image] extends = "REF"` builds only what REF lacks.

Which stages REF already provides is read from its labels (an imageforge image carries
`io.imageforge.key.<stage>` for each of its stages) by `invoke lock`, which records them with
REF's digest, or declared with `[image] provides = [...]` for images made elsewhere (an AWS
Deep Learning Container, say). The provided stages leave the graph: the stages that remain
are built FROM REF, and images gather only what REF does not have. Reading REF through Docker
is sources/extended.py; this module only rewrites the stage graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from imageforge.errors import ManifestError
from imageforge.model.manifest import Manifest
from imageforge.model.stage import Stage, chosen_deps

BASE = "base"


def provided(manifest: Manifest) -> tuple[str, ...] | None:
    """The stages the manifest's `extends` image provides; None when it extends nothing, or
    when they are still to be read from its labels (`invoke lock`)."""
    if not manifest.image.get("extends"):
        return None
    names = manifest.image.get("provides")
    return None if names is None else tuple(names)


def registry(stages: Mapping[str, Stage], manifest: Manifest) -> Mapping[str, Stage]:
    """The stage graph of `manifest`: `stages` with the deps its settings choose (Stage
    .deps_for), without what `extends` provides."""
    stages = chosen_deps(stages, manifest.stages)
    ref = manifest.image.get("extends")
    if not ref:
        return stages
    names = provided(manifest)
    if names is None:
        raise ManifestError(
            f"{manifest.path}: image.extends = {ref!r}: which stages it already has is read "
            "from its labels by `invoke lock` (or declare them with image.provides); run "
            "`invoke lock`.")
    unknown = [n for n in names if n not in stages]
    if unknown:
        raise ManifestError(f"{manifest.path}: image.provides names {unknown[0]!r}, which is "
                            f"not a stage; stages are: {', '.join(stages)}.")
    return without(stages, {*names, BASE})


def without(stages: Mapping[str, Stage], gone: set[str]) -> dict[str, Stage]:
    """`stages` with `gone` taken out of the graph: `base` becomes the bare FROM of the image
    being extended, and a stage built FROM a provided one is built FROM it too. A provided
    stage stays only as its settings (other recipes may read them): nothing depends on it,
    and it renders, builds and checks nothing."""
    result: dict[str, Stage] = {}
    for name, stage in stages.items():
        if name == BASE:
            result[name] = dataclasses.replace(stage, deps=(), recipe=lambda _ctx: "")
        elif name in gone:
            # Its settings are still judged by its compatibility rules.
            result[name] = Stage(name=name, doc=stage.doc, deps=(), parent=BASE,
                                 fields=stage.fields, recipe=lambda _ctx: "", exports=(),
                                 provided=True, rules=stage.rules)
        else:
            parent = BASE if stage.parent in gone else stage.parent
            deps = tuple(d for d in stage.deps if d not in gone)
            # Its deps were chosen for this manifest already (chosen_deps): settled here.
            result[name] = dataclasses.replace(stage, parent=parent, deps=deps, deps_for=None)
    return result


def check_versions(manifest: Manifest, versions: Mapping[str, str]) -> None:
    """Refuse a manifest that pins another version of a stage the image already has."""
    for name, version in versions.items():
        table = manifest.document.get("stages", {}).get(name, {})
        wanted = table.get("version") if isinstance(table, dict) else None
        if wanted not in (None, "auto") and str(wanted) != version:
            raise ManifestError(
                f"{manifest.path}: stages.{name}.version = {wanted!r}, but image.extends = "
                f"{manifest.image['extends']!r} already has {name} {version}; drop the "
                f"[stages.{name}] table or extend another image.")


def with_provides(manifest: Manifest, names: Sequence[str],
                  pinned: Mapping[str, Any] | None) -> Manifest:
    """`manifest` with the stages its extended image provides and that image's pin (what
    `inspect` found, as the lock records it)."""
    image = dict(manifest.image)
    if image.get("provides") is None:
        image["provides"] = list(names)
    digest = (pinned or {}).get("digest")
    if digest and not image.get("base_digest"):
        image["base_digest"] = digest
    return dataclasses.replace(manifest, image=image)

"""What one build run does: which stages BuildKit must build, which come from the artifact
cache, the Dockerfile and the bake file that say so."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from imageforge.model.imageref import registry_host
from imageforge.model.stage import Stage
from imageforge.planning.artifact import ARTIFACT_PREFIX, exports_block, full_artifact_stages
from imageforge.planning.plan import Plan, PlannedStage
from imageforge.planning.render import render_dockerfile

FINAL = "imageforge-image"
# Images that stay in this engine's store, and OCI-layout artifacts in the cache directory,
# are written with uncompressed layers: compressing a layer costs seconds per gigabyte (with
# rewrite-timestamp, once more to rewrite it). Pushing an artifact to the remote cache moves
# these blobs as they are (BuildKit compresses only new layers): forcing gzip or zstd there
# made a push of the sample's smddp image (1.6 GB) take 19 s instead of 5 s (beside another
# build), since a whole-image artifact carries the base image's layers and a fresh runner has
# no compressed copy of them. The image itself, under --push, is compressed as usual.
UNCOMPRESSED = "compression=uncompressed"
LOCAL_IMAGE = f"type=docker,{UNCOMPRESSED}"
# The SOURCE_DATE_EPOCH of every build step, artifact and image: 1980-01-01, the earliest
# time a zip (a wheel) can hold. One constant, not the lock's date, because an artifact is
# shared by every lock whose pins give the same key: same key, same bytes. The image's
# org.opencontainers.image.created label still carries the lock's date.
SOURCE_DATE_EPOCH = 315532800
# Whole-image OCI layouts (image_artifacts = "oci-layout"): BuildKit clamps every file time
# newer than SOURCE_DATE_EPOCH to it. The engine's own image exporter refuses this option (it
# unpacks what it stores).
REWRITE_TIMESTAMP = "rewrite-timestamp=true"


def whole_images(plan: Plan, building: list[str]) -> list[str]:
    """The stages of `building` whose artifact is a whole image: kept by name in an engine's
    image store (cache/imagestore.py) where it has one, instead of an OCI layout."""
    full = full_artifact_stages(plan.registry)
    return [n for n in building if n in full]


_CACHE_MOUNT_ID = re.compile(r"(--mount=type=cache,id=)([A-Za-z0-9_.-]+)")


def fresh_cache_mounts(dockerfile: str, token: str) -> str:
    """The Dockerfile with cache mounts of its own: a build from nothing must not take pip's
    wheels or ccache's objects from earlier builds."""
    return _CACHE_MOUNT_ID.sub(lambda m: f"{m.group(1)}{m.group(2)}-verify-{token}", dockerfile)


def is_external(stage: PlannedStage) -> bool:
    """A stage that is only its FROM line (e.g. `base` on a base image that already has
    every tool): the base image is its artifact, so it is rendered, never built or stored."""
    lines = stage.recipe.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("FROM ") and stage.deps == ()


def to_build(plan: Plan, also: Iterable[str] = ()) -> list[str]:
    """The stages BuildKit must build: the target unless cached (and each of `also`), and
    recursively every dependency of a stage being built that no cache holds. Plan order."""
    available = {s.name for s in plan.stages
                 if s.status in ("cached", "remote") or is_external(s)}
    needed: set[str] = set()

    def need(name: str) -> None:
        if name in available or name in needed:
            return
        needed.add(name)
        for dep in plan.stage(name).deps:
            need(dep)

    for name in (plan.target, *also):
        need(name)
    return [s.name for s in plan.stages if s.name in needed]


# A block names the stages it reads in its FROM line (the parent) and in COPY --from.
_NAMED = re.compile(r"(?:^FROM\s+|--from=)([A-Za-z0-9][A-Za-z0-9_.-]*)", re.MULTILINE)


def read_by(plan: Plan, building: list[str]) -> set[str]:
    """The stages of `plan` that the blocks of `building` read. Not only their direct deps:
    a block copies the whole closure it needs (torchvision copies nccl, which only pytorch
    depends on), so each of those must be in the Dockerfile or given as a context."""
    names = {s.name for s in plan.stages}
    return {found for name in building for found in _NAMED.findall(plan.stage(name).recipe)
            if found in names and found != name}


def reused(plan: Plan, building: list[str]) -> list[str]:
    """Cached stages this run reads: those the built stages read, or the target itself."""
    used = read_by(plan, building)
    if plan.target not in building:
        used.add(plan.target)
    return [s.name for s in plan.stages
            if s.name in used and s.name not in building and not is_external(s)]


def waves(plan: Plan, building: list[str]) -> list[list[str]]:
    """`building` split into bakes run one after another. An image stage goes after every
    stage it reads that this run builds, so it always reads them as stored artifacts: the
    same contexts every later build gives it. Its gathering steps (FROM, COPY --from) then
    have the same BuildKit cache keys in a cold build as in the one that changes only its
    own pin, and BuildKit re-runs only what that pin changed. Everything else builds in one
    bake, where BuildKit runs independent stages side by side.

    A target that is not an image stage is tagged as its artifact, its exports on scratch:
    when this run builds it, a last bake with no stage makes the image from the artifact just
    stored, so that building the stage and reading it from the cache give one image."""
    wave: dict[str, int] = {}
    for name in building:
        reads = [wave[d] for d in read_by(plan, [name]) if d in wave]
        wave[name] = max(reads, default=0) + (1 if reads and plan.registry[name].image else 0)
    parts = [[n for n in building if wave[n] == w] for w in sorted(set(wave.values()))]
    if plan.target in building and plan.target not in full_artifact_stages(plan.registry):
        parts.append([])
    return parts


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """One build run: the Dockerfile text, the contexts and the bake targets."""

    dockerfile: str
    contexts: Mapping[str, str]
    artifact_targets: Mapping[str, str]   # stage -> Dockerfile target to export


def make_run(plan: Plan, registry: Mapping[str, Stage], building: list[str],
             contexts: Mapping[str, str], *, final: bool = True) -> Run:
    """The Dockerfile of one bake: the blocks of `building`, their artifacts' export
    targets and, when `final`, the image."""
    full = full_artifact_stages(registry)
    used = read_by(plan, building) | ({plan.target} if final else set())
    blocks = [(s.name, s.recipe) for s in plan.stages if is_external(s) and s.name in used]
    blocks += [(name, plan.stage(name).recipe) for name in building]
    artifact_targets: dict[str, str] = {}
    for name in building:
        if name in full:
            artifact_targets[name] = name
            continue
        blocks.append((f"artifact of {name}", exports_block(name, registry[name].exports)))
        artifact_targets[name] = ARTIFACT_PREFIX + name
    if final:
        blocks.append(("image", f"FROM {plan.target} AS {FINAL}\n"))
    text = render_dockerfile(blocks, manifest=str(plan.manifest.path), target=plan.target)
    return Run(dockerfile=text, contexts=dict(contexts), artifact_targets=artifact_targets)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerCache:
    """BuildKit's own layer cache, per stage, in a directory or a registry repository."""

    location: str
    modes: Mapping[str, str]   # stage -> "min" | "max"
    # The remote artifact cache's own layer cache (image_layer_cache): its layers are the
    # artifacts' blobs, uncompressed, and a failed export costs the build nothing.
    beside_artifacts: bool = False
    # Stage -> the tag of its cache in a registry repository; "buildcache" where none.
    tags: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def _local(self) -> bool:
        return self.location.startswith(("/", ".")) or registry_host(self.location) is None

    def _ref(self, stage: str) -> str:
        return f"{self.location}/{stage}:{self.tags.get(stage, 'buildcache')}"

    def cache_to(self, stage: str) -> str:
        mode = self.modes.get(stage, "min")
        if self._local():
            return f"type=local,dest={Path(self.location) / stage},mode={mode}"
        extra = f",{UNCOMPRESSED},ignore-error=true" if self.beside_artifacts else ""
        return f"type=registry,ref={self._ref(stage)},mode={mode}{extra}"

    def cache_from(self) -> list[str]:
        if self._local():
            return [f"type=local,src={d}" for d in sorted(Path(self.location).glob("*"))
                    if (d / "index.json").exists()]
        return [f"type=registry,ref={self._ref(s)}" for s in sorted(self.modes)]


def image_layer_cache(plan: Plan, building: list[str], remote: str) -> LayerCache | None:
    """BuildKit's layer cache of the image stages of `building`, beside their artifacts in
    the remote cache (mode=min). An image stage gathers every artifact it reads (FROM, COPY
    --from) before its own steps: on a runner that starts empty, a change of its own pin
    alone would redo that gathering, which BuildKit's registry cache of the image's steps
    gives back as layers instead. Its blobs are the image artifact's own (same repository,
    uncompressed), so exporting it pushes little more than a manifest.

    Its tag is `buildcache-` and a digest of the keys of the stages it reads: what its
    gathering steps depend on, not its own pin. One tag per stage would hold whichever
    build ran last (a boost bump's image), and a later change of the image's own pin alone
    would find nothing in it."""
    images = {n: "min" for n in building if plan.registry[n].image}
    if not images:
        return None
    tags = {n: _gathering_tag(plan, n) for n in images}
    return LayerCache(location=remote, modes=images, beside_artifacts=True, tags=tags)


def _gathering_tag(plan: Plan, stage: str) -> str:
    """`buildcache-` and 16 hex digits of a digest of the keys of the stages `stage` reads."""
    keys = sorted(plan.stage(name).key for name in read_by(plan, [stage]))
    return "buildcache-" + hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


def bake_file(run: Run, *, workdir: Path, tag: str | None, labels: Mapping[str, str], platform: str,
              push: bool, artifact_dirs: Mapping[str, Path],
              artifact_images: Mapping[str, str] | None = None,
              layer_cache: LayerCache | None = None,
              sbom_generator: str | None = None,
              secrets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A docker-bake.json building the image (tagged `tag`; none without one) and exporting
    every new artifact in one go: into the engine's image store by name (`artifact_images`,
    stage -> name), the others as OCI layouts (`artifact_dirs`). `secrets` (id -> file)
    reach only the RUN steps that mount them, never a layer."""
    common: dict[str, Any] = {
        "context": str(workdir / "context"),
        "dockerfile": str(workdir / "Dockerfile"),
        "contexts": dict(sorted(run.contexts.items())),
        "platforms": [platform],
        # One value in every target of the bake: the stages' steps read it (render.py), so
        # any difference would make BuildKit run them once per target.
        "args": {"SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)},
    }
    if secrets:
        common["secret"] = [f"id={key},src={path}" for key, path in sorted(secrets.items())]
    if layer_cache is not None and layer_cache.cache_from():
        common["cache-from"] = layer_cache.cache_from()
    image: dict[str, Any] = {**common, "target": FINAL, "tags": [tag], "labels": dict(labels),
                             "output": ["type=registry" if push else LOCAL_IMAGE]}
    if push:
        # Provenance of what a registry serves; it records build args, so secrets never
        # travel as build args (BuildKit secrets only).
        image["attest"] = ["type=provenance,mode=max"]
        if sbom_generator:
            image["attest"].append(f"type=sbom,generator={sbom_generator}")
    targets: dict[str, Any] = {"image": image} if tag is not None else {}
    for stage, target in run.artifact_targets.items():
        if artifact_images and stage in artifact_images:
            # No attestation: the artifact is looked up by its digest, and provenance would
            # wrap it in an index that changes with every build.
            targets[f"artifact-{stage}"] = {
                **common, "target": target,
                "output": [f"type=image,name={artifact_images[stage]},{UNCOMPRESSED}"],
                "attest": ["type=provenance,disabled=true"],
            }
        else:
            # An exports-only artifact clamped its file times itself (artifact.exports_block).
            clamp = "" if target.startswith(ARTIFACT_PREFIX) else f"{REWRITE_TIMESTAMP},"
            targets[f"artifact-{stage}"] = {
                **common, "target": target,
                "output": [f"type=oci,dest={artifact_dirs[stage]},tar=false,"
                           f"{clamp}{UNCOMPRESSED}"],
            }
        if layer_cache is not None and stage in layer_cache.modes:
            # The stage itself (not its artifact), so the mode applies to its own steps.
            targets[f"layer-cache-{stage}"] = {
                **common, "target": stage, "output": ["type=cacheonly"],
                "cache-to": [layer_cache.cache_to(stage)],
            }
    return {"group": {"default": {"targets": list(targets)}}, "target": targets}


def standalone_bake(plan: Plan, *, sources: Mapping[str, str], tag: str,
                    labels: Mapping[str, str]) -> dict[str, Any]:
    """`invoke render --format bake`: a docker-bake.json with one target per stage, each
    stage's Dockerfile inline and the stages it builds on linked as `target:` contexts, for
    teams that drive bake or a remote BuildKit fleet directly. No artifact cache: bake and
    BuildKit's own layer cache decide what to rebuild."""
    targets: dict[str, Any] = {}
    for stage in plan.stages:
        contexts = {dep: f"target:{dep}" for dep in _referenced(stage.recipe)}
        contexts.update({src.name: sources[src.name] for src in stage.sources})
        contexts.update({name: path for name, (path, _) in stage.local_dirs.items()})
        target: dict[str, Any] = {
            "context": ".",
            "dockerfile-inline": _hcl_literal(stage.recipe),
            "target": stage.name,
            "platforms": [str(plan.manifest.image["platform"])],
        }
        if contexts:
            target["contexts"] = dict(sorted(contexts.items()))
        targets[stage.name] = target
    final = targets[plan.target]
    final["tags"] = [tag]
    final["labels"] = dict(labels)
    return {"group": {"default": {"targets": [plan.target]}}, "target": targets}


def _hcl_literal(text: str) -> str:
    """Bake reads JSON files as HCL, where "${" and "%{" start templates; the Dockerfile's own
    `${VAR}` must reach BuildKit unchanged."""
    return text.replace("${", "$${").replace("%{", "%%{")


def _referenced(block: str) -> list[str]:
    """Stages a block names in FROM (its parent) and COPY --from (what it gathers)."""
    names: list[str] = []
    for line in block.splitlines():
        words = line.split()
        if words[:1] == ["FROM"] and len(words) == 4 and words[2] == "AS" and "/" not in words[1] \
                and ":" not in words[1]:
            names.append(words[1])
        names += [w.split("=", 1)[1] for w in words if w.startswith("--from=")]
    return sorted(set(names))

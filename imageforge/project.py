"""The engine's entry points used by tasks.py: load a manifest, plan, render."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from imageforge import codedir, compat, extends, lock
from imageforge import manifest as manifest_mod
from imageforge import mirror as mirror_mod
from imageforge.artifacts import ArtifactStore
from imageforge.errors import DockerError, ManifestError
from imageforge.execute import is_external
from imageforge.manifest import Manifest
from imageforge.plan import Plan, Status, defined_targets, make_plan
from imageforge.remote import Remote, RemoteUnavailable, warn_unavailable
from imageforge.render import render_dockerfile
from imageforge.sources import SourceCache
from imageforge.stage import Stage
from stages import STAGES

DEFAULT_MANIFEST = Path("manifests/smddp.toml")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    manifest: Path = DEFAULT_MANIFEST
    overrides: tuple[str, ...] = ()
    cache_dir: Path = Path("cache")
    # Refuse a missing or stale lock instead of planning from the manifest alone.
    locked: bool = False
    # Registry repository of the shared artifact cache, e.g. "127.0.0.1:5000/imageforge-cache".
    remote: str | None = None
    # BuildKit layer cache per stage: a directory, or a registry repository.
    layer_cache: str | None = None
    # URL prefix replacements applied to every source before it is fetched (invoke config).
    rewrites: tuple[mirror_mod.Rewrite, ...] = ()
    # A mirror made by `mirror.sync` (directory or URL): the only place sources come from.
    mirror: str | None = None


def load_manifest(settings: Settings) -> Manifest:
    """The manifest with --set overrides, its lock's pins when the lock is current, and the
    digest of the user's code."""
    loaded = manifest_mod.load(settings.manifest, settings.overrides, registry=STAGES)
    path = lock.lock_path(settings.manifest)
    current = lock.read(path)
    if settings.locked:
        lock.check(loaded, current, path)
    return codedir.apply(lock.apply(loaded, current, STAGES))


def registry_for(manifest: Manifest) -> Mapping[str, Stage]:
    """The stage graph of `manifest` (without what an extended image already has)."""
    return extends.registry(STAGES, manifest)


def plan(settings: Settings, target: str, *, remote: Remote | None = None) -> Plan:
    """The plan with each stage's status: in the local artifact store, in the remote one,
    or to be built."""
    loaded = load_manifest(settings)
    planned = make_plan(loaded, target, registry_for(loaded))
    return with_statuses(planned, artifact_store(settings), remote)


def with_statuses(planned: Plan, store: ArtifactStore, remote: Remote | None) -> Plan:
    statuses: dict[str, Status] = {}
    missing = []
    for stage in planned.stages:
        if is_external(stage) or store.get(stage.key) is not None:
            statuses[stage.name] = "cached"
        else:
            missing.append(stage)
    if remote is not None and missing:
        try:
            with ThreadPoolExecutor(max_workers=4) as pool:
                found = list(pool.map(lambda s: remote.exists(s.name, s.key), missing))
        except RemoteUnavailable as exc:
            warn_unavailable(remote, str(exc))
            found = [False] * len(missing)
        statuses.update({s.name: "remote" for s, ok in zip(missing, found, strict=True) if ok})
    stages = tuple(dataclasses.replace(s, status=statuses.get(s.name, "build"))
                   for s in planned.stages)
    return dataclasses.replace(planned, stages=stages)


def artifact_store(settings: Settings) -> ArtifactStore:
    return ArtifactStore(settings.cache_dir / "artifacts")


def source_cache(settings: Settings) -> SourceCache:
    root = (settings.cache_dir / "sources").resolve()
    if not settings.rewrites and not settings.mirror:
        return SourceCache(root)
    return SourceCache(root, mirror_mod.Locations(settings.rewrites, settings.mirror,
                                                  token=mirror_mod.token_from_env()))


def write_lock(settings: Settings, *, upgrade: bool,
               stages: Sequence[str] = ()) -> tuple[Path, list[str]]:
    """Resolve and write the lock; returns its path and what changed. `upgrade` moves the
    stages with a version policy (only `stages`, when given) to their newest allowed release."""
    if settings.mirror:
        raise ManifestError(f"--mirror {settings.mirror}: a lock is resolved against upstream "
                            "and a mirror holds only what a lock already pins; run `invoke lock` "
                            "without --mirror.")
    loaded = manifest_mod.load(settings.manifest, settings.overrides, registry=STAGES)
    path = lock.lock_path(settings.manifest)
    previous = lock.read(path)
    if previous is not None and previous.manifest_digest != loaded.digest():
        # Pins of a different effective manifest are not evidence for this one.
        previous = None
    loaded, extended = _extends(loaded)
    new = lock.resolve(loaded, registry_for(loaded), source_cache(settings), previous,
                       upgrade=upgrade, only=stages)
    new = dataclasses.replace(new, extends=extended)
    changes = lock.diff(previous, new)
    # Same pins, same creation time: only a moved pin gives images a new date.
    kept = previous.source_date_epoch if previous and not changes else None
    new = dataclasses.replace(new, source_date_epoch=kept or int(time.time()))
    lock.write(path, new, loaded)
    return path, changes


def _extends(loaded: Manifest) -> tuple[Manifest, dict[str, Any] | None]:
    """The manifest with what its extended image provides (from the image's labels unless
    declared), and that image as the lock records it."""
    ref = loaded.image.get("extends")
    if not ref:
        return loaded, None
    declared = extends.provided(loaded)
    try:
        found = extends.inspect(str(ref), STAGES)
    except DockerError:
        if declared is None:
            raise
        # Declared by hand: an image this host cannot see is still buildable on one that can.
        return loaded, {"ref": ref, "digest": None, "provides": list(declared), "versions": {}}
    extends.check_versions(loaded, found.versions)
    names = declared if declared is not None else found.provides
    pinned = found.to_json(str(ref))
    return extends.with_provides(loaded, names, pinned), pinned


def current_lock(settings: Settings) -> tuple[lock.Lock, str] | None:
    """The lock when it matches the effective manifest, and the sha256 of its file."""
    loaded = manifest_mod.load(settings.manifest, settings.overrides, registry=STAGES)
    path = lock.lock_path(settings.manifest)
    found = lock.read(path)
    if found is None or found.manifest_digest != loaded.digest():
        return None
    return found, "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def check_lock(settings: Settings) -> Path:
    loaded = manifest_mod.load(settings.manifest, settings.overrides, registry=STAGES)
    path = lock.lock_path(settings.manifest)
    lock.check(loaded, lock.read(path), path)
    return path


def mirror_sync(settings: Settings, to: Path) -> Path:
    """Copy every source the (current) lock pins into the mirror directory `to`; returns its
    index.json."""
    if settings.mirror:
        raise ManifestError(f"--mirror {settings.mirror}: mirror.sync copies from upstream; "
                            "run it without --mirror.")
    raw = manifest_mod.load(settings.manifest, settings.overrides, registry=STAGES)
    path = lock.lock_path(settings.manifest)
    current = lock.read(path)
    lock.check(raw, current, path)
    applied = lock.apply(raw, current, STAGES)
    return mirror_mod.sync(applied, registry_for(applied), source_cache(settings), to)


def fetch(settings: Settings, target: str) -> dict[str, Path]:
    planned = plan(settings, target)
    return source_cache(settings).materialize_all(planned.sources())


def check(settings: Settings) -> list[str]:
    """Validate the manifest, its lock and the compatibility rules, and plan every image it
    defines; returns report lines. Every rule violation is reported at once."""
    raw = manifest_mod.load(settings.manifest, settings.overrides, registry=STAGES)
    path = lock.lock_path(settings.manifest)
    current = lock.read(path)
    if settings.locked:
        lock.check(raw, current, path)
    fresh = current if current and current.manifest_digest == raw.digest() else None
    pin = fresh.pin() if fresh else None
    # The rules judge what will be built: the versions `lock --upgrade` moved to, too.
    raw = manifest_mod.with_versions(raw, fresh.versions(), registry=STAGES) if fresh else raw
    violations = compat.check(raw) + compat.nccl_pin_rule(raw, pin)
    compat.require_compatible(violations, manifest=settings.manifest)
    lines = [f"note: {note}" for note in compat.notes(raw)]
    explanation = compat.explain_nccl_difference(raw, pin)
    if explanation:
        lines.append(f"note: {explanation}")
    lines.append(f"lock: {path.name} " + ("current" if fresh else
                                          "missing or stale (run `invoke lock`)"))
    loaded = lock.apply(raw, current, STAGES)
    if raw.stages.get("nccl", {}).get("version") == "auto" and pin is None:
        lines.append('nccl: version "auto" is resolved by `invoke lock`; plans need the lock')
        return lines
    loaded = codedir.apply(loaded)
    graph = registry_for(loaded)
    plans = [make_plan(loaded, t, graph) for t in defined_targets(loaded, graph)]
    warned = dict.fromkeys(w for planned in plans for w in planned.warnings())
    lines += [f"warning: {w}" for w in warned]
    lines += [f"{p.target}: {len(p.stages)} stages" for p in plans]
    return lines


def dockerfile(planned: Plan) -> str:
    return render_dockerfile(((s.name, s.recipe) for s in planned.stages),
                             manifest=str(planned.manifest.path), target=planned.target)


def bake(settings: Settings, planned: Plan) -> dict[str, Any]:
    """The docker-bake.json equivalent of building `planned` (render --format bake)."""
    from imageforge.build import default_tag, labels
    from imageforge.execute import standalone_bake

    cache = source_cache(settings)
    sources = {src.name: str(cache.path_for(src)) for src in planned.sources()}
    return standalone_bake(planned, sources=sources, tag=default_tag(planned),
                           labels=labels(planned))


def manifest_label(path: Path) -> str:
    """The manifest path as written in reports: relative to the project when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def targets() -> Sequence[str]:
    return list(STAGES)


def is_image(target: str) -> bool:
    return target in STAGES and STAGES[target].image


def image_targets() -> list[str]:
    return [name for name, stage in STAGES.items() if stage.image]

"""The engine's entry points for the front end: settle a manifest's pins, plan, render.

A command's `Settings` opens its manifest and lock once (`opened`, a ManifestLock): every
function here asks that object instead of reading the files again."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from imageforge import cachedir, log
from imageforge.cache import localimages
from imageforge.cache.artifacts import ArtifactStore
from imageforge.cache.imagestore import ImageStore
from imageforge.cache.remote import Remote, RemoteUnavailable, warn_unavailable
from imageforge.errors import ManifestError, UsageError
from imageforge.model import compat, extends
from imageforge.model import manifest as manifest_mod
from imageforge.model.dag import closure
from imageforge.model.inputs import defined_targets
from imageforge.model.manifest import Manifest, refuse_moved_pins
from imageforge.model.stage import Stage
from imageforge.planning import rules
from imageforge.planning.execute import is_external, standalone_bake
from imageforge.planning.labels import default_tag, labels
from imageforge.planning.plan import Plan, Status, make_plan
from imageforge.planning.render import render_dockerfile
from imageforge.sources import lockfile, lockresolve, locksettle, pinned
from imageforge.sources import mirror as mirror_mod
from imageforge.sources.manifestlock import ManifestLock, open_manifest
from imageforge.sources.sources import SourceCache

DEFAULT_MANIFEST = Path("manifests/smddp.toml")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    # Every stage the manifest may name. The front end passes it in (tasks.py: imageforge's
    # stages/ plus a team's stage_dirs): the engine itself never imports a stage.
    registry: Mapping[str, Stage]
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
    # Whole-image artifacts by name in the engine's image store (False: OCI layouts).
    image_store: bool = True
    # cache_trust = "verified": only remote artifacts a rebuild verified (cache/verified.py).
    trust_verified: bool = False

    @property
    def verified_in(self) -> Path | None:
        """Where the records of verified artifacts are, when only those may be used."""
        return self.cache_dir if self.trust_verified else None

    @functools.cached_property
    def opened(self) -> ManifestLock:
        """The manifest and its lock, read and checked once for this command (until
        `write_lock` replaces the lock)."""
        return open_manifest(self.manifest, self.overrides, self.registry)


def _reopen(settings: Settings) -> None:
    settings.__dict__.pop("opened", None)


def load_manifest(settings: Settings, *, resolve: bool = False,
                  target: str | None = None) -> Manifest:
    """The manifest with --set overrides, its lock applied entry by entry, and the digest of
    the user's code. `resolve` (build, fetch): the lock's stale entries are resolved upstream
    for this run, only those of `target`'s stages when one is given; otherwise they stay
    unpinned, and their stages are keyed by location."""
    return prepare(settle(settings, resolve=resolve, target=target).manifest,
                   settings.registry)


def prepare(manifest: Manifest, registry: Mapping[str, Stage]) -> Manifest:
    """`manifest` with each stage's plan-time preparation applied (its `prepare` hook)."""
    tables = dict(manifest.stages)
    for name, table in manifest.stages.items():
        stage = registry.get(name)
        if stage is not None and stage.prepare is not None:
            tables[name] = dict(stage.prepare(table, manifest.path))
    return dataclasses.replace(manifest, stages=tables) if tables != manifest.stages else manifest


def settle(settings: Settings, *, resolve: bool, target: str | None = None) -> locksettle.Settled:
    """The lock applied to the effective manifest, after every compatibility rule passed.
    With `target`, only its stages' entries are resolved upstream: a one-stage fetch from a
    mirror must not need every other upstream."""
    opened = settings.opened
    loaded, path, current = opened.manifest, opened.path, opened.lock
    local = local_ids(settings, "record" if resolve else "read")
    settled = locksettle.settle(loaded, current, settings.registry, local_id=local)
    rule_verdict(settled.manifest, settled.pins(), settings.registry)
    if resolve:
        # Before anything is downloaded: the download would fail blamed on upstream.
        refuse_moved_pins(settings.manifest, settings.overrides,
                          registry=settings.registry)
    if settings.locked:
        opened.check()
    elif resolve and settled.unresolved:
        # Only now, after the rules passed: resolving may download.
        pinned.verify_commits(loaded, settings.registry, source_cache(settings).locate_url)
        resolver = lockresolve.Upstream(cache=source_cache(settings), stages=settings.registry)
        only = set(closure(target, settings.registry)) if target else None
        settled = locksettle.settle(loaded, current, settings.registry, resolver, local, only=only)
        rule_verdict(settled.manifest, settled.pins(), settings.registry)
    _tell_stale(path, current, settled, resolved=resolve)
    return settled


def _tell_stale(path: Path, current: lockfile.Lock | None, settled: locksettle.Settled, *,
                resolved: bool) -> None:
    if not settled.stale:
        return
    how = ("resolved for this run" if resolved else
           "not resolved by this command (`invoke build` resolves them)")
    what = (f"no {path.name}: its {len(settled.stale)} pins are" if current is None else
            f"{path.name}: {len(settled.stale)} stale entries "
            f"({', '.join(lockfile.name(p) for p in settled.stale)})")
    log.note(f"{what} {how}; `invoke lock` records them.")


def local_ids(settings: Settings, mode: localimages.Mode) -> locksettle.LocalId:
    """This machine's IDs of local-only base images, from the local cache (not the lock)."""
    store = localimages.LocalImages(settings.cache_dir)
    return lambda ref: store.id_for(ref, mode)


def rule_verdict(manifest: Manifest, pins: rules.Pins,
                 registry: Mapping[str, Stage]) -> rules.Verdict:
    """Every compatibility rule on `manifest` as it will be built, with the lock's pins for
    this manifest (e.g. the NCCL its PyTorch pins); refuses (exit 3) every violation no
    waiver accepts."""
    return rules.enforce(manifest, pins, registry=registry)


def waived(settings: Settings, manifest: Manifest) -> rules.Verdict:
    """What the waivers of `manifest` (as planned) accept, for `invoke plan`."""
    return rule_verdict(manifest, settings.opened.settled.pins(), settings.registry)


def default_target(settings: Settings) -> str:
    """The image the manifest defines: what commands build without --target."""
    # Quietly: the command's own planning reports the lock and the rules.
    loaded = settings.opened.settled.manifest
    images = defined_targets(loaded, registry_for(settings, loaded))
    if len(images) == 1:
        return images[0]
    if images:
        raise UsageError(f"--target: {settings.manifest} defines {len(images)} images "
                         f"({', '.join(images)}); pass --target with one of them.")
    raise UsageError(f"--target: {settings.manifest} defines no whole image (none of "
                     f"{', '.join(image_targets(settings))} has every stage table it needs); pass "
                     "--target with the stage to use.")


def registry_for(settings: Settings, manifest: Manifest) -> Mapping[str, Stage]:
    """The stage graph of `manifest` (without what an extended image already has)."""
    return extends.registry(settings.registry, manifest)


def plan(settings: Settings, target: str, *, remote: Remote | None = None,
         resolve: bool = False) -> Plan:
    """The plan with each stage's status: in the local artifact store, in the remote one,
    or to be built. `resolve`: see load_manifest."""
    loaded = load_manifest(settings, resolve=resolve, target=target)
    planned = make_plan(loaded, target, registry_for(settings, loaded))
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
            found = remote.holds([(s.name, s.key) for s in missing])
        except RemoteUnavailable as exc:
            warn_unavailable(remote, str(exc))
            found = [False] * len(missing)
        statuses.update({s.name: "remote" for s, ok in zip(missing, found, strict=True) if ok})
    stages = tuple(dataclasses.replace(s, status=statuses.get(s.name, "build"))
                   for s in planned.stages)
    return dataclasses.replace(planned, stages=stages)


_DOCKER_ENGINE = ImageStore()


def artifact_store(settings: Settings, images: ImageStore | None = _DOCKER_ENGINE
                   ) -> ArtifactStore:
    """The artifact store; full-image artifacts in the image store of `images` (the docker
    CLI's engine unless told otherwise; None: a builder without an image store, or
    settings that keep every artifact as an OCI layout)."""
    return ArtifactStore(cachedir.artifacts(settings.cache_dir),
                         images if settings.image_store else None)


def source_cache(settings: Settings) -> SourceCache:
    root = cachedir.sources(settings.cache_dir).resolve()
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
    loaded = manifest_mod.load(settings.manifest, settings.overrides, registry=settings.registry)
    path = lockfile.lock_path(settings.manifest)
    # A lock an older imageforge wrote is replaced whole.
    previous = lockfile.read(path, old_ok=True)
    # Before anything is downloaded; PyTorch's NCCL pin is judged once it is resolved.
    rules.enforce(manifest_mod.with_versions(loaded, previous.versions() if previous else {},
                                             registry=settings.registry), None,
                  registry=settings.registry)
    pinned.verify_commits(loaded, settings.registry, source_cache(settings).locate_url)
    settled = lockresolve.resolve(loaded, settings.registry, source_cache(settings), previous,
                           upgrade=upgrade, only=stages, local_id=local_ids(settings, "refresh"))
    new = settled.lock()
    rules.enforce(manifest_mod.with_versions(loaded, new.versions(), registry=settings.registry),
                  new.pins(), registry=settings.registry)
    changes = lockfile.diff(previous, new, settings.registry)
    # Same pins, same creation time: only a moved pin gives images a new date.
    moved = previous is None or lockfile.pins_moved(previous, new)
    kept = previous.source_date_epoch if previous and not moved else None
    new = dataclasses.replace(new, source_date_epoch=kept or int(time.time()))
    # An unchanged lock is left untouched, byte for byte (a committed one stays clean).
    if not path.exists() or path.read_text() != lockfile.text(new, loaded):
        lockfile.write(path, new, loaded)
        _reopen(settings)
    return path, changes


def current_lock(settings: Settings) -> tuple[lockfile.Lock, str] | None:
    """The lock when every entry the effective manifest needs is current, and the sha256 of
    its file."""
    opened = settings.opened
    if not opened.current or opened.lock is None or opened.digest is None:
        return None
    return opened.lock, opened.digest


def check_lock(settings: Settings) -> Path:
    settings.opened.check()
    return settings.opened.path


def mirror_sync(settings: Settings, to: Path) -> Path:
    """Copy every source the (current) lock pins into the mirror directory `to`; returns its
    index.json."""
    if settings.mirror:
        raise ManifestError(f"--mirror {settings.mirror}: mirror.sync copies from upstream; "
                            "run it without --mirror.")
    settings.opened.check()
    applied = settings.opened.settled.manifest
    return mirror_mod.sync(applied, registry_for(settings, applied), source_cache(settings), to)


def fetch(settings: Settings, target: str) -> dict[str, Path]:
    planned = plan(settings, target, resolve=True)
    return source_cache(settings).materialize_all(planned.sources())


def check(settings: Settings) -> list[str]:
    """Validate the manifest, its lock and the compatibility rules, and plan every image it
    defines; returns report lines. Every rule violation is reported at once."""
    opened = settings.opened
    raw, path, current = opened.manifest, opened.path, opened.lock
    if settings.locked:
        opened.check()
    settled = locksettle.settle(raw, current, settings.registry,
                          local_id=local_ids(settings, "read"))
    pins = settled.pins()
    # The rules judge what will be built: the versions `lock --upgrade` moved to, too.
    judged = manifest_mod.with_versions(raw, settled.lock().versions(),
                                        registry=settings.registry)
    verdict = rules.enforce(judged, pins, registry=settings.registry)
    lines = [f"note: {note}" for note in compat.notes(judged, registry=settings.registry)]
    lines += verdict.lines()
    lines.append(f"lock: {path.name} " + _lock_state(current, settled))
    loaded = settled.manifest
    waiting = [f"{stage.name}: its lock pin {pin.entry} is resolved by `invoke lock`; plans "
               "need the lock" for stage in settings.registry.values() for pin in stage.lock_pins
               if pin.waits(raw) and pin.entry not in pins]
    if waiting:
        return lines + waiting
    loaded = prepare(loaded, settings.registry)
    graph = registry_for(settings, loaded)
    plans = [make_plan(loaded, t, graph) for t in defined_targets(loaded, graph)]
    warned = dict.fromkeys(w for planned in plans for w in planned.warnings())
    lines += [f"warning: {w}" for w in warned]
    lines += [f"{p.target}: {len(p.stages)} stages" for p in plans]
    return lines


def _lock_state(current: lockfile.Lock | None, settled: locksettle.Settled) -> str:
    if current is None:
        return "missing (run `invoke lock`)"
    if settled.stale or settled.unused:
        return f"has {locksettle.describe(settled)} (run `invoke lock`)"
    return "current"


def dockerfile(planned: Plan) -> str:
    return render_dockerfile(((s.name, s.recipe) for s in planned.stages),
                             manifest=str(planned.manifest.path), target=planned.target)


def bake(settings: Settings, planned: Plan) -> dict[str, Any]:
    """The docker-bake.json equivalent of building `planned` (render --format bake)."""
    cache = source_cache(settings)
    sources = {src.name: str(cache.path_for(src)) for src in planned.sources()}
    return standalone_bake(planned, sources=sources, tag=default_tag(planned),
                           labels=labels(planned))


def targets(settings: Settings) -> Sequence[str]:
    return list(settings.registry)


def is_image(settings: Settings, target: str) -> bool:
    return target in settings.registry and settings.registry[target].image


def image_targets(settings: Settings) -> list[str]:
    return [name for name, stage in settings.registry.items() if stage.image]

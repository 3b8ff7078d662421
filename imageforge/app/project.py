"""The engine's entry points for the front end: settle a manifest's pins, plan, render.

A command's `Workspace` opens its manifest and lock once (`opened`, a ManifestLock): every
function here asks that object instead of reading the files again."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from imageforge import log
from imageforge.app.workspace import Workspace
from imageforge.cache.artifacts import ArtifactStore
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
from imageforge.sources import lockfile, locksettle, pinned
from imageforge.sources import mirror as mirror_mod


def load_manifest(ws: Workspace, *, resolve: bool = False,
                  target: str | None = None) -> Manifest:
    """The manifest with --set overrides, its lock applied entry by entry, and the digest of
    the user's code. `resolve` (build, fetch): the lock's stale entries are resolved upstream
    for this run, only those of `target`'s stages when one is given; otherwise they stay
    unpinned, and their stages are keyed by location."""
    return prepare(settle(ws, resolve=resolve, target=target).manifest,
                   ws.registry)


def prepare(manifest: Manifest, registry: Mapping[str, Stage]) -> Manifest:
    """`manifest` with each stage's plan-time preparation applied (its `prepare` hook)."""
    tables = dict(manifest.stages)
    for name, table in manifest.stages.items():
        stage = registry.get(name)
        if stage is not None and stage.prepare is not None:
            tables[name] = dict(stage.prepare(table, manifest.path))
    return dataclasses.replace(manifest, stages=tables) if tables != manifest.stages else manifest


def settle(ws: Workspace, *, resolve: bool, target: str | None = None) -> locksettle.Settled:
    """The lock applied to the effective manifest, after every compatibility rule passed.
    With `target`, only its stages' entries are resolved upstream: a one-stage fetch from a
    mirror must not need every other upstream."""
    opened = ws.opened
    loaded, path, current = opened.manifest, opened.path, opened.lock
    local = ws.local_ids("record" if resolve else "read")
    settled = locksettle.settle(loaded, current, ws.registry, local_id=local)
    rule_verdict(settled.manifest, settled.pins(), ws.registry)
    if resolve:
        # Before anything is downloaded: the download would fail blamed on upstream.
        refuse_moved_pins(ws.manifest, ws.overrides,
                          registry=ws.registry)
    if ws.locked:
        opened.check()
    elif resolve and settled.unresolved:
        # Only now, after the rules passed: resolving may download.
        pinned.verify_commits(loaded, ws.registry, ws.sources.locate_url)
        # Resolution's modules (registries, git, the package index) load only when asked.
        from imageforge.sources import lockresolve

        resolver = lockresolve.Upstream(cache=ws.sources, stages=ws.registry)
        only = set(closure(target, ws.registry)) if target else None
        settled = locksettle.settle(loaded, current, ws.registry, resolver, local, only=only)
        rule_verdict(settled.manifest, settled.pins(), ws.registry)
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


def rule_verdict(manifest: Manifest, pins: rules.Pins,
                 registry: Mapping[str, Stage]) -> rules.Verdict:
    """Every compatibility rule on `manifest` as it will be built, with the lock's pins for
    this manifest (e.g. the NCCL its PyTorch pins); refuses (exit 3) every violation no
    waiver accepts."""
    return rules.enforce(manifest, pins, registry=registry)


def waived(ws: Workspace, manifest: Manifest) -> rules.Verdict:
    """What the waivers of `manifest` (as planned) accept, for `invoke plan`."""
    return rule_verdict(manifest, ws.opened.settled.pins(), ws.registry)


def default_target(ws: Workspace) -> str:
    """The image the manifest defines: what commands build without --target."""
    # Quietly: the command's own planning reports the lock and the rules.
    loaded = ws.opened.settled.manifest
    images = defined_targets(loaded, registry_for(ws, loaded))
    if len(images) == 1:
        return images[0]
    if images:
        raise UsageError(f"--target: {ws.manifest} defines {len(images)} images "
                         f"({', '.join(images)}); pass --target with one of them.")
    raise UsageError(f"--target: {ws.manifest} defines no whole image (none of "
                     f"{', '.join(image_targets(ws))} has every stage table it needs); pass "
                     "--target with the stage to use.")


def registry_for(ws: Workspace, manifest: Manifest) -> Mapping[str, Stage]:
    """The stage graph of `manifest` (without what an extended image already has)."""
    return extends.registry(ws.registry, manifest)


def plan(ws: Workspace, target: str, *, remote: Remote | None = None,
         resolve: bool = False) -> Plan:
    """The plan with each stage's status: in the local artifact store, in the remote one,
    or to be built. `resolve`: see load_manifest."""
    loaded = load_manifest(ws, resolve=resolve, target=target)
    planned = make_plan(loaded, target, registry_for(ws, loaded))
    return with_statuses(planned, ws.store, remote)


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


def write_lock(ws: Workspace, *, upgrade: bool,
               stages: Sequence[str] = ()) -> tuple[Path, list[str]]:
    """Resolve and write the lock; returns its path and what changed. `upgrade` moves the
    stages with a version policy (only `stages`, when given) to their newest allowed release."""
    if ws.mirror:
        raise ManifestError(f"--mirror {ws.mirror}: a lock is resolved against upstream "
                            "and a mirror holds only what a lock already pins; run `invoke lock` "
                            "without --mirror.")
    loaded = manifest_mod.load(ws.manifest, ws.overrides, registry=ws.registry)
    path = lockfile.lock_path(ws.manifest)
    # A lock an older imageforge wrote is replaced whole.
    previous = lockfile.read(path, old_ok=True)
    # Before anything is downloaded; PyTorch's NCCL pin is judged once it is resolved.
    rules.enforce(manifest_mod.with_versions(loaded, previous.versions() if previous else {},
                                             registry=ws.registry), None,
                  registry=ws.registry)
    pinned.verify_commits(loaded, ws.registry, ws.sources.locate_url)
    from imageforge.sources import lockresolve

    settled = lockresolve.resolve(loaded, ws.registry, ws.sources, previous,
                                  upgrade=upgrade, only=stages, local_id=ws.local_ids("refresh"))
    new = settled.lock()
    rules.enforce(manifest_mod.with_versions(loaded, new.versions(), registry=ws.registry),
                  new.pins(), registry=ws.registry)
    changes = lockfile.diff(previous, new, ws.registry)
    # Same pins, same creation time: only a moved pin gives images a new date.
    moved = previous is None or lockfile.pins_moved(previous, new)
    kept = previous.source_date_epoch if previous and not moved else None
    new = dataclasses.replace(new, source_date_epoch=kept or int(time.time()))
    # An unchanged lock is left untouched, byte for byte (a committed one stays clean).
    if not path.exists() or path.read_text() != lockfile.text(new, loaded):
        lockfile.write(path, new, loaded)
        ws.reopen()
    return path, changes


def current_lock(ws: Workspace) -> tuple[lockfile.Lock, str] | None:
    """The lock when every entry the effective manifest needs is current, and the sha256 of
    its file."""
    opened = ws.opened
    if not opened.current or opened.lock is None or opened.digest is None:
        return None
    return opened.lock, opened.digest


def check_lock(ws: Workspace) -> Path:
    ws.opened.check()
    return ws.opened.path


def mirror_sync(ws: Workspace, to: Path) -> Path:
    """Copy every source the (current) lock pins into the mirror directory `to`; returns its
    index.json."""
    if ws.mirror:
        raise ManifestError(f"--mirror {ws.mirror}: mirror.sync copies from upstream; "
                            "run it without --mirror.")
    ws.opened.check()
    applied = ws.opened.settled.manifest
    return mirror_mod.sync(applied, registry_for(ws, applied), ws.sources, to)


def fetch(ws: Workspace, target: str) -> dict[str, Path]:
    planned = plan(ws, target, resolve=True)
    return ws.sources.materialize_all(planned.sources())


def check(ws: Workspace) -> list[str]:
    """Validate the manifest, its lock and the compatibility rules, and plan every image it
    defines; returns report lines. Every rule violation is reported at once."""
    opened = ws.opened
    raw, path, current = opened.manifest, opened.path, opened.lock
    if ws.locked:
        opened.check()
    settled = locksettle.settle(raw, current, ws.registry,
                          local_id=ws.local_ids("read"))
    pins = settled.pins()
    # The rules judge what will be built: the versions `lock --upgrade` moved to, too.
    judged = manifest_mod.with_versions(raw, settled.lock().versions(),
                                        registry=ws.registry)
    verdict = rules.enforce(judged, pins, registry=ws.registry)
    lines = [f"note: {note}" for note in compat.notes(judged, registry=ws.registry)]
    lines += verdict.lines()
    lines.append(f"lock: {path.name} " + _lock_state(current, settled))
    loaded = settled.manifest
    waiting = [f"{stage.name}: its lock pin {pin.entry} is resolved by `invoke lock`; plans "
               "need the lock" for stage in ws.registry.values() for pin in stage.lock_pins
               if pin.waits(raw) and pin.entry not in pins]
    if waiting:
        return lines + waiting
    loaded = prepare(loaded, ws.registry)
    graph = registry_for(ws, loaded)
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


def bake(ws: Workspace, planned: Plan) -> dict[str, Any]:
    """The docker-bake.json equivalent of building `planned` (render --format bake)."""
    cache = ws.sources
    sources = {src.name: str(cache.path_for(src)) for src in planned.sources()}
    return standalone_bake(planned, sources=sources, tag=default_tag(planned),
                           labels=labels(planned))


def targets(ws: Workspace) -> Sequence[str]:
    return list(ws.registry)


def is_image(ws: Workspace, target: str) -> bool:
    return target in ws.registry and ws.registry[target].image


def image_targets(ws: Workspace) -> list[str]:
    return [name for name, stage in ws.registry.items() if stage.image]

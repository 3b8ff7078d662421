"""Settling: a manifest with its lock applied entry by entry (the file: lockfile.py).

As in Cargo.lock, an entry applies whenever its "from" still matches the effective manifest
(file + --set overrides), whatever else changed; only the entries whose "from" changed are
stale, and only they are resolved again, by a Resolver (lockresolve.Upstream asks upstream).
Another kind of pin is one more section in SETTLED and one more step of `settle`
(`_Walk.pin` with the entry's path, its "from" and how to resolve it).

Machine-local facts (a local-only base image's ID) are never in the lock: they live in the
local cache (imageforge/cache/localimages.py), so a committed lock stays the same on every
machine.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence, Set
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from imageforge.errors import LockError
from imageforge.model import extends, lockpin
from imageforge.model.dag import closure
from imageforge.model.inputs import defined_targets, stage_inputs
from imageforge.model.manifest import Manifest, with_versions
from imageforge.model.sourcetypes import Source, UrlSource
from imageforge.model.stage import Context, Stage
from imageforge.sources import piplock
from imageforge.sources.lockfile import (
    BASE,
    EXTENDS,
    PIP,
    STAGES,
    UPGRADED,
    Entry,
    EntryPath,
    Lock,
    name,
)

if TYPE_CHECKING:
    # Only the Resolver's signature names it: settling asks no upstream itself.
    from imageforge.sources import upstream

# The sections `settle` walks, besides each stage's lock pins (imageforge.model.lockpin). Entries of
# any other section (a kind a newer imageforge adds) are carried over unchanged.
SETTLED = (BASE[0], EXTENDS[0], UPGRADED, STAGES, PIP)


def defined_stages(manifest: Manifest, registry: Mapping[str, Stage]) -> list[str]:
    """Every stage the manifest's image targets need (what a lock must cover)."""
    names: list[str] = []
    for target in defined_targets(manifest, registry):
        names.extend(n for n in closure(target, registry) if n not in names)
    return names


class Resolver(Protocol):
    """Finds pins upstream; `settle` asks it only for what the lock cannot answer."""

    @property
    def revisit(self) -> bool:
        """True for `invoke lock`: current entries are checked against upstream too."""
        ...

    def renewed(self, manifest: Manifest, names: Sequence[str]) -> list[str]:
        """The stages whose pins `lock --upgrade` resolves anew (none otherwise)."""
        ...

    def upgrades(self, manifest: Manifest, registry: Mapping[str, Stage],
                 names: Sequence[str]) -> list[upstream.Upgrade]: ...

    def source(self, source: Source, old: Entry | None) -> dict[str, Any]: ...

    def base(self, ref: str, old: Entry | None) -> dict[str, Any]: ...

    def extended(self, manifest: Manifest, old: Entry | None) -> dict[str, Any]: ...

    def lock_pin(self, pin: lockpin.LockPin, manifest: Manifest,
                 registry: Mapping[str, Stage], old: Entry | None) -> Mapping[str, Any]: ...

    def pip(self, stage: str, origin: Mapping[str, Any], old: Entry | None
            ) -> dict[str, Any]: ...


# A base image's local ID on this machine, when no registry digest pins it.
LocalId = Callable[[str], str | None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settled:
    """The manifest with every pin the lock (or the resolver) gave, and how the lock fared."""

    manifest: Manifest
    entries: Mapping[EntryPath, Entry]
    # Entries the lock lacked or whose "from" changed (resolved when there was a resolver).
    stale: tuple[EntryPath, ...]
    # Stale entries still without a pin: no resolver was given.
    unresolved: tuple[EntryPath, ...]
    # Entries of the lock that the manifest no longer needs.
    unused: tuple[EntryPath, ...]

    def lock(self) -> Lock:
        return Lock(entries=dict(self.entries))

    def pins(self) -> dict[str, Mapping[str, Any]]:
        return self.lock().pins()


class _Walk:
    """Goes through the entries a manifest needs, in the order their "from" is known."""

    def __init__(self, lock: Lock | None, resolver: Resolver | None,
                 resolvable: Callable[[EntryPath], bool] = lambda _path: True) -> None:
        self.old = dict(lock.entries) if lock else {}
        self.resolver = resolver
        # Entries the resolver may be asked for (those of one target's stages).
        self.resolvable = resolvable
        self.entries: dict[EntryPath, Entry] = {}
        self.stale: list[EntryPath] = []
        self.unresolved: list[EntryPath] = []
        # Stages whose sources are settled (a stage waiting on a lock pin, like NCCL "auto"
        # on PyTorch's commit, comes later).
        self.done: set[str] = set()

    def forget(self, keep: Callable[[EntryPath], bool]) -> None:
        self.old = {path: entry for path, entry in self.old.items() if keep(path)}

    def current(self, path: EntryPath, origin: Mapping[str, Any],
                known: Mapping[str, Any] | None = None) -> Entry | None:
        old = self.old.get(path)
        if old is None or old.origin != origin or (known is not None and old.pin != known):
            self.stale.append(path)
            return None
        return old

    def pin(self, path: EntryPath, origin: Mapping[str, Any],
            resolve: Callable[[Resolver, Entry | None], Mapping[str, Any]],
            known: Mapping[str, Any] | None = None) -> Mapping[str, Any] | None:
        """The pin of `path`: `known` when the manifest gives it, the lock's when its entry
        is current, else the resolver's (None without one)."""
        current = self.current(path, origin, known)
        if known is not None:
            pin = known
        elif current is not None and not (self.resolver and self.resolver.revisit):
            pin = current.pin
        elif self.resolver is not None and self.resolvable(path):
            pin = resolve(self.resolver, current)
        else:
            self.unresolved.append(path)
            return None
        self.entries[path] = Entry(origin=dict(origin), pin=dict(pin))
        return pin

    def missing(self, path: EntryPath) -> None:
        """An entry whose "from" cannot be known yet (it needs an unresolved pin)."""
        self.stale.append(path)
        self.unresolved.append(path)


def settle(manifest: Manifest, lock: Lock | None, stages: Mapping[str, Stage],
           resolver: Resolver | None = None, local_id: LocalId | None = None, *,
           only: Set[str] | None = None) -> Settled:
    """`manifest` with its lock applied entry by entry. Stale entries are resolved by
    `resolver` (only those of the stages in `only`, when given), or left unpinned without one
    (plans then key those stages by location)."""
    owners = {pin.entry: name for name, stage in stages.items() for pin in stage.lock_pins}

    def resolvable(path: EntryPath) -> bool:
        if only is None:
            return True
        if path[0] in (STAGES, PIP, UPGRADED):
            return path[1] in only
        owner = owners.get(path[0])   # a stage's lock pin; base and extends are everyone's
        return owner is None or owner in only

    walk = _Walk(lock, resolver, resolvable)
    manifest = _settle_extends(walk, manifest)
    registry = extends.registry(stages, manifest)
    names = defined_stages(manifest, registry)
    manifest = _settle_upgrades(walk, manifest, registry, names)
    manifest = _settle_base(walk, manifest)
    if local_id and not manifest.image.get("base_digest") \
            and not manifest.image.get("base_image_id"):
        found = local_id(str(manifest.image["base"]))
        if found:
            manifest = dataclasses.replace(manifest,
                                           image={**manifest.image, "base_image_id": found})
    manifest = _settle_sources(walk, manifest, registry, names)
    manifest = _settle_lock_pins(walk, manifest, registry, names)
    manifest = _settle_sources(walk, manifest, registry, names)
    manifest = _settle_pip(walk, manifest, registry, names)
    settled = (*SETTLED, *lockpin.declared(stages))
    for path, entry in (lock.entries if lock else {}).items():
        if path[0] not in settled:
            walk.entries[path] = entry
    unused = tuple(path for path in (lock.entries if lock else {}) if path not in walk.entries
                   and path not in walk.stale)
    return Settled(manifest=manifest, entries=walk.entries, stale=tuple(dict.fromkeys(walk.stale)),
                   unresolved=tuple(dict.fromkeys(walk.unresolved)), unused=unused)


def _settle_extends(walk: _Walk, manifest: Manifest) -> Manifest:
    ref = manifest.image.get("extends")
    if not ref:
        return manifest
    pin = walk.pin(EXTENDS, {"ref": ref}, lambda r, old: r.extended(manifest, old))
    if pin is None:
        return manifest
    return extends.with_provides(manifest, pin["provides"], pin)


def _settle_upgrades(walk: _Walk, manifest: Manifest, registry: Mapping[str, Stage],
                     names: Sequence[str]) -> Manifest:
    """The versions `lock --upgrade` moved to, where the manifest's version and policy are
    still those they were moved from; a stale move is dropped (the manifest's version wins)."""
    renewed = walk.resolver.renewed(manifest, names) if walk.resolver else []
    if renewed:
        walk.forget(lambda path: not (len(path) > 1 and path[0] in (UPGRADED, STAGES, PIP)
                                      and path[1] in renewed))
        if set(renewed) == set(names):
            walk.forget(lambda path: path != BASE)  # every pin, the base's too
    found = {move.stage: move for move in walk.resolver.upgrades(manifest, registry, renewed)} \
        if walk.resolver and renewed else {}
    versions: dict[str, str] = {}
    for stage in names:
        origin = _upgrade_origin(manifest, stage)
        path = (UPGRADED, stage)
        if stage in found:
            move = found[stage]
            walk.stale.append(path)
            walk.entries[path] = Entry(origin=origin, pin={"to": move.new,
                                                           "source": move.source})
        elif path in walk.old and walk.current(path, origin):
            walk.entries[path] = walk.old[path]
        else:
            continue
        versions[stage] = str(walk.entries[path].pin["to"])
    return with_versions(manifest, versions, registry=registry)


def _upgrade_origin(manifest: Manifest, stage: str) -> dict[str, Any]:
    table = manifest.stages.get(stage, {})
    return {"version": str(table.get("version")), "policy": table.get("policy")}


def _settle_base(walk: _Walk, manifest: Manifest) -> Manifest:
    if manifest.image.get("extends"):
        return manifest  # the extends entry pins it
    ref = str(manifest.image["base"])
    given = manifest.image.get("base_digest")
    pin = walk.pin(BASE, {"ref": ref}, lambda r, old: r.base(ref, old),
                   known={"digest": given} if given else None)
    digest = (pin or {}).get("digest")
    if not digest or given:
        return manifest
    return dataclasses.replace(manifest, image={**manifest.image, "base_digest": digest})


def _settle_sources(walk: _Walk, manifest: Manifest, registry: Mapping[str, Stage],
                    names: Sequence[str]) -> Manifest:
    """Every source's pin, for the stages whose sources are known (not those waiting on a
    lock pin yet)."""
    stages = {stage: dict(values) for stage, values in manifest.stages.items()}
    for stage in names:
        if stage in walk.done or _waits(manifest, registry[stage]):
            continue
        walk.done.add(stage)
        inputs = stage_inputs(manifest, registry[stage], stage)
        for source in registry[stage].sources(Context(image=manifest.image,
                                                      stages={stage: inputs})):
            pin = walk.pin((STAGES, stage, source.name), _origin(source), _resolving(source),
                           _known(source))
            if pin is not None:
                values = stages.setdefault(stage, _defaults(registry[stage]))
                _fill(values, source, pin)
    return dataclasses.replace(manifest, stages=stages)


def _resolving(source: Source) -> Callable[[Resolver, Entry | None], Mapping[str, Any]]:
    return lambda resolver, old: resolver.source(source, old)


def _waits(manifest: Manifest, stage: Stage) -> bool:
    return any(pin.waits(manifest) for pin in stage.lock_pins)


def _origin(source: Source) -> dict[str, str]:
    if isinstance(source, UrlSource):
        return {"url": source.url}
    return {"repo": source.repo, "ref": source.ref}


def _known(source: Source) -> dict[str, str] | None:
    """The pin the manifest itself gives a source, if any."""
    if isinstance(source, UrlSource):
        return {"sha256": source.sha256} if source.sha256 else None
    return {"commit": source.commit} if source.commit else None


def _defaults(stage: Stage) -> dict[str, Any]:
    return {key: field.default for key, field in stage.fields.items()}


def _fill(values: dict[str, Any], source: Source, pin: Mapping[str, Any]) -> None:
    key = source.pin_key if isinstance(source, UrlSource) else "commit"
    value = pin.get("sha256") if isinstance(source, UrlSource) else pin.get("commit")
    if value and not values.get(key):
        values[key] = value


def _settle_pip(walk: _Walk, manifest: Manifest, registry: Mapping[str, Stage],
                names: Sequence[str]) -> Manifest:
    """Each stage's pip requirements with every dependency, at exact versions and hashes
    (imageforge.sources.piplock); the entry is stale when the requirements, Python or
    platform move."""
    context = piplock.context(manifest, registry)
    stages = {stage: dict(values) for stage, values in manifest.stages.items()}
    for stage in names:
        wanted = piplock.requirements(registry[stage], context)
        if not wanted:
            continue
        origin = piplock.origin(wanted, manifest.image, context.of(stage).get("index"))
        pin = walk.pin((PIP, stage), origin, functools.partial(_resolve_pip, stage, origin))
        if pin is not None:
            values = stages.setdefault(stage, _defaults(registry[stage]))
            values[piplock.INPUT] = [dict(p) for p in pin["packages"]]
    return dataclasses.replace(manifest, stages=stages)


def _resolve_pip(stage: str, origin: Mapping[str, Any], resolver: Resolver,
                 old: Entry | None) -> Mapping[str, Any]:
    return resolver.pip(stage, origin, old)


def _settle_lock_pins(walk: _Walk, manifest: Manifest, registry: Mapping[str, Stage],
                      names: Sequence[str]) -> Manifest:
    """Each stage's lock pins (imageforge.model.lockpin) whose stages are all in the image, each
    applied to the manifest once known."""
    for stage in names:
        for pin in registry[stage].lock_pins:
            if not all(read in names for read in pin.reads):
                continue
            origin = pin.origin(manifest, registry)
            if origin is None:
                walk.missing((pin.entry,))
                continue
            found = walk.pin((pin.entry,), origin,
                             functools.partial(_resolve_lock_pin, pin, manifest, registry))
            if found is not None:
                manifest = pin.apply(manifest, found)
    return manifest


def _resolve_lock_pin(pin: lockpin.LockPin, manifest: Manifest, registry: Mapping[str, Stage],
                      resolver: Resolver, old: Entry | None) -> Mapping[str, Any]:
    return resolver.lock_pin(pin, manifest, registry, old)


def apply(manifest: Manifest, lock: Lock | None, registry: Mapping[str, Stage]) -> Manifest:
    """The manifest with the lock's current entries applied; stale ones are left unpinned."""
    return settle(manifest, lock, registry).manifest


def check(manifest: Manifest, lock: Lock | None, path: Path, *,
          registry: Mapping[str, Stage], settled: Settled | None = None) -> None:
    """Refuse a missing lock, or one with stale entries, naming each (what `lock --check`
    and `build --locked` do). `settled`: the lock already applied to the manifest."""
    if lock is None:
        raise LockError(f"{path}: no lock file for {manifest.path}; run `invoke lock`.")
    settled = settled or settle(manifest, lock, registry)
    if settled.stale or settled.unused:
        raise LockError(f"{path} is stale for {manifest.path} (with its --set overrides): "
                        f"{describe(settled)}; run `invoke lock` with the same overrides.")


def describe(settled: Settled) -> str:
    """The stale and unused entries, in words."""
    parts = []
    if settled.stale:
        parts.append("stale entries " + ", ".join(name(p) for p in settled.stale))
    if settled.unused:
        parts.append("unused entries " + ", ".join(name(p) for p in settled.unused))
    return "; ".join(parts)

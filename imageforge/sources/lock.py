"""Lock files: every pin a manifest leaves to resolution, recorded beside it entry by entry.

`<manifest>.lock.json` holds entries. Each is one resolved pin with what it was resolved from
(its "from"): a source's sha256 (from its url) or commit (from its repo and ref), the base
image's registry digest (from its reference), each stage's lock-time pins (imageforge.model.lockpin:
e.g. the NCCL that PyTorch's commit pins), the extended image (from its reference), and the
versions `lock --upgrade` moved to (from the manifest's version and policy). As in Cargo.lock,
an entry applies whenever its "from" still matches the effective manifest (file + --set overrides),
whatever else changed; only the entries whose "from" changed are stale, and only they are
resolved again. A lock file is written whole or not at all.

Entries sit in the JSON at paths (`stages.efa.src-efa`, `base`, `upgraded.efa`): a dict with
a "from" key is an entry. Another kind of pin is one more section in SETTLED and one more step
of `settle` (`_Walk.pin` with the entry's path, its "from" and how to resolve it); reading,
writing, staleness and `diff` need nothing new.

Machine-local facts (a local-only base image's ID) are never in the lock: they live in the
local cache (imageforge/cache/localimages.py), so a committed lock stays the same on every machine.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence, Set
from pathlib import Path
from typing import Any, Protocol

from imageforge import jsonfile
from imageforge.cmd import run
from imageforge.errors import DockerError, FatalError, LockError, ManifestError
from imageforge.model import extends, lockpin
from imageforge.model.dag import closure
from imageforge.model.inputs import defined_targets, stage_inputs
from imageforge.model.manifest import Manifest, with_versions
from imageforge.model.sourcetypes import GitSource, Source, UrlSource
from imageforge.model.stage import Context, Stage
from imageforge.sources import extended, gitsource, lockcheck, piplock, tarcheck, upstream
from imageforge.sources.download import download
from imageforge.sources.sources import SourceCache
from imageforge.textsafe import escaped, redact, shown

FORMAT = 2
# Keys of the file that are not entries.
HEADER = ("format", "manifest", "source_date_epoch")

EntryPath = tuple[str, ...]
BASE: EntryPath = ("base",)
EXTENDS: EntryPath = ("extends",)
UPGRADED = "upgraded"
STAGES = "stages"
# The sections `settle` walks, besides each stage's lock pins (imageforge.model.lockpin). Entries of
# any other section (a kind a newer imageforge adds) are carried over unchanged.
PIP = "pip"
SETTLED = (BASE[0], EXTENDS[0], UPGRADED, STAGES, PIP)
# How long a registry may take to tell the base image's digest before it counts as offline.
BASE_DIGEST_TIMEOUT_S = 30


def lock_path(manifest_path: Path) -> Path:
    return manifest_path.with_name(manifest_path.stem + ".lock.json")


def name(path: EntryPath) -> str:
    """An entry as messages name it: `stages.efa.src-efa`. Its parts are a lock file's keys,
    which may hold any character: each is escaped and cut short."""
    return ".".join(escaped(part) for part in path)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
    """One resolved pin and what it was resolved from."""

    origin: Mapping[str, Any]
    pin: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"from": dict(self.origin), **self.pin}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lock:
    entries: Mapping[EntryPath, Entry]
    # When these pins were first resolved: images built from this lock carry it as their
    # creation time (SOURCE_DATE_EPOCH), so the same pins give the same image config.
    source_date_epoch: int | None = None

    def to_json(self, manifest: Manifest) -> dict[str, Any]:
        data: dict[str, Any] = {"format": FORMAT, "manifest": manifest.path.name,
                                "source_date_epoch": self.source_date_epoch}
        for path, entry in sorted(self.entries.items()):
            node = data
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = entry.to_json()
        return data

    def section(self, prefix: str) -> dict[str, Entry]:
        """The entries under `prefix` by their next path part (e.g. upgraded -> stage)."""
        return {path[1]: entry for path, entry in self.entries.items()
                if len(path) == 2 and path[0] == prefix}

    def versions(self) -> dict[str, str]:
        """stage -> the version `lock --upgrade` moved it to."""
        return {stage: str(entry.pin["to"]) for stage, entry in self.section(UPGRADED).items()}

    def pins(self) -> dict[str, Mapping[str, Any]]:
        """The pins of the entries that are sections of their own (base, extends and the
        stages' lock pins), by section."""
        return {path[0]: entry.pin for path, entry in self.entries.items() if len(path) == 1}



def read(path: Path, *, old_ok: bool = False) -> Lock | None:
    """The lock at `path`, None when there is none (or, with `old_ok`, when an older
    imageforge wrote it: `invoke lock` replaces it)."""
    if not path.exists():
        return None
    try:
        data = jsonfile.load(path)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise LockError(f"{path}: not a valid imageforge lock file ({exc}); delete it and run "
                        "`invoke lock`.") from None
    if data.get("format") != FORMAT:
        if old_ok:
            return None
        raise LockError(f"{path} is in lock format {shown(data.get('format'))}, not {FORMAT}; run "
                        "`invoke lock` to rewrite it.")
    try:
        entries = dict(_entries(data, ()))
    except (ValueError, KeyError, TypeError) as exc:
        raise LockError(f"{path}: not a valid imageforge lock file ({exc}); delete it and run "
                        "`invoke lock`.") from None
    epoch = lockcheck.epoch_problem(data.get("source_date_epoch"))
    if epoch:
        raise LockError(f"{path}: {epoch}; delete the key and run `invoke lock`.")
    for entry_path, entry in entries.items():
        found = lockcheck.problem(entry.pin, entry_path[0])
        if found:
            key, why = found
            raise LockError(f"{path}: {name(entry_path)}.{key}: {why}; a lock holds only what "
                            "`invoke lock` writes: delete that entry and run `invoke lock`.")
    return Lock(entries=entries, source_date_epoch=data.get("source_date_epoch"))


def _entries(node: Mapping[str, Any], at: EntryPath) -> list[tuple[EntryPath, Entry]]:
    found = []
    for key, value in node.items():
        if not at and key in HEADER:
            continue
        if not isinstance(value, dict):
            raise ValueError(f"{name((*at, key))} is not a table")
        if "from" in value:
            if not isinstance(value["from"], dict):
                raise ValueError(f"{name((*at, key))}.from is not a table")
            pin = {k: v for k, v in value.items() if k != "from"}
            found.append(((*at, key), Entry(origin=value["from"], pin=pin)))
        else:
            found += _entries(value, (*at, key))
    return found


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Upstream:
    """The resolver that asks upstream: registries, git servers, download URLs."""

    cache: SourceCache
    stages: Mapping[str, Stage]
    revisit: bool = False
    upgrade: bool = False
    # With `upgrade`: the stages to move (every one when empty).
    only: Sequence[str] = ()
    endpoints: upstream.Endpoints | None = None

    def renewed(self, manifest: Manifest, names: Sequence[str]) -> list[str]:
        if not self.upgrade:
            return []
        unknown = [n for n in self.only if n not in names]
        if unknown:
            raise ManifestError(f"--stage {unknown[0]}: {manifest.path} defines no such "
                                f"stage; use one of {', '.join(names)}.")
        return list(self.only) or list(names)

    def upgrades(self, manifest: Manifest, registry: Mapping[str, Stage],
                 names: Sequence[str]) -> list[upstream.Upgrade]:
        endpoints = self.endpoints or upstream.Endpoints(locate=self.cache.locate_url)
        return upstream.upgrades(manifest, registry, names, endpoints)

    def source(self, source: Source, old: Entry | None) -> dict[str, Any]:
        if isinstance(source, UrlSource):
            if old and old.pin.get("sha256"):
                return dict(old.pin)
            return {"sha256": _hash_into_cache(source, self.cache)}
        return {"commit": _resolve_git(source, old, self.cache)}

    def base(self, ref: str, old: Entry | None) -> dict[str, Any]:
        return dict(old.pin) if old else {"digest": _base_digest(ref)}

    def extended(self, manifest: Manifest, old: Entry | None) -> dict[str, Any]:
        del old     # an extended image is asked for again every time: its tag may move
        return _inspect_extended(manifest, self.stages)

    def lock_pin(self, pin: lockpin.LockPin, manifest: Manifest,
                 registry: Mapping[str, Stage], old: Entry | None) -> Mapping[str, Any]:
        if old:
            return dict(old.pin)
        return dict(pin.resolve(manifest, registry, lockpin.Upstream(
            locate=self.cache.locate_url, mirrors=self.cache.root / "mirrors")))

    def pip(self, stage: str, origin: Mapping[str, Any], old: Entry | None
            ) -> dict[str, Any]:
        if old:
            return dict(old.pin)
        index = origin.get("index") or \
            (self.endpoints or upstream.Endpoints()).pypi.rstrip("/") + "/simple"
        return {"packages": piplock.resolve(
            stage, origin["requirements"], python=origin["python"],
            platform=origin["platform"], index_url=index)}


def _inspect_extended(manifest: Manifest, stages: Mapping[str, Stage]) -> dict[str, Any]:
    """The extended image as the lock records it: its registry digest (a local image's ID is
    a fact of this machine, kept out of the lock) and the stages it provides, from its labels
    unless the manifest declares them."""
    ref = str(manifest.image["extends"])
    declared = extends.provided(manifest)
    try:
        found = extended.inspect(ref, stages)
    except DockerError:
        if declared is None:
            raise
        # Declared by hand: an image this host cannot see is still buildable on one that can.
        return {"digest": None, "provides": list(declared), "versions": {}}
    extends.check_versions(manifest, found.versions)
    names = declared if declared is not None else found.provides
    return {"digest": None if found.local else found.digest, "provides": list(names),
            "versions": dict(found.versions)}


def resolve(manifest: Manifest, stages: Mapping[str, Stage], cache: SourceCache,
            previous: Lock | None, *, upgrade: bool, only: Sequence[str] = (),
            endpoints: upstream.Endpoints | None = None,
            local_id: LocalId | None = None) -> Settled:
    """What `invoke lock` writes: the previous lock's current entries, checked against
    upstream; its stale ones and those of the stages being upgraded (`only`, or every one,
    when `upgrade`), resolved anew."""
    resolver = Upstream(cache=cache, stages=stages, revisit=True, upgrade=upgrade, only=only,
                        endpoints=endpoints)
    return settle(manifest, previous, stages, resolver, local_id)


def _resolve_git(source: GitSource, old: Entry | None, cache: SourceCache) -> str:
    current = gitsource.resolve_ref(cache.locate_url(source.repo), source.ref)
    if old and old.pin.get("commit") != current:
        raise LockError(
            f"{source.repo} {source.ref} now points to {current}, but the lock says "
            f"{old.pin.get('commit')}; if the move is expected run `invoke lock --upgrade`, "
            "otherwise pin `commit` in the manifest.")
    return current


def _hash_into_cache(source: UrlSource, cache: SourceCache) -> str:
    """Download an unpinned file once to learn its digest, keeping it in the source cache so
    the build that follows does not fetch it again."""
    cache.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache.root) as tmp:
        file = Path(tmp) / source.filename
        digest = download(cache.locate_url(source.url), file, sha256=None)
        # Checked here too, where the refusal can name the upstream URL, not this temp file.
        if tarcheck.is_tarball(source.filename):
            tarcheck.check(file, source=source.name, origin=redact(source.url))
        cache.materialize(dataclasses.replace(source, url=str(file), sha256=digest))
    return digest


def _base_digest(ref: str, *, timeout: float = BASE_DIGEST_TIMEOUT_S) -> str | None:
    """The registry digest of the base image, or None when no registry answers (offline,
    or a local-only image, or not within `timeout` seconds)."""
    if "@sha256:" in ref:
        return ref.split("@", 1)[1]
    try:
        result = run(["docker", "buildx", "imagetools", "inspect", ref, "--format",
                      "{{json .Manifest.Digest}}"], timeout=timeout)
    except (FatalError, OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    digest = json.loads(result.stdout or b"null")
    return digest if isinstance(digest, str) and digest.startswith("sha256:") else None


def text(lock: Lock, manifest: Manifest) -> str:
    return json.dumps(lock.to_json(manifest), indent=2) + "\n"


def write(path: Path, lock: Lock, manifest: Manifest) -> None:
    """Atomic: the lock file is replaced whole or left as it was."""
    jsonfile.write_text(path, text(lock, manifest))


def pins_moved(old: Lock | None, new: Lock) -> bool:
    """True when some pin differs (not merely where it was resolved from)."""
    before = old.entries if old else {}
    return any(before.get(path, Entry(origin={}, pin={})).pin != entry.pin
               for path, entry in new.entries.items()) or bool(set(before) - set(new.entries))


def diff(old: Lock | None, new: Lock, registry: Mapping[str, Stage] | None = None
         ) -> list[str]:
    """Human lines describing what changed between two locks, entry by entry; a stage's lock
    pin in `registry` is described in its own words."""
    before = old.entries if old else {}
    described = lockpin.declared(registry or {})
    lines = []
    for path in sorted(set(before) | set(new.entries)):
        a, b = before.get(path), new.entries.get(path)
        if a == b:
            continue
        if a is not None and b is not None and a.pin == b.pin:
            lines.append(f"{name(path)}: same pin, now from {_words(b.origin)}")
        else:
            lines.append(_pin_line(path, a, b, described))
    return lines


def _pin_line(path: EntryPath, a: Entry | None, b: Entry | None,
              described: Mapping[str, lockpin.LockPin]) -> str:
    if path[0] == STAGES:
        return f"{path[1]}: {path[2]} {_pin(a)} -> {_pin(b)}"
    if path[0] == UPGRADED:
        if b is None:
            assert a is not None
            return f"{path[1]}: {a.pin['to']} -> {a.origin['version']} (the manifest's version)"
        start = a.pin["to"] if a else b.origin["version"]
        return f"{path[1]}: {start} -> {b.pin['to']} (policy {b.origin['policy']})"
    if path[0] == PIP:
        return f"{path[1]}: pip " + piplock.moves(a.pin if a else {}, b.pin if b else {})
    if len(path) == 1 and path[0] in described:
        return described[path[0]].describe(a.pin if a else None, b.pin if b else None)
    return f"{name(path)}: {_pin(a)} -> {_pin(b)}"


def _pin(entry: Entry | None) -> str:
    if entry is None:
        return "(none)"
    pin = entry.pin
    return str(pin.get("commit") or pin.get("sha256") or pin.get("digest") or _words(pin))


def _words(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items() if not isinstance(v, dict | list))

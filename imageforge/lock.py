"""Lock files: every input a manifest leaves to resolution, recorded beside it.

`<manifest>.lock.json` holds the sha256 of each downloaded file, the commit of each git ref,
the base image digest when a registry answers, and the digest of the effective manifest
(file + --set overrides) it was resolved from. A lock is written whole or not at all.

`lock --upgrade` also moves stages that have a version `policy` to the newest release it
allows. The manifest file is not rewritten: the lock records each move under "upgraded"
(from, to, policy and the listing it came from) and `apply` builds the moved version, so a
nightly can run `lock --upgrade` and diff the lock against the last one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from imageforge import extends, gitsource, tarcheck, upstream
from imageforge.cmd import run
from imageforge.compat import image_cuda
from imageforge.dag import closure
from imageforge.docker import local_image
from imageforge.download import download, redact
from imageforge.errors import FatalError, LockError, ManifestError
from imageforge.manifest import Manifest, with_versions
from imageforge.ncclpin import NcclPin, pytorch_nccl_pin
from imageforge.sources import GitSource, Source, SourceCache, UrlSource
from imageforge.stage import Context, Stage

FORMAT = 1


def lock_path(manifest_path: Path) -> Path:
    return manifest_path.with_name(manifest_path.stem + ".lock.json")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lock:
    manifest_digest: str
    base_digest: str | None
    # stage -> source name -> {"url"/"repo", "sha256"/"ref"+"commit"}
    sources: Mapping[str, Mapping[str, Mapping[str, str]]]
    # The NCCL the locked PyTorch pins: {"version", "commit", "evidence": {...}}.
    nccl_pin: Mapping[str, Any] | None = None
    # stage -> {"from", "to", "policy", "source"}: versions `lock --upgrade` moved.
    upgraded: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    # When these pins were first resolved: images built from this lock carry it as their
    # creation time (SOURCE_DATE_EPOCH), so the same pins give the same image config.
    source_date_epoch: int | None = None
    # The local image ID of a base image no registry has (built here, like the sample's):
    # it pins the keys, so stages built on an older image of the same tag are not reused.
    base_image_id: str | None = None
    # image.extends: {"ref", "digest", "provides", "versions"} as its labels said.
    extends: Mapping[str, Any] | None = None

    def to_json(self, manifest: Manifest) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "manifest": manifest.path.name,
            "manifest_digest": self.manifest_digest,
            "source_date_epoch": self.source_date_epoch,
            "base": {"ref": manifest.image["base"], "digest": self.base_digest,
                     **({"id": self.base_image_id} if self.base_image_id else {})},
            "nccl_pytorch_pin": dict(self.nccl_pin) if self.nccl_pin else None,
            **({"extends": dict(self.extends)} if self.extends else {}),
            "upgraded": {k: dict(v) for k, v in sorted(self.upgraded.items())},
            "stages": {k: dict(v) for k, v in sorted(self.sources.items())},
        }

    def versions(self) -> dict[str, str]:
        """stage -> the version `lock --upgrade` moved it to."""
        return {stage: move["to"] for stage, move in self.upgraded.items()}

    def pin(self) -> NcclPin | None:
        if not self.nccl_pin:
            return None
        return NcclPin(version=self.nccl_pin["version"], commit=self.nccl_pin["commit"],
                       evidence=dict(self.nccl_pin.get("evidence", {})))


def read(path: Path) -> Lock | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}")
        lock = Lock(manifest_digest=data["manifest_digest"], base_digest=data["base"]["digest"],
                    base_image_id=data["base"].get("id"),
                    sources=data["stages"], nccl_pin=data.get("nccl_pytorch_pin"),
                    upgraded=data.get("upgraded") or {},
                    source_date_epoch=data.get("source_date_epoch"),
                    extends=data.get("extends"))
        lock.versions()  # every upgrade names the version it moved to
        return lock
    except (ValueError, KeyError, TypeError) as exc:
        raise LockError(f"{path}: not a valid imageforge lock file ({exc}); delete it and run "
                        "`invoke lock`.") from None


def defined_stages(manifest: Manifest, registry: Mapping[str, Stage]) -> list[str]:
    """Every stage the manifest's image targets need (what a lock must cover)."""
    from imageforge.plan import defined_targets

    names: list[str] = []
    for target in defined_targets(manifest, registry):
        names.extend(n for n in closure(target, registry) if n not in names)
    return names


def apply(manifest: Manifest, lock: Lock | None, registry: Mapping[str, Stage]) -> Manifest:
    """The manifest with the lock's resolved pins filled in where the manifest has none."""
    if lock is None or lock.manifest_digest != manifest.digest():
        return manifest
    manifest = with_versions(manifest, lock.versions(), registry=registry)
    image = dict(manifest.image)
    if not image.get("base_digest") and lock.base_digest:
        image["base_digest"] = lock.base_digest
    elif not image.get("base_digest") and not image.get("base_image_id") and lock.base_image_id:
        image["base_image_id"] = lock.base_image_id
    if lock.extends and image.get("extends"):
        manifest = extends.with_provides(dataclasses.replace(manifest, image=image),
                                         lock.extends["provides"], lock.extends)
        image = dict(manifest.image)
    manifest = with_nccl_pin(manifest, lock.pin())
    stages = {name: dict(values) for name, values in manifest.stages.items()}
    for name, entries in lock.sources.items():
        values = stages.setdefault(name, _defaults(registry[name]))
        for entry in entries.values():
            _fill(values, entry)
    return dataclasses.replace(manifest, image=image, stages=stages)


def with_nccl_pin(manifest: Manifest, pin: NcclPin | None) -> Manifest:
    """Replace `stages.nccl.version = "auto"` by the version and exact commit PyTorch pins."""
    nccl = manifest.stages.get("nccl")
    if pin is None or nccl is None or nccl.get("version") != "auto":
        return manifest
    # The pin may be a post-release fix with no tag of its own: build the commit itself.
    resolved = {**nccl, "version": pin.version, "commit": pin.commit, "ref": pin.commit}
    return dataclasses.replace(manifest, stages={**manifest.stages, "nccl": resolved})


def _defaults(stage: Stage) -> dict[str, Any]:
    return {key: field.default for key, field in stage.fields.items()}


def _fill(values: dict[str, Any], entry: Mapping[str, str]) -> None:
    for pin, key in (("sha256", entry.get("key", "sha256")), ("commit", "commit")):
        if pin in entry and not values.get(key):
            values[key] = entry[pin]


def check(manifest: Manifest, lock: Lock | None, path: Path) -> None:
    """Refuse a missing or stale lock (what `lock --check` and `build --locked` do)."""
    if lock is None:
        raise LockError(f"{path}: no lock file for {manifest.path}; run `invoke lock`.")
    if lock.manifest_digest != manifest.digest():
        raise LockError(f"{path} is stale: {manifest.path} (with its --set overrides) changed "
                        "since it was locked; run `invoke lock` with the same overrides.")


def resolve(manifest: Manifest, registry: Mapping[str, Stage], cache: SourceCache,
            previous: Lock | None, *, upgrade: bool, only: Sequence[str] = (),
            endpoints: upstream.Endpoints | None = None) -> Lock:
    """Resolve every source of every defined stage. Reuses the previous lock's pins for
    sources whose location did not change, and its version upgrades, except for the stages
    being upgraded: `only` (every stage when empty) when `upgrade`."""
    from imageforge.plan import stage_inputs

    names = defined_stages(manifest, registry)
    renewed = _renewed(manifest, names, only) if upgrade else []
    old = {k: v for k, v in (previous.sources if previous else {}).items() if k not in renewed}
    upgraded = {k: v for k, v in (previous.upgraded if previous else {}).items()
                if k not in renewed}
    found = upstream.upgrades(manifest, registry, renewed,
                              endpoints or upstream.Endpoints(locate=cache.locate_url))
    upgraded |= {move.stage: move.to_json() for move in found}
    manifest = with_versions(manifest, {k: v["to"] for k, v in upgraded.items()},
                             registry=registry)
    pin = None
    if "pytorch" in names and "nccl" in names:
        pin = _pytorch_nccl_pin(manifest, registry, cache, old)
        manifest = with_nccl_pin(manifest, pin)
    inputs = {n: stage_inputs(manifest, registry[n], n) for n in names}
    context = Context(image=manifest.image, stages=inputs)
    resolved: dict[str, dict[str, dict[str, str]]] = {}
    for name in names:
        for source in registry[name].sources(context):
            entry = _resolve_source(source, cache, old.get(name, {}).get(source.name))
            resolved.setdefault(name, {})[source.name] = entry
    base = str(manifest.image["base"])
    base_digest = manifest.image.get("base_digest") or _base_digest(base)
    base_id = None if base_digest else manifest.image.get("base_image_id") or _local_id(base)
    return Lock(manifest_digest=manifest.digest(), base_digest=base_digest,
                base_image_id=base_id, sources=resolved,
                nccl_pin=dataclasses.asdict(pin) if pin else None, upgraded=upgraded)


def _renewed(manifest: Manifest, names: Sequence[str], only: Sequence[str]) -> list[str]:
    """The stages `lock --upgrade` re-resolves: `only`, or all of them."""
    unknown = [name for name in only if name not in names]
    if unknown:
        raise ManifestError(f"--stage {unknown[0]}: {manifest.path} defines no such stage; "
                            f"use one of {', '.join(names)}.")
    return list(only) or list(names)


def _pytorch_nccl_pin(manifest: Manifest, registry: Mapping[str, Stage], cache: SourceCache,
                      old: Mapping[str, Mapping[str, Mapping[str, str]]]) -> NcclPin:
    """The NCCL the manifest's PyTorch pins: needed for "auto", and as evidence for
    `invoke check` when the manifest pins another NCCL on purpose."""
    from imageforge.plan import stage_inputs

    pytorch = stage_inputs(manifest, registry["pytorch"], "pytorch")
    source = registry["pytorch"].sources(Context(image=manifest.image,
                                                  stages={"pytorch": pytorch}))[0]
    assert isinstance(source, GitSource)
    commit = _resolve_git(source, old.get("pytorch", {}).get(source.name), cache)["commit"]
    cuda = image_cuda(manifest)
    nccl_repo = str(manifest.stages["nccl"]["repo"])
    pin = pytorch_nccl_pin(
        pytorch_repo=cache.locate_url(source.repo), pytorch_commit=commit,
        pytorch_version=str(pytorch["version"]), pytorch_ref=source.ref,
        cuda=str(cuda) if cuda else None, nccl_repo=cache.locate_url(nccl_repo),
        mirrors=cache.root / "mirrors")
    # The lock records where sources come from, not where rewrite rules sent this machine.
    evidence = {**pin.evidence, "pytorch_repo": redact(source.repo), "nccl_repo": redact(nccl_repo)}
    return dataclasses.replace(pin, evidence=evidence)


def _resolve_source(source: Source, cache: SourceCache, old: Mapping[str, str] | None
                    ) -> dict[str, str]:
    if isinstance(source, UrlSource):
        entry = {"url": source.url, "key": _sha_key(source)}
        if source.sha256:
            return {**entry, "sha256": source.sha256}
        if old and old.get("url") == source.url and old.get("sha256"):
            return {**entry, "sha256": old["sha256"]}
        return {**entry, "sha256": _hash_into_cache(source, cache)}
    return _resolve_git(source, old, cache)


def _sha_key(source: UrlSource) -> str:
    # The smddp stage's optional S3 plugin pins under its own manifest key.
    return "s3_plugin_sha256" if source.name.endswith("-s3") else "sha256"


def _resolve_git(source: GitSource, old: Mapping[str, str] | None,
                 cache: SourceCache) -> dict[str, str]:
    entry = {"repo": source.repo, "ref": source.ref}
    if source.commit:
        return {**entry, "commit": source.commit}
    current = gitsource.resolve_ref(cache.locate_url(source.repo), source.ref)
    same_ref = old and old.get("repo") == source.repo and old.get("ref") == source.ref
    if same_ref and old and old.get("commit") != current:
        raise LockError(
            f"{source.repo} {source.ref} now points to {current}, but the lock says "
            f"{old.get('commit')}; if the move is expected run `invoke lock --upgrade`, "
            "otherwise pin `commit` in the manifest.")
    return {**entry, "commit": current}


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


def _base_digest(ref: str) -> str | None:
    """The registry digest of the base image, or None when no registry answers (offline,
    or a local-only image)."""
    if "@sha256:" in ref:
        return ref.split("@", 1)[1]
    try:
        result = run(["docker", "buildx", "imagetools", "inspect", ref, "--format",
                      "{{json .Manifest.Digest}}"], timeout=30)
    except (FatalError, OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    digest = json.loads(result.stdout or b"null")
    return digest if isinstance(digest, str) and digest.startswith("sha256:") else None


def _local_id(ref: str) -> str | None:
    """The image ID of a base image only the local image store has, or None."""
    try:
        return local_image(ref)[0]
    except (FatalError, OSError, subprocess.TimeoutExpired):
        return None


def write(path: Path, lock: Lock, manifest: Manifest) -> None:
    """Atomic: the lock file is replaced whole or left as it was."""
    text = json.dumps(lock.to_json(manifest), indent=2, sort_keys=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def diff(old: Lock | None, new: Lock) -> list[str]:
    """Human lines describing what changed between two locks."""
    lines: list[str] = []
    before = old.sources if old else {}
    for stage in sorted(set(before) | set(new.sources)):
        a, b = before.get(stage, {}), new.sources.get(stage, {})
        for name in sorted(set(a) | set(b)):
            if a.get(name) != b.get(name):
                pin_a = _pin(a.get(name))
                pin_b = _pin(b.get(name))
                lines.append(f"{stage}: {name} {pin_a} -> {pin_b}")
    lines += _upgrade_lines(old.upgraded if old else {}, new.upgraded)
    old_pin = (old.nccl_pin or {}) if old else {}
    new_pin = new.nccl_pin or {}
    if (old_pin.get("version"), old_pin.get("commit")) != (new_pin.get("version"),
                                                          new_pin.get("commit")):
        lines.append(f"nccl pinned by pytorch: {old_pin.get('version')} -> "
                     f"{new_pin.get('version')} ({new_pin.get('commit')})")
    if (old.base_digest if old else None) != new.base_digest:
        lines.append(f"base: {old.base_digest if old else None} -> {new.base_digest}")
    elif (old.base_image_id if old else None) != new.base_image_id:
        lines.append(f"base image: {old.base_image_id if old else None} -> {new.base_image_id}")
    return lines


def _upgrade_lines(before: Mapping[str, Mapping[str, str]],
                   after: Mapping[str, Mapping[str, str]]) -> list[str]:
    """`efa: 1.14.1 -> 1.15.1 (policy ~=1.14)`, from the version the old lock built."""
    lines = []
    for stage in sorted(set(before) | set(after)):
        a, b = before.get(stage), after.get(stage)
        if (a or {}).get("to") == (b or {}).get("to"):
            continue
        if b is None:
            assert a is not None
            lines.append(f"{stage}: {a['to']} -> {a['from']} (the manifest's version)")
        else:
            lines.append(f"{stage}: {a['to'] if a else b['from']} -> {b['to']} "
                         f"(policy {b['policy']})")
    return lines


def _pin(entry: Mapping[str, str] | None) -> str:
    if not entry:
        return "(none)"
    return entry.get("commit") or entry.get("sha256") or "?"

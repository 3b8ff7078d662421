"""`invoke verify --rebuild`: build stages again from scratch and compare with their stored
artifacts, as `nix build --check` does.

Each chosen stage is rebuilt alone, from its own sources and the stored artifacts of what it
reads (the inputs its key names), with BuildKit's layer cache off and cache mounts (pip,
ccache) of the rebuild's own, into an OCI layout with file times clamped. An OCI-layout
entry must come out with the same digest; a whole image kept in the engine's image store is
compared file by file, file times aside, since that store keeps build-time file times.
With a remote cache, the registry's artifact of the key is compared too, and a rebuild that
matches it records it as verified (cache/verified.py): what cache_trust = "verified" builds
use.
"""

from __future__ import annotations

import dataclasses
import shutil
import tarfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from imageforge import cachedir
from imageforge.app import project
from imageforge.app.build import image_store
from imageforge.app.workspace import Workspace
from imageforge.buildkit import bake, cachemounts
from imageforge.buildkit.bake import Invocation, builder_args
from imageforge.buildkit.progress import BuildProgress, Mode
from imageforge.buildkit.transfer import fetch_layout
from imageforge.cache import remote as remote_mod
from imageforge.cache import verified
from imageforge.cache.artifacts import ArtifactStore, Entry
from imageforge.cache.layoutdiff import REPACKED, first_difference, top_digest
from imageforge.cache.remote import Remote
from imageforge.cmd import docker
from imageforge.docker import ensure_ready
from imageforge.errors import CacheError, DockerError, NotReproducibleError, UsageError
from imageforge.planning import localtree
from imageforge.planning.dockerfile import CA_BUNDLE_SECRET
from imageforge.planning.execute import (
    bake_file,
    fresh_cache_mounts,
    is_external,
    make_run,
    read_by,
)
from imageforge.planning.plan import Plan

Result = Literal["same", "same files", "differs", "declared"]
IMAGE_STORE_NOTE = ("file times not compared: the engine's image store keeps build-time file "
                    "times (imageforge.image_artifacts = \"oci-layout\" stores byte-identical "
                    "artifacts)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    stage: str
    key: str
    result: Result
    detail: str = ""
    stored: str = ""
    rebuilt: str = ""
    remote_digest: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.result == "differs"

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self) | {"failed": self.failed}


def rebuild(ws: Workspace, target: str, stages: Sequence[str], *,
            builder: str | None = None, progress: Mode = "auto",
            ca_bundle: Path | None = None) -> list[Verdict]:
    """Rebuild `stages` of `target`'s plan (all it builds when empty) and compare each with
    its stored artifact and the remote cache's (ws.remote), recording what matched.
    Every one must be in the local or the remote cache."""
    store = ws.store_for(image_store(builder))
    # The registry as it is, whatever the trust policy: this is what checks it.
    with remote_mod.session(ws.remote) as remote:
        planned = project.plan(ws, target, remote=remote)
        buildable = [s.name for s in planned.stages if not is_external(s)]
        unknown = [name for name in stages if name not in buildable]
        if unknown:
            raise UsageError(f"verify --stage {unknown[0]}: not a stage {target} builds; "
                             f"choose from {', '.join(buildable)}.")
        chosen = list(stages) or buildable
        for name in chosen:
            if planned.stage(name).status == "build":
                raise CacheError(f"verify --rebuild: {name} (key "
                                 f"{planned.stage(name).key[:19]}) is in no artifact cache; "
                                 f"build it first (invoke build --target {target}).")
        ensure_ready(builder, buildx=bool(builder))
        scratch = store.scratch()
        secrets = {CA_BUNDLE_SECRET: str(ca_bundle)} if ca_bundle else {}
        try:
            return [_one(ws, store, remote, planned, name, scratch / name, builder,
                         progress, secrets) for name in chosen]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _one(ws: Workspace, store: ArtifactStore, remote: Remote | None,
         planned: Plan, name: str, workdir: Path, builder: str | None, progress: Mode,
         secrets: Mapping[str, str]) -> Verdict:
    stage = planned.stage(name)
    declared = planned.registry[name]
    if not declared.reproducible:
        return Verdict(stage=name, key=stage.key, result="declared",
                       detail=f"not rebuilt: declared not reproducible: "
                              f"{declared.reproducible_reason}")
    started = time.time()
    out = _rebuild(ws, store, remote, planned, name, workdir, builder, progress, secrets)
    verdict = Verdict(stage=name, key=stage.key, result="same", rebuilt=top_digest(out))
    if stage.status == "cached":
        verdict = _against_stored(verdict, _stored(store, planned, name), out, workdir)
    if remote is not None and not verdict.failed:
        verdict = _against_remote(verdict, store, remote, out, workdir)
    if not verdict.failed:
        verified.record(ws.cache_dir, key=stage.key, stage=name, digest=verdict.rebuilt,
                        remote=remote.repository if verdict.remote_digest and remote else None,
                        remote_digest=verdict.remote_digest or None)
    return dataclasses.replace(verdict, seconds=round(time.time() - started, 1))


def _rebuild(ws: Workspace, store: ArtifactStore, remote: Remote | None,
             planned: Plan, name: str, workdir: Path, builder: str | None, progress: Mode,
             secrets: Mapping[str, str]) -> Path:
    """The stage built again from scratch, as an OCI layout."""
    stage = planned.stage(name)
    contexts = {dep: _input(store, remote, planned, dep)
                for dep in read_by(planned, [name]) if not is_external(planned.stage(dep))}
    contexts.update({src: str(path) for src, path in
                     ws.sources.materialize_all(stage.sources).items()})
    for context, (path, digest) in stage.local_dirs.items():
        contexts[context] = str(localtree.snapshot(Path(path), digest,
                                                 cachedir.local_trees(ws.cache_dir)))
    run = make_run(planned, planned.registry, [name], contexts, final=False)
    out = workdir / "rebuilt"
    (workdir / "context").mkdir(parents=True)
    token = uuid.uuid4().hex[:12]
    (workdir / "Dockerfile").write_text(fresh_cache_mounts(run.dockerfile, token))
    spec = bake_file(run, workdir=workdir, tag=None, labels={},
                     platform=str(planned.manifest.image["platform"]), push=False,
                     artifact_dirs={name: out}, secrets=secrets)
    for body in spec["target"].values():
        body["no-cache"] = True
    buildx = builder_args(builder)
    argv = Invocation(spec=spec, workdir=workdir, engine=buildx).write()
    env = remote.env if remote is not None else {}
    try:
        bake.run_bake(argv, BuildProgress([name], progress), env, cache=store.root, push=None,
                      outputs=[out])
    finally:
        cachemounts.drop(token, buildx)
    return out


def _against_stored(verdict: Verdict, entry: Entry, out: Path, workdir: Path) -> Verdict:
    if entry.image is None:
        found = None if verdict.rebuilt == entry.digest else \
            first_difference(entry.path, out) or "same content, other bytes"
        return dataclasses.replace(verdict, result="differs" if found else "same",
                                   detail=found or "", stored=entry.digest)
    assert entry.image is not None
    found = first_difference(save_image(entry.image, workdir / "stored"), out,
                             clamp_times=True)
    return dataclasses.replace(verdict, result="differs" if found else "same files",
                               detail=found or IMAGE_STORE_NOTE, stored=entry.digest)


def _against_remote(verdict: Verdict, store: ArtifactStore, remote: Remote, out: Path,
                    workdir: Path) -> Verdict:
    """The registry's artifact of the key, file by file (a push re-packs layers)."""
    served = remote.digest(verdict.stage, verdict.key)
    if served is None:
        return verdict
    fetched = workdir / "remote"
    fetch_layout(store, remote, verdict.stage, verdict.key, served, fetched)
    found = first_difference(fetched, out)
    if found is not None and not found.endswith(REPACKED):
        return dataclasses.replace(verdict, result="differs", remote_digest=served,
                                   detail=f"{remote.ref(verdict.stage, verdict.key)}: {found}")
    return dataclasses.replace(verdict, remote_digest=served)


def _input(store: ArtifactStore, remote: Remote | None, planned: Plan, name: str) -> str:
    """A stage the rebuilt one reads: its stored artifact, else the registry's."""
    if planned.stage(name).status == "remote" and remote is not None:
        return remote.context(name, planned.stage(name).key)
    return _stored(store, planned, name).context


def _stored(store: ArtifactStore, planned: Plan, name: str) -> Entry:
    entry = store.verify(planned.stage(name).key)
    if entry is None:
        raise CacheError(f"verify --rebuild: the stored artifact of {name} is gone or corrupt "
                         "(it was discarded); build again, then verify.")
    return entry


def save_image(ref: str, dest: Path) -> Path:
    """An image of the engine's store as an OCI layout (`docker image save` writes one)."""
    archive = dest.with_suffix(".tar")
    dest.mkdir(parents=True)
    result = docker("image", "save", "-o", str(archive), ref, timeout=1800)
    if result.returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        archive.unlink(missing_ok=True)
        said = result.stderr.decode(errors="replace").strip()
        if "No such image" in said or "not found" in said:
            raise DockerError(f"{ref} is not in the Docker engine's image store (removed "
                              "since it was built?); build it again, then verify.")
        raise DockerError(f"docker image save {ref} failed: {said}")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()
    return dest


def lines(verdicts: Sequence[Verdict]) -> list[str]:
    out = [f"{'stage':<18} {'result':<11} {'seconds':>8}  detail"]
    for v in verdicts:
        out.append(f"{v.stage:<18} {v.result:<11} {v.seconds:>8.1f}  {v.detail or v.rebuilt}")
    return out


def raise_if_failed(verdicts: Sequence[Verdict], against: str = "its stored artifact"
                    ) -> None:
    """NotReproducibleError naming the first stage whose rebuild differed, and where."""
    failed = next((v for v in verdicts if v.failed), None)
    if failed is not None:
        raise NotReproducibleError(
            f"verify --rebuild: {failed.stage} (key {failed.key[:19]}) rebuilt differently "
            f"from {against}: {failed.detail}; remove what makes its build differ "
            "(a time, a path, an order) or declare the stage reproducible=False with the "
            "reason.")


def least_recently_verified(ws: Workspace, target: str, count: int) -> list[str]:
    """The `count` stages of `target` that a rebuild verified longest ago (never first), so
    that a nightly verifying a few a night covers them all in turn."""
    planned = project.plan(ws, target)
    stages = [s for s in planned.stages
              if not is_external(s) and planned.registry[s.name].reproducible]
    when = {s.name: float((verified.lookup(ws.cache_dir, s.key) or {})
                          .get("verified_at", 0.0)) for s in stages}
    return [s.name for s in sorted(stages, key=lambda s: when[s.name])][:count]

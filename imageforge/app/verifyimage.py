"""`invoke verify --rebuild --image REF`: is a (golden) image what its pins say?

The image's labels name its target, its manifest's digest, every stage's key and the
imageforge revision that built it. This checkout must plan the same keys from the same
manifest (check out that revision otherwise); then the target is built again from nothing,
as melange's rebuild does for packages: a cache directory of its own (every source fetched
again), BuildKit's layer cache off and cache mounts of its own. The two images are compared
file by file, file times aside (an image store keeps build-time file times), and config by
config.
"""

from __future__ import annotations

import dataclasses
import shutil
import uuid
from pathlib import Path

from imageforge.app import project
from imageforge.app.build import build
from imageforge.app.verify import IMAGE_STORE_NOTE, Verdict, save_image
from imageforge.app.workspace import Workspace
from imageforge.buildkit.progress import Mode
from imageforge.buildkit.results import BuildOptions
from imageforge.cache import remote as remote_mod
from imageforge.cache.layoutdiff import first_difference
from imageforge.cmd import docker
from imageforge.docker import LABEL_PREFIX, local_image
from imageforge.errors import DockerError, LockError, UsageError
from imageforge.model.imageref import registry_host


def verify_image(ws: Workspace, ref: str, *, builder: str | None = None,
                 progress: Mode = "auto", ca_bundle: Path | None = None) -> Verdict:
    image_id, labels = _image(ref)
    target = labels.get(f"{LABEL_PREFIX}.target")
    if not target:
        raise UsageError(f"verify --image {ref}: the image has no {LABEL_PREFIX}.target label; "
                         "imageforge did not build it.")
    planned = project.plan(ws, target)
    revision = labels.get(f"{LABEL_PREFIX}.revision", "unknown")
    moved = [s.name for s in planned.stages
             if labels.get(f"{LABEL_PREFIX}.key.{s.name}") != s.key]
    if labels.get(f"{LABEL_PREFIX}.manifest-digest") != planned.manifest.digest() or moved:
        raise LockError(
            f"verify --image {ref}: it was built from {labels.get(f'{LABEL_PREFIX}.manifest')} "
            f"at imageforge revision {revision}, and {ws.manifest} here plans other keys "
            f"for {', '.join(moved) or 'its stages'}; check out that revision (git checkout "
            f"{revision}) and verify from there.")
    store = ws.store
    scratch = store.scratch()
    tag = f"imageforge-verify/{target}:{uuid.uuid4().hex[:12]}"
    fresh = dataclasses.replace(ws, cache_dir=scratch / "cache", remote=None,
                                image_store=False, trust_verified=False)
    try:
        result = build(fresh, BuildOptions(target=target, tag=tag, builder=builder,
                                           progress=progress, ca_bundle=ca_bundle,
                                           no_cache=True, revision=revision))
        assert result is not None
        found = first_difference(save_image(ref, scratch / "image"),
                                 save_image(tag, scratch / "rebuilt"), clamp_times=True)
    finally:
        docker("image", "rm", "--force", tag)
        shutil.rmtree(scratch, ignore_errors=True)
    return Verdict(stage=target, key=planned.key, result="differs" if found else "same files",
                   detail=found or IMAGE_STORE_NOTE, stored=image_id,
                   rebuilt=result.image_digest or "", seconds=result.seconds)


def _image(ref: str) -> tuple[str, dict[str, str]]:
    """The image's ID and labels, pulled first when this engine lacks it."""
    image_id, labels = local_image(ref)
    if image_id is None:
        host = registry_host(ref)
        with remote_mod.credentials(host or []) as env:
            pulled = docker("pull", "--quiet", ref, timeout=3600, env=env)
        if pulled.returncode != 0:
            raise DockerError(f"verify --image {ref}: not in this engine and `docker pull` "
                              f"failed: {pulled.stderr.decode(errors='replace').strip()}")
        image_id, labels = local_image(ref)
    if image_id is None or labels is None:
        raise DockerError(f"verify --image {ref}: not in this engine after pulling it.")
    return image_id, labels

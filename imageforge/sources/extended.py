"""The image an `[image] extends` names, read through Docker: its digest and the stages its
labels say it holds (an imageforge image carries `io.imageforge.key.<stage>` for each), from
the local image store, else from its registry; and the check that a local base or extended
image is still the one the lock pins. The rewrite of the stage graph is model/extends.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Mapping

from imageforge.cmd import docker
from imageforge.docker import LABEL_PREFIX, local_image
from imageforge.errors import DockerError
from imageforge.model.extends import BASE
from imageforge.model.manifest import Manifest
from imageforge.model.stage import Stage

KEY_LABEL = f"{LABEL_PREFIX}.key."
VERSION_LABEL = f"{LABEL_PREFIX}.version."


@dataclasses.dataclass(frozen=True, kw_only=True)
class Inspected:
    digest: str | None
    # True when the image is only in the local image store: its digest is then an image ID,
    # which pins the key but cannot be written into FROM (BuildKit would ask a registry).
    local: bool
    provides: tuple[str, ...]
    versions: Mapping[str, str]


def inspect(ref: str, stages: Mapping[str, Stage]) -> Inspected:
    """REF's digest and the stages its labels say it holds: from the local image store, else
    from its registry."""
    digest, labels = local_image(ref)
    local = labels is not None and "@" not in ref and _remote(ref)[1] is None
    if labels is None:
        digest, labels = _remote(ref)
    if labels is None:
        raise DockerError(f"image.extends = {ref!r}: no such image here or in its registry; "
                          "build or pull it first, or fix the reference.")
    names = tuple(n for n in stages if f"{KEY_LABEL}{n}" in labels and n != BASE)
    versions = {n: labels[f"{VERSION_LABEL}{n}"] for n in names
                if f"{VERSION_LABEL}{n}" in labels}
    return Inspected(digest=digest, local=local, provides=names, versions=versions)


def _remote(ref: str) -> tuple[str | None, dict[str, str] | None]:
    try:
        result = docker("buildx", "imagetools", "inspect", ref, "--format",
                        "{{json .}}", timeout=60)
    except subprocess.TimeoutExpired:
        return None, None
    if result.returncode != 0:
        return None, None
    data = json.loads(result.stdout or b"{}")
    image = data.get("image") or {}
    if "config" not in image:  # an index: one platform's config per key
        image = next(iter(image.values()), {}) if isinstance(image, dict) else {}
    labels = (image.get("config") or {}).get("Labels") or {}
    digest = (data.get("manifest") or {}).get("digest")
    return digest, dict(labels)


def require_same_image(manifest: Manifest, context: str | None = None) -> None:
    """Refuse to build on a local base (or extended) image that is no longer the one the
    lock pins: the keys would claim the old one. `context`: the docker context whose engine
    builds."""
    wanted = manifest.image.get("base_image_id")
    if not wanted:
        return
    ref = str(manifest.image["base"])
    found, _ = local_image(ref, context)
    if found != wanted:
        key = "image.extends" if manifest.image.get("extends") else "image.base"
        raise DockerError(f"{key} = {ref!r} is {found or 'gone'} here, not the image "
                          f"{wanted} the lock pins; run `invoke lock` to build on this one.")

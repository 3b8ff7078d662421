"""Whether the registry already holds a --push build's image.

On a fresh CI runner a build with nothing to build still loaded every reused stage's artifact
into BuildKit, made the image again and pushed what the registry already had: seconds of
pulling and exporting for nothing. An image at the tag that carries every label this build
would give it (each stage's key, the manifest and lock digests, the imageforge revision) is
this build's image, so the build can end there.
"""

from __future__ import annotations

from collections.abc import Mapping

from imageforge import log
from imageforge.model.imageref import registry_host

# How long the question may take before the build runs and pushes as it would without it.
TIMEOUT = 15.0


def registry_image(tag: str, platform: str, wanted: Mapping[str, str],
                   env: Mapping[str, str]) -> str | None:
    """The manifest digest the registry serves for `tag` when its image for `platform` (the
    manifest's image.platform) carries every label of `wanted`; None when it holds no such
    tag or another image, or cannot be asked over HTTP as docker would ask (the build then
    runs and pushes as before)."""
    import requests

    from imageforge.cache import registryhttp

    host = registry_host(tag)
    if host is None or "@" in tag:
        return None
    name, colon, reference = tag[len(host) + 1:].rpartition(":")
    if not colon:
        name, reference = reference, "latest"
    try:
        found = registryhttp.Client(host, env).image_config(name, reference, platform=platform,
                                                             timeout=TIMEOUT)
    except (registryhttp.Unsupported, registryhttp.Unavailable, registryhttp.Refused,
            requests.RequestException) as why:
        log.debug(f"could not read {tag}'s labels from the registry ({why}); building it.")
        return None
    if found is None:
        return None
    digest, config = found
    inner = config.get("config")
    labels = inner.get("Labels") if isinstance(inner, dict) else None
    if not isinstance(labels, dict):
        return None
    if any(labels.get(label) != value for label, value in wanted.items()):
        return None
    return digest

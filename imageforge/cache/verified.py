"""Keys a rebuild has verified (`invoke verify --rebuild`), and the policy that builds use
only those from a remote cache (imageforge.cache_trust = "verified").

A record says: building this key from scratch gave these bytes, and the remote cache's
artifact under the key was those bytes, by manifest digest. It lives in this cache
directory, never in the registry: whoever can replace what the registry serves could replace
a record kept there too. A build under the policy reads a remote artifact by that digest
(BuildKit checks every blob against it), so a registry that later serves something else
under the key is refused rather than used.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from imageforge import cachedir, jsonfile
from imageforge.cache.artifacts import key_hex
from imageforge.errors import NotReproducibleError

TRUST = ("any", "verified")


def _path(cache_dir: Path, key: str) -> Path:
    return cachedir.verification(cache_dir, key_hex(key))


def record(cache_dir: Path, *, key: str, stage: str, digest: str,
           remote: str | None = None, remote_digest: str | None = None) -> None:
    """Remember that `key` rebuilt to `digest` (and, when compared with one, that the
    artifact `remote` served under it was `remote_digest`)."""
    path = _path(cache_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    found = lookup(cache_dir, key) or {}
    remotes = dict(found.get("remotes", {}))
    if remote and remote_digest:
        remotes[remote] = remote_digest
    data = {"key": key, "stage": stage, "digest": digest, "remotes": remotes,
            "verified_at": time.time()}
    jsonfile.write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def lookup(cache_dir: Path, key: str) -> dict[str, Any] | None:
    """The record of `key`'s verified rebuild; None when there is none or it is not one
    imageforge wrote (it proves nothing then, so the artifact counts as unverified)."""
    data = jsonfile.read_object(_path(cache_dir, key))
    if data is None or data.get("key") != key or not isinstance(data.get("digest"), str):
        return None
    remotes = data.get("remotes", {})
    if not isinstance(remotes, dict) or not all(
            isinstance(v, str) for v in remotes.values()):
        return None
    return data


def verified_remote_digest(cache_dir: Path, key: str, repository: str) -> str | None:
    """The digest a rebuild verified for `repository`'s artifact of `key`, if one did."""
    found = lookup(cache_dir, key)
    digest = (found or {}).get("remotes", {}).get(repository)
    return str(digest) if digest else None


def refuse_replaced(stage: str, key: str, ref: str, served: str, verified: str) -> None:
    raise NotReproducibleError(
        f"cache_trust = verified: the remote cache serves {served} as {ref}, but the rebuild "
        f"that verified {stage} (key {key[:19]}) found {verified}; the artifact was replaced "
        "after it was verified and is refused. Find out who replaced it, then delete it "
        "there and push a verified build again (invoke verify --rebuild --remote).")

"""OCI image layouts for artifact-store tests: real layouts of made-up bytes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def descriptor(media_type: str, body: bytes) -> dict[str, object]:
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(body).hexdigest(),
            "size": len(body)}


def oci_layout(where: Path, layers: list[bytes]) -> Path:
    """An OCI image layout: a config, `layers`, the manifest naming them and the index."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "n": where.name}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", b) for b in layers],
    }).encode()
    blobs = where / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    for body in (config, manifest, *layers):
        (blobs / hashlib.sha256(body).hexdigest()).write_bytes(body)
    (where / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (where / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        descriptor("application/vnd.oci.image.manifest.v1+json", manifest)]}))
    return where


def key_of(name: str) -> str:
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()

"""What any fault must leave behind in a cache directory, judged without the engine's code.

Entries are checked by hashing their blobs here and walking their OCI index and manifests
here: `ArtifactStore.verify` is what is under test, so it cannot be the judge."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def image_entry_problems(entry: Path, meta: dict[str, Any]) -> list[str]:
    """An entry in the engine's image store: meta.json alone, whose name the engine holds
    with the digest it records (asked through the docker CLI, not the engine's code)."""
    extra = sorted(p.name for p in entry.iterdir() if p.name != "meta.json")
    if extra:
        return [f"{entry.name}: an image entry also holds {extra}"]
    found = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", meta["image"]],
                           capture_output=True, text=True, check=False, timeout=60)
    if found.stdout.strip() != meta["digest"]:
        return [f"{entry.name}: {meta['image']} is {found.stdout.strip() or 'gone'}, not "
                f"{meta['digest']}"]
    return []


def entry_problems(entry: Path) -> list[str]:
    """Why an artifact entry (an OCI layout plus meta.json, or a name in the engine's image
    store) is not whole and intact."""
    if (entry / "meta.json").is_file():
        meta = json.loads((entry / "meta.json").read_text())
        if meta.get("image"):
            return image_entry_problems(entry, meta)
    for name in ("meta.json", "index.json", "oci-layout"):
        if not (entry / name).is_file():
            return [f"{entry.name}: no {name}"]
    blobs = entry / "blobs" / "sha256"
    present = {p.name for p in blobs.iterdir()} if blobs.is_dir() else set()
    problems = [f"{entry.name}: blob {name} holds other bytes" for name in sorted(present)
                if sha256_of(blobs / name) != name]
    index = json.loads((entry / "index.json").read_text())
    meta = json.loads((entry / "meta.json").read_text())
    if meta.get("digest") != index["manifests"][0]["digest"]:
        problems.append(f"{entry.name}: meta.json names another image than index.json")
    pending: list[dict[str, Any]] = list(index["manifests"])
    while pending:
        descriptor = pending.pop()
        name = str(descriptor["digest"]).removeprefix("sha256:")
        if name not in present:
            problems.append(f"{entry.name}: {descriptor['digest']} is missing")
            continue
        if "manifest" in str(descriptor.get("mediaType", "")) or "index" in str(
                descriptor.get("mediaType", "")):
            document = json.loads((blobs / name).read_bytes())
            pending += document.get("manifests", [])
            pending += [d for d in (document.get("config"), *document.get("layers", [])) if d]
    return problems


def assert_cache_consistent(cache: Path) -> None:
    """Whole artifact entries only (every blob re-hashed here, every descriptor present), no
    work in progress under artifacts/tmp, no shared blob that no entry links, no
    half-fetched source, and no lock file still held by anyone."""
    artifacts = cache / "artifacts"
    entries = artifacts / "entries"
    for entry in sorted(entries.iterdir()) if entries.exists() else []:
        problems = entry_problems(entry)
        assert problems == [], problems
    leftovers = list((artifacts / "tmp").iterdir()) if (artifacts / "tmp").exists() else []
    assert leftovers == [], f"work in progress left behind: {leftovers}"
    blobs = artifacts / "blobs" / "sha256"
    orphans = [b.name for b in blobs.iterdir() if b.stat().st_nlink == 1] \
        if blobs.exists() else []
    assert orphans == [], f"blobs no entry links: {orphans}"
    for kind in ("sha256", "git"):
        folder = cache / "sources" / kind
        for path in sorted(folder.iterdir()) if folder.exists() else []:
            assert not path.name.startswith("."), f"a fetch left {path} behind"
            if path.is_dir():
                assert path.with_name(path.name + ".complete").exists(), f"{path} is half-written"
    for lock in cache.rglob("*.lock"):
        if lock.is_file():
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while someone holds it
            finally:
                os.close(fd)

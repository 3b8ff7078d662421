"""Prunes at once on one artifact store (CI jobs sharing a cache volume): each exits 0
without a traceback and the store ends empty and consistent. Entries are real OCI layouts
adopted by the real store; only their bytes are made up, so no Docker is needed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from imageforge.cache.artifacts import ArtifactStore

ROOT = Path(__file__).resolve().parents[2]
SHARED = os.urandom(4096)  # a base layer every entry has


def layout(where: Path, blobs: list[bytes]) -> Path:
    (where / "blobs" / "sha256").mkdir(parents=True)
    digests = []
    for body in blobs:
        digest = hashlib.sha256(body).hexdigest()
        (where / "blobs" / "sha256" / digest).write_bytes(body)
        digests.append(digest)
    (where / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (where / "index.json").write_text(json.dumps(
        {"schemaVersion": 2, "manifests": [{"digest": f"sha256:{digests[0]}"}]}))
    return where


def fill(store: ArtifactStore, scratch: Path, count: int) -> None:
    for i in range(count):
        key = "sha256:" + hashlib.sha256(f"key {i}".encode()).hexdigest()
        store.add(key=key, stage=f"stage{i}", inputs={}, build_seconds=0.0,
                  layout=layout(scratch / str(i), [os.urandom(512), os.urandom(512), SHARED]))


def test_three_prunes_at_once_all_succeed_and_leave_an_empty_consistent_store(
        tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    store = ArtifactStore(cache / "artifacts")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_IMAGEFORGE_CACHE_DIR": str(cache)}
    for round_ in range(3):
        fill(store, tmp_path / f"layouts{round_}", 150)
        # By age the newest go first, by size the oldest: the prunes meet in the middle.
        prunes = [subprocess.Popen([sys.executable, "-m", "invoke", "-r", str(ROOT),
                                    "cache.prune", *how], cwd=ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                  for how in (("--older-than", "0s"), ("--max-size", "0"),
                              ("--older-than", "0s"))]
        outs = [p.communicate(timeout=120) for p in prunes]
        assert [p.returncode for p in prunes] == [0, 0, 0], outs
        assert store.all_entries() == []
        assert list(store.blobs.iterdir()) == []
        assert list(store.tmp.iterdir()) == []

"""Where two OCI layouts of one artifact differ: the first differing layer and, in it, the
first differing file, for `invoke verify --rebuild` to name."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from imageforge.planning.execute import SOURCE_DATE_EPOCH

_CHUNK = 1 << 20
# Layers with the same files in other bytes: another tar writer or compression (a push).
REPACKED = "same files, different layer bytes (tar or compression)"


@dataclasses.dataclass(frozen=True)
class Member:
    """What a layer says of one file: everything that lands on disk."""

    name: str
    kind: str
    mode: int
    uid: int
    gid: int
    size: int
    mtime: int
    link: str
    sha256: str


def top_digest(layout: Path) -> str:
    """The digest an OCI layout's index names first: what BuildKit wrote."""
    return str(json.loads((layout / "index.json").read_text())["manifests"][0]["digest"])


def top_manifest(layout: Path) -> dict[str, Any]:
    index = json.loads((layout / "index.json").read_text())
    manifest: dict[str, Any] = json.loads(blob(layout, index["manifests"][0]["digest"]).read_text())
    if "manifests" in manifest:  # an index (attestations beside the image): its image
        manifest = json.loads(blob(layout, manifest["manifests"][0]["digest"]).read_text())
    return manifest


def blob(layout: Path, digest: str) -> Path:
    algorithm, _, value = digest.partition(":")
    return layout / "blobs" / algorithm / value


def first_difference(one: Path, two: Path, *, clamp_times: bool = False) -> str | None:
    """One sentence on where layout `two` first differs from `one` (file by file, in layer
    order), or None when every layer and the image config are the same. `clamp_times`:
    compare file times as BuildKit's rewrite-timestamp would have left them (no later than
    SOURCE_DATE_EPOCH), and not the layer digests the config lists, which hold them."""
    a, b = top_manifest(one), top_manifest(two)
    layers_a, layers_b = a.get("layers", []), b.get("layers", [])
    repacked = None
    for number, (la, lb) in enumerate(zip(layers_a, layers_b, strict=False), start=1):
        if la["digest"] == lb["digest"]:
            continue
        found = _first_member_difference(blob(one, la["digest"]), blob(two, lb["digest"]),
                                         clamp_times)
        if found == REPACKED:
            repacked = repacked or f"layer {number}: {found}"
        elif found is not None:
            return f"layer {number}: {found}"
    if len(layers_a) != len(layers_b):
        return f"{len(layers_a)} layers, now {len(layers_b)}"
    if a["config"]["digest"] != b["config"]["digest"]:
        # Layers compared file by file: the layer digests the config lists may differ.
        found = _config_difference(blob(one, a["config"]["digest"]),
                                   blob(two, b["config"]["digest"]),
                                   ignore_layers=clamp_times or repacked is not None)
        if found is not None:
            return found
    return repacked


def _first_member_difference(one: Path, two: Path, clamp_times: bool) -> str | None:
    with tarfile.open(one, "r:*") as ta, tarfile.open(two, "r:*") as tb:
        members_b = _members(tb, clamp_times)
        for ma in _members(ta, clamp_times):
            mb = next(members_b, None)
            if mb is None:
                return f"/{ma.name} is missing"
            if ma.name != mb.name:
                return f"/{ma.name} is missing (in its place: /{mb.name})"
            if ma != mb:
                fields = [f.name for f in dataclasses.fields(Member)
                          if getattr(ma, f.name) != getattr(mb, f.name)]
                changes = ", ".join(f"{f} {getattr(ma, f)!r} -> {getattr(mb, f)!r}"
                                    if f != "sha256" else "content" for f in fields)
                return f"/{ma.name} differs ({changes})"
        extra = next(members_b, None)
        if extra is not None:
            return f"/{extra.name} is new"
    # The same files: the tar bytes differ (order of headers, padding, compression), which
    # with file times clamped is expected (the times were part of the bytes).
    return None if clamp_times else REPACKED


def _members(tar: tarfile.TarFile, clamp_times: bool) -> Iterator[Member]:
    for info in tar:
        digest = hashlib.sha256()
        if info.isfile():
            handle = tar.extractfile(info)
            assert handle is not None
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        yield Member(name=info.name.lstrip("./"), kind=info.type.decode(errors="replace"),
                     mode=info.mode, uid=info.uid, gid=info.gid, size=info.size,
                     mtime=min(int(info.mtime), SOURCE_DATE_EPOCH) if clamp_times
                     else int(info.mtime), link=info.linkname, sha256=digest.hexdigest())


def _config_difference(one: Path, two: Path, *, ignore_layers: bool) -> str | None:
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    if ignore_layers:
        a.pop("rootfs", None)
        b.pop("rootfs", None)
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key):
            continue
        if isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
            inner = sorted(k for k in set(a[key]) | set(b[key]) if a[key].get(k) != b[key].get(k))
            return f"image config: {key}.{inner[0]} differs"
        return f"image config: {key} differs"
    return None if ignore_layers else "image config: same fields, different bytes"

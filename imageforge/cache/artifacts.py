"""The local artifact store: every built stage under its key, as an OCI image layout or, for
a full-image artifact on an engine with an image store, as a name in that store
(cache/imagestore.py; its entry holds meta.json only).

Layout under <cache>/artifacts:
  blobs/sha256/<hex>     content-addressed blobs, shared by every entry
  entries/<keyhex>/      an OCI layout (oci-layout, index.json, blobs/ hard-linked from
                         the shared blobs) plus meta.json; it exists complete or not at all
  locks/<keyhex>.lock    per-key locks, so concurrent builds never build a key twice
  tmp/<pid>-<rand>/      work in progress; left-overs of dead processes are removed
A blob whose only link is the shared copy belongs to no entry and is garbage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from imageforge import diskfull, jsonfile, log
from imageforge.cache.imagestore import ImageStore, artifact_ref
from imageforge.cache.keylock import locked
from imageforge.errors import CacheError

_CHUNK = 1 << 20
# Per entry: (size, mtime, inode) of each blob known to match its digest.
STAMPS = "verified.json"
_DEFAULT_ENGINE = ImageStore()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
    key: str
    stage: str
    inputs: Mapping[str, Any]
    size: int
    digest: str
    build_seconds: float
    created: float
    last_used: float
    hits: int
    path: Path
    # The name in the engine's image store (cache/imagestore.py); None: an OCI layout.
    image: str | None = None

    @property
    def context(self) -> str:
        """How BuildKit reads this artifact as a named build context."""
        if self.image:
            return f"docker-image://{self.image}"
        return f"oci-layout://{self.path}@{self.digest}"

    def meta(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("path")
        return data


def key_hex(key: str) -> str:
    hexpart = key.removeprefix("sha256:")
    if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise CacheError(f"{key!r} is not a stage key (sha256:<64 hex>).")
    return hexpart


class ArtifactStore:
    def __init__(self, root: Path, images: ImageStore | None = _DEFAULT_ENGINE) -> None:
        """`images`: the engine whose image store holds full-image artifacts; None for a
        builder without one (its image entries are then not there: those stages build)."""
        self.images = images
        self._image_ids: dict[str, str] | None = None
        # Records already warned about: a command reads an entry more than once (cache.ls
        # lists, then sizes), and one bad file is one warning.
        self._warned: set[Path] = set()
        self.root = root.resolve()
        # This store's own names in the image store (imagestore.artifact_ref).
        self.namespace = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        self.blobs = self.root / "blobs" / "sha256"
        self.entry_root = self.root / "entries"
        self.locks = self.root / "locks"
        self.tmp = self.root / "tmp"

    # ---- reading ---------------------------------------------------------------------------

    def get(self, key: str) -> Entry | None:
        """The entry for `key` if it is in the store (cheap: reads its metadata only)."""
        meta = self.entry_root / key_hex(key) / "meta.json"
        try:
            data = jsonfile.load(meta)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            data = exc
        why = _meta_problem(data, key)
        if why:
            # A record is input like any file: one it cannot read is a stage to rebuild.
            if meta not in self._warned:
                self._warned.add(meta)
                log.warning(f"{meta}: {why}; ignoring that artifact (its stage builds again; "
                            "`invoke cache.prune` removes what nothing uses).")
            return None
        if data.get("image") and self.images is None:
            return None
        return Entry(path=meta.parent, **data)

    def verify(self, key: str) -> Entry | None:
        """The entry if every blob it holds has the digest it is named by; a corrupt entry
        is reported, removed (with its bad blobs) and None is returned."""
        entry = self.get(key)
        if entry is None:
            return None
        if entry.image:
            return self._verify_image(entry)
        # A blob hashed before and not touched since (same size, mtime and inode) is not
        # hashed again: a no-op rebuild stays fast however large the image.
        stamps_path = entry.path / STAMPS
        try:
            stamps = json.loads(stamps_path.read_text())
        except (OSError, ValueError):
            stamps = {}
        blobs = list(_blob_files(entry.path))
        bad = [b for b in blobs if stamps.get(b.name) != _stamp(b) and not _blob_ok(b)]
        if not bad and (entry.path / "index.json").exists():
            fresh = {b.name: _stamp(b) for b in blobs}
            if fresh != stamps:
                jsonfile.write_json(stamps_path, fresh, sort_keys=True)
            return entry
        log.warning(f"cached artifact of {entry.stage} ({key[:19]}) is corrupt "
                    f"({len(bad)} bad blob(s)); discarding it, the stage will be rebuilt.")
        for blob in bad:
            (self.blobs / blob.name).unlink(missing_ok=True)
        self.remove(key)
        return None

    def _verify_image(self, entry: Entry) -> Entry | None:
        assert entry.image is not None
        assert self.images is not None
        if self._image_ids is None:
            self._image_ids = self.images.ids(self.namespace)
        found = self._image_ids.get(entry.image)
        if found == entry.digest:
            return entry
        why = "is gone from the image store" if found is None else \
            f"names other content ({found[:19]}) in the image store"
        log.warning(f"cached artifact of {entry.stage} ({entry.key[:19]}) {why}; discarding "
                    "it, the stage will be rebuilt.")
        self.remove(entry.key)
        return None

    def all_entries(self) -> list[Entry]:
        if not self.entry_root.exists():
            return []
        found = (self.get("sha256:" + d.name) for d in sorted(self.entry_root.iterdir())
                 if len(d.name) == 64)
        return [e for e in found if e is not None]

    # ---- writing ---------------------------------------------------------------------------

    def lock_path(self, key: str) -> Path:
        return self.locks / f"{key_hex(key)}.lock"

    def scratch(self) -> Path:
        """A fresh work directory under tmp/, named after this process."""
        self.cleanup()
        path = self.tmp / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        path.mkdir(parents=True)
        return path

    def add(self, *, key: str, stage: str, inputs: Mapping[str, Any], layout: Path,
            build_seconds: float) -> Entry:
        """Adopt the OCI layout BuildKit exported to `layout` as the artifact of `key`.
        Atomic: the entry appears whole (a rename) or not at all."""
        digest = _top_digest(layout)
        with diskfull.guard(self.root):
            self.blobs.mkdir(parents=True, exist_ok=True)
            staged = self.scratch()
            try:
                return self._assemble(staged, key=key, stage=stage, inputs=inputs,
                                      layout=layout, digest=digest,
                                      build_seconds=build_seconds)
            finally:
                # Renamed into place, the staged entry is the store's; otherwise the blobs
                # this add shared belong to no entry: it was stopped (an error, Ctrl-C), or
                # another process stored the same key first.
                kept = not staged.exists()
                shutil.rmtree(staged, ignore_errors=True)
                shutil.rmtree(layout, ignore_errors=True)
                if not kept:
                    self.collect_garbage()

    def _assemble(self, staged: Path, *, key: str, stage: str, inputs: Mapping[str, Any],
                  layout: Path, digest: str, build_seconds: float) -> Entry:
        (staged / "blobs" / "sha256").mkdir(parents=True)
        size = 0
        stamps: dict[str, list[int]] = {}
        for blob in _blob_files(layout):
            if not _blob_ok(blob):
                raise CacheError(f"BuildKit exported a blob of {stage} whose content does "
                                 f"not match its name ({blob.name}); rebuild it.")
            dest = staged / "blobs" / "sha256" / blob.name
            size += self._link_shared(blob, dest)
            # Hashed just now, so verify (every build that reuses the entry) need not hash it
            # again; not a shared copy stored earlier (another inode): these bytes were not read.
            if dest.stat().st_ino == blob.stat().st_ino:
                stamps[blob.name] = _stamp(dest)
        for name in ("oci-layout", "index.json"):
            shutil.copyfile(layout / name, staged / name)
        jsonfile.write_json(staged / STAMPS, stamps, sort_keys=True)
        now = time.time()
        entry = Entry(key=key, stage=stage, inputs=dict(inputs), size=size, digest=digest,
                      build_seconds=round(build_seconds, 2), created=now, last_used=now,
                      hits=0, path=self.entry_root / key_hex(key))
        jsonfile.write_json(staged / "meta.json", entry.meta(), sort_keys=True)
        return self._place(staged, entry)

    def image_ref(self, stage: str, key: str) -> str:
        """The name the artifact of `stage` under `key` gets in the engine's image store."""
        return artifact_ref(self.namespace, stage, key)

    def add_image(self, *, key: str, stage: str, inputs: Mapping[str, Any], ref: str,
                  digest: str, size: int, build_seconds: float) -> Entry:
        """Record the image BuildKit stored as `ref` (its ID `digest`) as the artifact of
        `key`. Atomic like add: a rename, or an entry another process stored first."""
        now = time.time()
        entry = Entry(key=key, stage=stage, inputs=dict(inputs), size=size, digest=digest,
                      build_seconds=round(build_seconds, 2), created=now, last_used=now,
                      hits=0, path=self.entry_root / key_hex(key), image=ref)
        staged = self.scratch()
        try:
            jsonfile.write_json(staged / "meta.json", entry.meta(), sort_keys=True)
            return self._place(staged, entry)
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def _place(self, staged: Path, entry: Entry) -> Entry:
        self.entry_root.mkdir(parents=True, exist_ok=True)
        if entry.path.exists() and self.get(entry.key) is None:
            # An entry this store cannot use (an image on an engine it does not reach):
            # the one just built takes its place.
            self.remove(entry.key)
        try:
            os.rename(staged, entry.path)
        except OSError:
            # Another process stored the same key first; keys are content, so keep theirs.
            existing = self.get(entry.key)
            if existing is None:
                raise
            return existing
        if self._image_ids is not None and entry.image:
            self._image_ids[entry.image] = entry.digest
        return entry

    def touch(self, key: str) -> None:
        """Record a use (last used, hits) for cache.ls and pruning."""
        entry = self.get(key)
        if entry is None:
            return
        updated = dataclasses.replace(entry, last_used=time.time(), hits=entry.hits + 1)
        jsonfile.write_json(entry.path / "meta.json", updated.meta(), sort_keys=True)

    def remove(self, key: str) -> None:
        path = self.entry_root / key_hex(key)
        if not path.exists():
            return
        image = _image_of(path)
        if image and self.images is not None:
            self.images.remove(image)
            if self._image_ids is not None:
                self._image_ids.pop(image, None)
        # Rename first so a reader never sees half an entry.
        doomed = self.tmp / f"removed-{key_hex(key)}-{uuid.uuid4().hex[:8]}"
        self.tmp.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            return  # another process removed it first
        shutil.rmtree(doomed, ignore_errors=True)
        self.collect_garbage()

    def prune(self, *, max_size: int | None = None, older_than: float | None = None,
              keep_last: int | None = None) -> list[Entry]:
        """Remove entries unused for `older_than` seconds, then least recently used ones
        until the store fits `max_size` bytes; the `keep_last` most recently used entries
        of each stage always stay."""
        entries = sorted(self.all_entries(), key=lambda e: e.last_used, reverse=True)
        protected: set[str] = set()
        if keep_last:
            per_stage: dict[str, int] = {}
            for e in entries:
                per_stage[e.stage] = per_stage.get(e.stage, 0) + 1
                if per_stage[e.stage] <= keep_last:
                    protected.add(e.key)
        now = time.time()
        doomed = [e for e in entries if e.key not in protected and older_than is not None
                  and now - e.last_used > older_than]
        if max_size is not None:
            kept = [e for e in entries if e not in doomed]
            total = self.size(kept)
            for e in reversed(kept):
                if total <= max_size:
                    break
                if e.key in protected:
                    continue
                doomed.append(e)
                total = self.size([k for k in kept if k not in doomed])
        for e in doomed:
            # Not while a build reads or writes it.
            with locked(self.lock_path(e.key), shared=False, what=f"{e.stage} {e.key[:19]}"):
                self.remove(e.key)
        return doomed

    def size(self, entries: list[Entry] | None = None) -> int:
        """Bytes on disk for `entries` (shared blobs counted once)."""
        names: dict[str, int] = {}
        images = 0
        for e in entries if entries is not None else self.all_entries():
            if e.image:
                images += e.size   # in the engine's image store, layers shared with others
                continue
            for blob in _blob_files(e.path):
                # Another process may be removing the entry: what is gone takes no space.
                with contextlib.suppress(FileNotFoundError):
                    names[blob.name] = blob.stat().st_size
        return sum(names.values()) + images

    def collect_garbage(self) -> None:
        """Delete shared blobs that no entry links to any more."""
        if not self.blobs.exists():
            return
        for blob in self.blobs.iterdir():
            # Two processes may collect at once: a blob the other one took is already done.
            with contextlib.suppress(FileNotFoundError):
                if blob.stat().st_nlink == 1:
                    blob.unlink(missing_ok=True)

    def cleanup(self) -> None:
        """Remove work directories of processes that are gone (killed builds)."""
        if not self.tmp.exists():
            return
        own = str(os.getpid())
        for path in self.tmp.iterdir():
            pid = path.name.split("-", 1)[0]
            # This process is alive by definition: its own work is never asked about.
            if pid == own or (pid.isdigit() and _alive(int(pid))):
                continue
            shutil.rmtree(path, ignore_errors=True)

    def _link_shared(self, blob: Path, dest: Path) -> int:
        """Link `dest` to the shared copy of `blob`, making `blob` the shared copy when
        there is none yet; returns its size. Linked in this order, a shared blob has a
        second link from the moment it exists, so another process's garbage collection
        (which takes blobs with one link) never removes it from under this one."""
        shared = self.blobs / blob.name
        try:
            os.link(shared, dest)
        except FileNotFoundError:
            os.link(blob, dest)
            # Another process may share the same bytes first: then ours stay this entry's.
            with contextlib.suppress(FileExistsError):
                os.link(dest, shared)
        return dest.stat().st_size


def _blob_files(layout: Path) -> Iterator[Path]:
    directory = layout / "blobs" / "sha256"
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return  # no blobs, or another process is removing the entry
    yield from (p for p in (directory / name for name in names) if p.is_file())


def _stamp(blob: Path) -> list[int]:
    info = blob.stat()
    return [info.st_size, info.st_mtime_ns, info.st_ino]


def _blob_ok(blob: Path) -> bool:
    digest = hashlib.sha256()
    with blob.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest() == blob.name


def _top_digest(layout: Path) -> str:
    try:
        index = json.loads((layout / "index.json").read_text())
        return str(index["manifests"][0]["digest"])
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise CacheError(f"{layout}: not an OCI layout BuildKit wrote ({exc}).") from None


def _image_of(entry_path: Path) -> str | None:
    try:
        data = json.loads((entry_path / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    image = data.get("image") if isinstance(data, dict) else None
    return image if isinstance(image, str) and image else None


# meta.json's keys and the types each must have (Entry's fields, its path aside).
_META_TYPES: dict[str, tuple[type, ...]] = {
    "key": (str,), "stage": (str,), "inputs": (dict,), "size": (int,), "digest": (str,),
    "build_seconds": (int, float), "created": (int, float), "last_used": (int, float),
    "hits": (int,), "image": (str, type(None))}


def _meta_problem(data: Any, key: str) -> str | None:
    """Why an entry's meta.json cannot be an Entry for `key`, or None."""
    if isinstance(data, Exception):
        return f"not readable ({data})"
    if not isinstance(data, dict):
        return "not a JSON object"
    missing = sorted(set(_META_TYPES) - set(data) - {"image"})
    unknown = sorted(set(data) - set(_META_TYPES))
    if missing or unknown:
        return f"keys {missing or unknown} {'missing' if missing else 'unknown'}"
    for name, types in _META_TYPES.items():
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, types):
            return f"{name} is {value!r:.40}"
    if data["key"] != key:
        return f"it names key {data['key'][:19]}, not its own {key[:19]}"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

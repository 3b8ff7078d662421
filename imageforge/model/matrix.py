"""A matrix: the images a team keeps, in one file, planned and built together.

    # images.toml
    [[image]]
    manifest = "manifests/smddp.toml"       # relative to this file
    target = "smddp"                        # default: the manifest's image
    tag = "registry.example.com/smddp:{stages.efa.version}"
    set = ["stages.pytorch.max_jobs=8"]     # --set overrides of this image
    [image.matrix]                          # optional axes: one image per combination
    "stages.efa.version" = ["1.14.1", "1.15.1"]

Every image is planned from its manifest with its overrides; a stage with the same key in
several images is one build (the artifact cache holds it after the first), so building the
matrix builds each distinct key once.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from imageforge.errors import FatalError, ManifestError
from imageforge.model import tomlfile, validate
from imageforge.textsafe import escaped, shown

KEYS = ("manifest", "target", "tag", "set", "matrix")
# More images than any team keeps in one file: ten axes of ten values would otherwise expand
# to 10^10 plans before the first is built.
MAX_IMAGES = 256
_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.-]+)\}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
    manifest: Path
    target: str | None
    tag: str | None
    overrides: tuple[str, ...]
    # Where it is written ("images.toml: image 2"), and its [image.matrix] axes: what an error
    # about its manifest, target or overrides names instead of flags nobody gave.
    where: str = ""
    axes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The image as output lines name it; its values come from the file, escaped."""
        sets = " ".join(f"--set {escaped(o)}" for o in self.overrides)
        return " ".join(p for p in (escaped(str(self.manifest), None),
                                    escaped(self.target or ""), sets) if p)


def load(path: Path) -> list[Entry]:
    """The images `path` lists, axes expanded, in file order."""
    shown_path = escaped(str(path), None)
    try:
        document = tomlfile.parse(tomlfile.read_text(path, what="matrix file"))
    except FileNotFoundError:
        raise ManifestError(f"{shown_path}: no such matrix file; pass --file with one.") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{shown_path}: invalid TOML: {exc}; fix the syntax there.") from None
    unknown = sorted(set(document) - {"image"})
    images = document.get("image")
    if unknown or not isinstance(images, list) or not images:
        raise ManifestError(f"{shown_path}: a matrix is a list of [[image]] tables (manifest, "
                            "target, tag, set, matrix); add at least one.")
    entries: list[Entry] = []
    for index, table in enumerate(images, start=1):
        entries += _entries(path, index, table, room=MAX_IMAGES - len(entries))
    return entries


def _entries(path: Path, index: int, table: Mapping[str, Any], room: int) -> list[Entry]:
    where = f"{escaped(str(path), None)}: image {index}"
    folder = escaped(str(path.parent), None)
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ManifestError(f"{where}: unknown key {shown(unknown[0])}; an image has "
                            f"{', '.join(KEYS)}.")
    manifest = table.get("manifest")
    if not isinstance(manifest, str) or not manifest:
        raise ManifestError(f"{where}: manifest = \"<path>\" is required (relative to "
                            f"{folder}).")
    if not (path.parent / manifest).is_file():
        raise ManifestError(f"{where}: manifest = {shown(manifest)}: no such file (paths are "
                            f"relative to {folder}); fix the path.")
    target, tag = table.get("target"), table.get("tag")
    for key, value in (("target", target), ("tag", tag)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ManifestError(f"{where}: {key} must be a non-empty string.")
    sets = table.get("set", [])
    if not isinstance(sets, list) or not all(isinstance(s, str) and "=" in s for s in sets):
        raise ManifestError(f"{where}: set must be a list of \"KEY=VALUE\" strings.")
    axes = table.get("matrix", {})
    if not isinstance(axes, dict) or not all(
            isinstance(v, list) and v and all(isinstance(x, str) for x in v)
            for v in axes.values()):
        raise ManifestError(f"{where}: matrix must map dotted keys to non-empty lists of "
                            'strings, e.g. "stages.efa.version" = ["1.14.1", "1.15.1"].')
    names = list(axes)
    if math.prod(len(axes[n]) for n in names) > room:
        raise ManifestError(f"{where}: [image.matrix] expands the file past {MAX_IMAGES} "
                            "images; split it into several matrix files or drop values.")
    entries = []
    for values in itertools.product(*(axes[n] for n in names)) if names else [()]:
        chosen = dict(zip(names, values, strict=True))
        filled = _fill(tag, chosen, where) if tag else None
        if filled is not None and validate.problem("image", filled) is not None:
            raise ManifestError(f"{where}: tag {shown(filled)} is not an image reference; give "
                                "[REGISTRY/]REPOSITORY[:TAG] in lower case.")
        entries.append(Entry(
            manifest=(path.parent / manifest),
            target=target,
            tag=filled,
            overrides=(*sets, *(f"{n}={v}" for n, v in chosen.items())),
            where=where,
            axes=tuple(names),
        ))
    return entries


def blame(entry: Entry, exc: FatalError) -> FatalError:
    """`exc`, raised while planning `entry`, said of the file: its `target`, its `set` list or
    a `[image.matrix]` axis, not the flags a command line would have had. Same exit code,
    except that a bad target is bad file content here (exit 2)."""
    text = str(exc)
    if text.startswith("--set "):
        key = text.removeprefix("--set ").split("=", 1)[0]
        what = "[image.matrix] axis" if key in entry.axes else "set entry"
        return type(exc)(f"{entry.where}: {what} {text.removeprefix('--set ')}")
    if text.startswith("--target: ") and entry.target is None:
        found = text.removeprefix("--target: ").split("; pass --target", 1)[0]
        return ManifestError(f"{entry.where}: {found}; add target = \"...\" to this image.")
    if text.startswith("--target "):
        return ManifestError(f"{entry.where}: target {text.removeprefix('--target ')}")
    return type(exc)(f"{entry.where} ({entry.manifest.name}): {text}")


def _fill(tag: str, chosen: Mapping[str, str], where: str) -> str:
    def value(match: re.Match[str]) -> str:
        if match.group(1) not in chosen:
            raise ManifestError(f"{where}: tag {shown(tag)} names {{{match.group(1)}}}, which is "
                                f"not one of its matrix axes ({', '.join(chosen) or 'none'}).")
        return chosen[match.group(1)]

    return _PLACEHOLDER.sub(value, tag)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Planned:
    entry: Entry
    target: str
    keys: Mapping[str, str]        # stage -> key
    statuses: Mapping[str, str]    # stage -> cached / remote / build


def summary(plans: Sequence[Planned]) -> dict[str, Any]:
    """How much the images share: stage slots, distinct keys, and what each builds new."""
    seen: set[str] = set()
    images = []
    for planned in plans:
        new = [name for name, key in planned.keys.items()
               if key not in seen and planned.statuses[name] == "build"]
        shared = [name for name, key in planned.keys.items() if key in seen]
        seen.update(planned.keys.values())
        images.append({"image": planned.entry.label, "target": planned.target,
                       "stages": len(planned.keys), "builds": new, "shared": shared})
    slots = sum(len(p.keys) for p in plans)
    to_build = {key for p in plans for name, key in p.keys.items()
                if p.statuses[name] == "build"}
    return {"images": images, "stage_slots": slots, "distinct_keys": len(seen),
            "keys_to_build": len(to_build)}

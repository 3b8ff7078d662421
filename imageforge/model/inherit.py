"""Manifest inheritance: `inherit = "smddp.toml"` takes another manifest's tables and
overrides only what differs.

Tables merge key by key ([image], each [stages.<name>], [waive]); a key the child sets
replaces the parent's value whole (a list is not appended to). The result is one effective
document, the same a full copy would be, so keys and locks depend on it alone. Each key
remembers the file that set it, for error messages and `invoke show`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from imageforge.errors import ManifestError
from imageforge.model import tomlfile
from imageforge.textsafe import escaped, shown

KEY = "inherit"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Origin:
    """A manifest file that set some keys: its path and text (for line numbers)."""

    path: Path
    text: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Effective:
    document: dict[str, Any]
    # Dotted key (table or value) -> the file that set it; absent: the manifest itself.
    origins: dict[str, Origin]
    # The files read, child first.
    chain: tuple[Path, ...]


def read(path: Path, text: str, document: dict[str, Any]) -> Effective:
    """`document` (parsed from `path`) with everything it inherits, nearest file winning."""
    chain = [path.resolve()]
    layers: list[tuple[Origin, dict[str, Any]]] = [(Origin(path=path, text=text), document)]
    current, current_doc = path, document
    while KEY in current_doc:
        parent = current_doc[KEY]
        here = escaped(str(current), None)
        # A NUL cannot be in a path: the system would refuse it with a ValueError.
        if not isinstance(parent, str) or not parent or "\0" in parent:
            raise ManifestError(f"{here}: inherit: expected the path of another manifest, "
                                'e.g. inherit = "smddp.toml".')
        parent_path = (current.parent / parent).resolve()
        if parent_path in chain:
            loop = " -> ".join(escaped(str(p), None) for p in [*chain, parent_path])
            raise ManifestError(f"{here}: inherit = {shown(parent)} makes a loop ({loop}); "
                                "remove one of the inherits.")
        try:
            parent_text = tomlfile.read_text(parent_path, what="manifest",
                                             context=f"inherited by {here}")
        except FileNotFoundError:
            raise ManifestError(f"{here}: inherit = {shown(parent)}: no such manifest "
                                f"({escaped(str(parent_path), None)}); the path is relative to "
                                f"{escaped(str(current.parent), None)}.") from None
        try:
            parent_doc = tomlfile.parse(parent_text)
        except tomllib.TOMLDecodeError as exc:
            raise ManifestError(f"{escaped(str(parent_path), None)}: invalid TOML: {exc}; fix "
                                f"the syntax there (inherited by {here}).") from None
        chain.append(parent_path)
        layers.append((Origin(path=parent_path, text=parent_text), parent_doc))
        current, current_doc = parent_path, parent_doc
    merged: dict[str, Any] = {}
    origins: dict[str, Origin] = {}
    # Farthest ancestor first: each nearer file overrides what it sets.
    for origin, layer in reversed(layers):
        _merge(merged, {k: v for k, v in layer.items() if k != KEY}, "", origin, origins)
    return Effective(document=merged, origins=origins, chain=tuple(chain))


def _merge(into: dict[str, Any], layer: dict[str, Any], prefix: str, origin: Origin,
           origins: dict[str, Origin]) -> None:
    for key, value in layer.items():
        dotted = f"{prefix}{key}"
        # [image], [waive] and [stages] hold tables of keys; a stage's table holds values.
        nested = isinstance(value, dict) and prefix in ("", "stages.")
        if nested and isinstance(into.get(key), dict):
            origins.setdefault(dotted, origin)
            _merge(into[key], value, dotted + ".", origin, origins)
            continue
        into[key] = _copy(value)
        origins[dotted] = origin
        if isinstance(value, dict):
            for inner in _dotted_keys(value, dotted + "."):
                origins[inner] = origin


def _dotted_keys(table: dict[str, Any], prefix: str) -> list[str]:
    keys = []
    for key, value in table.items():
        keys.append(prefix + key)
        if isinstance(value, dict):
            keys.extend(_dotted_keys(value, prefix + key + "."))
    return keys


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value

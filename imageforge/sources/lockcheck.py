"""The values of a lock file, checked as a manifest's are: a lock arrives through pull requests
and CI caches, and its pins reach RUN lines, FROM lines and pip's requirements files.

Each pin key has one form wherever it appears (a source's `sha256` or `commit`, the base's
`digest`, an upgrade's `to`, a lock pin's `version` or `wheel_url`, a pip set's `packages`).
`evidence` and `source` are reports only, never rendered, and stay free text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from packaging.version import InvalidVersion, Version

from imageforge.model import validate

_HASH = re.compile(r"sha256:[0-9a-f]{64}")
_PACKAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _digest(value: Any) -> str | None:
    return None if value is None else validate.problem("digest", value)


def _packages(value: Any) -> str | None:
    """A pip set: [{name, version, hashes: ["sha256:..."]}, ...]."""
    if not isinstance(value, list):
        return "expected a list of {name, version, hashes} tables"
    for package in value:
        if not isinstance(package, dict) or set(package) != {"name", "version", "hashes"}:
            return f"{package!r:.60} is not a {{name, version, hashes}} table"
        name, version, hashes = package["name"], package["version"], package["hashes"]
        if not isinstance(name, str) or not _PACKAGE.fullmatch(name):
            return f"package name {name!r:.60} is not allowed"
        try:
            if not isinstance(version, str) or validate.problem("version", version):
                raise InvalidVersion
            Version(version)
        except InvalidVersion:
            return f"{name}: version {version!r:.60} is not an exact PEP 440 version"
        if not isinstance(hashes, list) or not hashes or \
                not all(isinstance(h, str) and _HASH.fullmatch(h) for h in hashes):
            return f"{name}: hashes must be a non-empty list of 'sha256:<64 hex digits>'"
    return None


def _names(value: Any) -> str | None:
    if isinstance(value, list) and all(validate.problem("name", v) is None for v in value):
        return None
    return "expected a list of stage names"


# Pin key -> why its value is wrong (None: fine). partial, not a function here that makes a
# closure: that one would run once, at import, where mutation testing never reaches it.
CHECKS: dict[str, Callable[[Any], str | None]] = {
    "sha256": partial(validate.problem, "sha256"),
    "commit": partial(validate.problem, "commit"),
    "digest": _digest,
    "version": partial(validate.problem, "version"),
    "to": partial(validate.problem, "version"),
    "wheel_url": partial(validate.problem, "url"),
    "packages": _packages,
    "provides": _names,
}


# Keys an entry of these sections cannot be without: settling reads them.
REQUIRED: dict[str, tuple[str, ...]] = {"pip": ("packages",), "upgraded": ("to",),
                                        "extends": ("provides",)}


def problem(pin: Mapping[str, Any], section: str) -> tuple[str, str] | None:
    """The first pin key whose value is not allowed or that is missing, and why."""
    for key in REQUIRED.get(section, ()):
        if key not in pin:
            return key, "missing"
    for key, check in CHECKS.items():
        if key in pin:
            why = check(pin[key])
            if why is not None:
                return key, why
    return None


def epoch_problem(value: Any) -> str | None:
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
    return None if ok else f"source_date_epoch {value!r:.40} is not a whole number of seconds"

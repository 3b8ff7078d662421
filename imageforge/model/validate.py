"""Strict shapes for every manifest value that can reach a shell command or Dockerfile text.

A value is checked here once, when the manifest is loaded; renderers still quote what they
emit, so a pattern that is too loose is not by itself an injection.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from imageforge.textsafe import shown

Kind = Literal[
    "version", "url", "repo", "ref", "sha256", "commit", "digest", "path", "image",
    "bool", "int", "arch", "arch_list", "packages", "flags", "args", "name", "text",
    "specifier", "fingerprint", "entry_point", "host_path", "file_name", "names",
    "cuda", "python", "jobs",
]

_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z._+-]{0,63}")
# No quotes, whitespace, backslashes, backticks or '$': nothing a shell would interpret.
_URL = re.compile(r"(https?|file)://[A-Za-z0-9._~:/?#\[\]@!&()*+,;=%{}-]+")
_PATH_SOURCE = re.compile(r"[A-Za-z0-9._/][A-Za-z0-9._/+@{}-]*")
_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/+{}-]{0,127}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_ABS_PATH = re.compile(r"/[A-Za-z0-9._/+-]*")
_IMAGE = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
_ARCH = re.compile(r"[0-9]{1,2}\.[0-9](\+PTX)?")
_PACKAGE = re.compile(
    r"([A-Za-z0-9_-]+::)?[A-Za-z0-9][A-Za-z0-9._+-]*"  # conda channel::name or pip name
    r"(\[[A-Za-z0-9,_-]+\])?([<>=!~]=?[A-Za-z0-9.*+,<>=!~-]+)?"  # [extras] and specifier
)
_FLAG = re.compile(r"-{1,2}[A-Za-z0-9][A-Za-z0-9_-]*(=[A-Za-z0-9._/+,:=-]+)?")
_ARG = re.compile(r"(-{1,2})?[A-Za-z0-9][A-Za-z0-9_.-]*(=[A-Za-z0-9._/+,:=-]+)?")
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_FINGERPRINT = re.compile(r"[0-9A-Fa-f]{40}")
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_ENTRY_POINT = re.compile(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}")
# A directory on the build host; it reaches BuildKit as a context path, never Dockerfile text.
_HOST_PATH = re.compile(r"[A-Za-z0-9._/~+@][A-Za-z0-9._/~+@-]*")
# The rules compare these numerically: a value they cannot read would skip them silently.
_CUDA = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}(\.[0-9]{1,3})?")
_PYTHON = re.compile(r"3\.[0-9]{1,2}")
MAX_JOBS = 4096
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*(/[A-Za-z0-9_][A-Za-z0-9._+-]*)*")

ALLOWED: Final[dict[str, str]] = {
    "version": "letters, digits and . _ + - (e.g. 2.10.3 or 1.1.3-aws)",
    "url": "an https://, http:// or file:// URL or a plain path, without quotes, spaces or $",
    "repo": "an https://, http:// or file:// git URL or a plain path, not starting with '-'",
    "ref": "a git tag or branch name (letters, digits, . _ / + -), not starting with '-'",
    "sha256": "64 lowercase hex digits",
    "commit": "a full 40-hex-digit git commit SHA",
    "digest": "an image digest 'sha256:<64 hex digits>'",
    "path": "an absolute path of letters, digits and . _ / + - without '..'",
    "image": "an image reference like 'nvidia/cuda:11.3.1-cudnn8-devel-ubuntu20.04'",
    "bool": "true or false",
    "int": "a whole number",
    "jobs": f"a whole number of parallel jobs from 1 to {MAX_JOBS}",
    "cuda": "a CUDA version like 12.4 or 11.3.1",
    "python": "a Python major.minor like 3.11",
    "arch": "a CUDA compute capability like '8.0' (or '7.0+PTX')",
    "arch_list": "a list of CUDA compute capabilities like [\"7.0\", \"8.0\"]",
    "packages": "a list of package specs like [\"numpy\", \"mpi4py==3.0.3\"]",
    "flags": "a list of command-line flags like [\"--skip-kmod\", \"-g\"]",
    "args": "a list of arguments like [\"threading=multi\", \"cxxflags=-fPIC\"]",
    "name": "lowercase letters, digits and . _ -",
    "text": "one line of text without quotes, backslashes, '$' or backticks",
    "specifier": "a version specifier like '~=1.14' or '>=2.10,<2.12'",
    "fingerprint": "a 40-hex-digit OpenPGP key fingerprint (spaces allowed)",
    "entry_point": "a Python entry point like 'package.module:function'",
    "host_path": "a directory path (relative to the manifest, or absolute) without spaces",
    "file_name": "a relative file path like 'train.py' or 'src/train.py', without '..'",
    "names": "a list of lower-case names (letters, digits, . _ -) like [\"efa\", \"nccl\"]",
}


def _full(pattern: re.Pattern[str]) -> Callable[[str], bool]:
    return lambda value: pattern.fullmatch(value) is not None


def _is_source(value: str) -> bool:
    if value.startswith("-"):
        return False
    return bool(_URL.fullmatch(value) or _PATH_SOURCE.fullmatch(value))


def _is_path(value: str) -> bool:
    return bool(_ABS_PATH.fullmatch(value)) and ".." not in value.split("/")


def _is_ref(value: str) -> bool:
    return bool(_REF.fullmatch(value)) and ".." not in value and not value.endswith((".lock", "/"))


def _is_specifier(value: str) -> bool:
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        return False
    return bool(value.strip())


def _is_fingerprint(value: str) -> bool:
    return bool(_FINGERPRINT.fullmatch(value.replace(" ", "")))


def _is_text(value: str) -> bool:
    return not any(c in value for c in "\"'\\$`") and value.isprintable()


_STRING_CHECKS: Final[dict[str, Callable[[str], bool]]] = {
    "version": _full(_VERSION),
    "url": _is_source,
    "repo": _is_source,
    "ref": _is_ref,
    "sha256": _full(_SHA256),
    "commit": _full(_COMMIT),
    "digest": _full(_DIGEST),
    "path": _is_path,
    "image": _full(_IMAGE),
    "arch": _full(_ARCH),
    "name": _full(_NAME),
    "text": _is_text,
    "specifier": _is_specifier,
    "fingerprint": _is_fingerprint,
    "entry_point": _full(_ENTRY_POINT),
    "host_path": _full(_HOST_PATH),
    "file_name": _full(_FILE_NAME),
    "cuda": _full(_CUDA),
    "python": _full(_PYTHON),
}

_LIST_ITEM: Final[dict[str, Callable[[str], bool]]] = {
    "arch_list": _full(_ARCH),
    "packages": _full(_PACKAGE),
    "flags": _full(_FLAG),
    "args": _full(_ARG),
    "names": _full(_NAME),
}


def problem(kind: Kind, value: Any) -> str | None:
    """Why `value` is not a valid `kind`, or None when it is."""
    if kind == "bool":
        return None if isinstance(value, bool) else f"expected {ALLOWED[kind]}"
    if kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else f"expected {ALLOWED[kind]}"
    if kind == "jobs":
        ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_JOBS
        return None if ok else f"{shown(value)} is not allowed: expected {ALLOWED[kind]}"
    if kind in _LIST_ITEM:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return f"expected {ALLOWED[kind]}"
        bad = [v for v in value if not _LIST_ITEM[kind](v)]
        return f"{shown(bad[0])} is not allowed: expected {ALLOWED[kind]}" if bad else None
    if not isinstance(value, str):
        return f"expected a string: {ALLOWED[kind]}"
    if not _STRING_CHECKS[kind](value):
        return f"{shown(value)} is not allowed: expected {ALLOWED[kind]}"
    return None

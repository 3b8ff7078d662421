"""Plain-text sources of the sample upstream, rendered with per-version variables.

Sources live in ``sample/sources/<component>/``. Every file is a template: ``@@NAME@@`` is
replaced by a variable. The marker is deliberately unlike ``${...}``, ``$(...)`` and autoconf's
``@VAR@`` so that shell, make and m4 text needs no escaping. A trailing ``.tmpl`` is dropped from
the file name: Python files of the sample projects are stored as ``*.py.tmpl`` so that the
project's own linters and type checker do not treat them as project code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SOURCES = Path(__file__).resolve().parent / "sources"

_PLACEHOLDER = re.compile(r"@@([A-Z][A-Z0-9_]*)@@")
_TEMPLATE_SUFFIX = ".tmpl"


class TemplateError(Exception):
    """A template names a variable that the generator does not provide."""


@dataclass(frozen=True)
class SourceFile:
    """One rendered file: its path inside the component, bytes and unix mode."""

    path: str
    data: bytes
    mode: int


def render_text(text: str, variables: Mapping[str, str], origin: str) -> str:
    """Substitute every ``@@NAME@@``; a missing variable is an error, not an empty string."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in variables:
            raise TemplateError(f"{origin}: no value for @@{name}@@")
        return variables[name]

    return _PLACEHOLDER.sub(substitute, text)


def file_mode(data: bytes) -> int:
    """Scripts (a shebang line) are executable; everything else is a plain file.

    Deciding by content rather than by the checkout's permission bits keeps the output the
    same whatever umask or copy tool put the sources on disk.
    """
    return 0o755 if data.startswith(b"#!") else 0o644


def output_name(relative: str) -> str:
    """The path a source file gets in the generated upstream."""
    if relative.endswith(_TEMPLATE_SUFFIX):
        return relative[: -len(_TEMPLATE_SUFFIX)]
    return relative


def list_sources(component: str) -> list[Path]:
    """Every source file of a component, in a stable order."""
    base = SOURCES / component
    if not base.is_dir():
        raise TemplateError(f"no sources for component {component!r} in {SOURCES}")
    files = [p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return sorted(files, key=lambda p: p.relative_to(base).as_posix())


def render_component(component: str, variables: Mapping[str, str]) -> list[SourceFile]:
    """Render all sources of ``component`` with ``variables``."""
    base = SOURCES / component
    rendered: list[SourceFile] = []
    for path in list_sources(component):
        relative = path.relative_to(base).as_posix()
        text = render_text(path.read_text(encoding="utf-8"), variables, f"{component}/{relative}")
        data = text.encode("utf-8")
        rendered.append(SourceFile(output_name(relative), data, file_mode(data)))
    return rendered


def render_one(component: str, relative: str, variables: Mapping[str, str]) -> bytes:
    """Render a single source file (for sources that are compiled rather than shipped)."""
    path = SOURCES / component / relative
    text = render_text(path.read_text(encoding="utf-8"), variables, f"{component}/{relative}")
    return text.encode("utf-8")

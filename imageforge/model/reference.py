"""The manifest reference, docs/manifest.md (every key, type, default, meaning), generated
from the stage registry so the docs cannot drift from the code."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from imageforge.model.manifest import IMAGE_FIELDS
from imageforge.model.stage import Field, Stage


def _default(field: Field) -> str:
    if field.required:
        return "required"
    if field.locked:
        return "from the lock"
    if field.default is None:
        return ""
    return f"`{json.dumps(field.default)}`"


def _table(title: str, fields: Mapping[str, Field]) -> str:
    rows = [f"### `{title}`", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    for key, field in fields.items():
        kind = field.kind + (f" ({' / '.join(field.choices)})" if field.choices else "")
        rows.append(f"| `{key}` | {kind} | {_default(field)} | {field.help} |")
    return "\n".join(rows)


PAGE_INTRO = """\
# Manifest reference

Generated from the stage modules by `invoke docs`; do not edit by hand.

A manifest is a TOML file with one `[image]` table and one `[stages.<name>]` table per stage
the image needs. Every value is validated (type and a strict pattern) when the manifest is
loaded, and `--set KEY=VALUE` overrides are validated the same way. Keys marked "from the
lock" are filled in by `invoke lock`; you may also pin them by hand. URLs and refs may use
`{version}` (and `{version_underscored}`, e.g. 1_73_0).

"""


def page(registry: Mapping[str, Stage]) -> str:
    """docs/manifest.md: every key with its type, default and meaning, and each stage's own
    description and example."""
    parts = [PAGE_INTRO + _table("[image]", IMAGE_FIELDS)]
    for name, stage in registry.items():
        # Docstring sections ("# Parameters", "# Examples") become bold labels, not titles.
        doc = re.sub(r"^# (\w+)$", r"**\1**", stage.doc.strip(), flags=re.M)
        parts.append(f"## Stage `{name}`\n\n{doc}" + (
            "\n\n" + _table(f"[stages.{name}]", stage.fields) if stage.fields else ""))
    return "\n\n".join(parts) + "\n"


def update_page(path: Path, registry: Mapping[str, Stage]) -> bool:
    text = page(registry)
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True

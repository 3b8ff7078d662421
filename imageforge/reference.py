"""The manifest reference (every key, type, default, meaning), generated from the stage
registry so the README cannot drift from the code."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from imageforge.manifest import IMAGE_FIELDS
from imageforge.stage import Field, Stage

START = "<!-- manifest-reference:start -->"
END = "<!-- manifest-reference:end -->"


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


def markdown(registry: Mapping[str, Stage]) -> str:
    parts = [_table("[image]", IMAGE_FIELDS)]
    parts += [_table(f"[stages.{name}]", stage.fields)
              for name, stage in registry.items() if stage.fields]
    return "\n\n".join(parts) + "\n"


def update_readme(readme: Path, registry: Mapping[str, Stage]) -> bool:
    """Rewrite the generated section of the README; True when it changed."""
    text = readme.read_text()
    section = f"{START}\n{markdown(registry)}{END}"
    updated = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: section, text,
                     flags=re.S)
    if updated == text:
        return False
    readme.write_text(updated)
    return True

"""Small JSON files imageforge keeps (records, reports, metadata)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

"""Set what imageforge needs in dockerd's daemon.json, keeping every other key.

Usage: python3 scripts/daemon_json.py PATH KEEP
  exits 0 having changed PATH, 3 when it already had both settings, 1 (one sentence on
  stderr) when PATH is not a JSON object.

- features.containerd-snapshotter = true: the containerd image store lets the default buildx
  driver export cache.
- builder.gc = {"enabled": true, "defaultKeepStorage": KEEP} unless daemon.json has a gc of
  its own (a policy, a size, or gc turned off: the user's to keep). Without it dockerd runs
  BuildKit with no garbage collection at all (moby/moby#49826) and the build cache grows until
  the disk is full.

Plain python3 (it runs before any virtual environment exists); written through a temporary
file and a rename, so a failure leaves the old file whole.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

UNCHANGED = 3


def updated(config: dict[str, Any], keep: str) -> dict[str, Any]:
    new = json.loads(json.dumps(config))
    new.setdefault("features", {})["containerd-snapshotter"] = True
    new.setdefault("builder", {}).setdefault("gc", {"enabled": True, "defaultKeepStorage": keep})
    return new


def main(argv: list[str]) -> int:
    path, keep = Path(argv[0]), argv[1]
    try:
        text = path.read_text() if path.exists() else ""
        config = json.loads(text) if text.strip() else {}
    except (OSError, ValueError) as exc:
        print(f"setup-host: error: {path} is not readable JSON ({exc}); fix or remove it "
              "and run again.", file=sys.stderr)
        return 1
    if not isinstance(config, dict) or not isinstance(config.get("features", {}), dict) \
            or not isinstance(config.get("builder", {}), dict):
        print(f"setup-host: error: {path} must be a JSON object whose features and builder "
              "are objects; fix it and run again.", file=sys.stderr)
        return 1
    new = updated(config, keep)
    if new == config:
        return UNCHANGED
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".daemon.json.")
    except OSError as exc:
        print(f"setup-host: error: cannot write {path} ({exc.strerror}); run as root.",
              file=sys.stderr)
        return 1
    with os.fdopen(fd, "w") as out:
        json.dump(new, out, indent=2)
        out.write("\n")
    os.chmod(temp, 0o644)
    os.replace(temp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

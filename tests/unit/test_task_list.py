"""What people read first: `invoke --list` summaries are whole sentences, and the
`imageforge` command runs the same tasks from outside the checkout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRY = Path(sys.executable).parent / "imageforge"


def summaries(listing: str) -> dict[str, str]:
    """Task name -> its summary, continuation lines joined."""
    found: dict[str, str] = {}
    name = ""
    for line in listing.splitlines():
        match = re.match(r"^  (\S+)\s{2,}(.*)$", line)
        if match:
            name = match.group(1)
            found[name] = match.group(2).strip()
        elif name and line.startswith(" " * 4) and line.strip():
            found[name] += " " + line.strip()
    return found


def test_every_task_summary_is_a_whole_sentence() -> None:
    listing = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "--list"],
                             capture_output=True, text=True, check=True).stdout
    found = summaries(listing)
    assert {"build", "bench", "run-local", "test-image", "mirror.sync"} <= set(found)
    for name, text in found.items():
        assert text.endswith("."), (name, text)
        assert text.count("(") == text.count(")"), (name, text)


def test_the_imageforge_command_works_outside_the_checkout(tmp_path: Path) -> None:
    env = {**os.environ, "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path / "cache")}
    listing = subprocess.run([str(ENTRY), "--list"], cwd=tmp_path, capture_output=True,
                             text=True, check=True, env=env).stdout
    assert set(summaries(listing)) >= {"build", "plan", "lock", "cache.ls"}
    plan = subprocess.run([str(ENTRY), "plan", "--target", "efa", "--json", "--manifest",
                           str(ROOT / "manifests/smddp.toml")], cwd=tmp_path,
                          capture_output=True, text=True, env=env, check=False)
    assert plan.returncode == 0, plan.stderr
    assert [s["name"] for s in json.loads(plan.stdout)["stages"]] == ["base", "efa"]
    # Relative paths are the caller's: the default manifest is not found here, in one line.
    missing = subprocess.run([str(ENTRY), "plan"], cwd=tmp_path, capture_output=True,
                             text=True, env=env, check=False)
    assert missing.returncode == 2, missing.stderr
    assert "manifests/smddp.toml" in missing.stderr
    assert "Traceback" not in missing.stderr

"""`imageforge --version` names the release pyproject.toml declares."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_console_command_prints_the_project_version(tmp_path: Path) -> None:
    release = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    command = Path(sys.executable).with_name("imageforge")
    # From another directory: the command must not depend on being run inside the checkout.
    result = subprocess.run([str(command), "--version"], cwd=tmp_path, capture_output=True,
                            text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["imageforge", release]

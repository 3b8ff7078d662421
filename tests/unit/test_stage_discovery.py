"""A team's own stages, dropped into a directory named in the invoke config: the GDRCopy
module of docs/adding-a-stage.md works as one file, and a broken module is refused in one
sentence naming it (real `invoke` subprocesses)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.S)
MANIFEST = ROOT / "manifests/smddp.toml"


def gdrcopy_module() -> str:
    code: str
    (code,) = [body for lang, body in FENCE.findall((ROOT / "docs/adding-a-stage.md").read_text())
               if lang == "python"]
    return code


def invoke(*args: str, stage_dirs: str | None, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp / "cache")}
    env.pop("INVOKE_IMAGEFORGE_STAGE_DIRS", None)
    if stage_dirs is not None:
        env["INVOKE_IMAGEFORGE_STAGE_DIRS"] = stage_dirs
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], cwd=tmp,
                          capture_output=True, text=True, env=env, check=False, timeout=120)


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "team.toml"
    path.write_text(MANIFEST.read_text() + '\n[stages.gdrcopy]\nversion = "2.4.1"\n')
    return path


def test_a_stage_dropped_into_a_team_directory_plans_renders_and_keys(
        manifest: Path, tmp_path: Path) -> None:
    team = tmp_path / "team-stages"
    team.mkdir()
    (team / "gdrcopy.py").write_text(gdrcopy_module())
    (team / "_helpers.py").write_text("raise SystemExit('never imported')\n")
    # Without the directory, imageforge has no such stage.
    unknown = invoke("plan", "--target", "gdrcopy", "--manifest", str(manifest),
                     stage_dirs=None, tmp=tmp_path)
    assert unknown.returncode != 0
    assert "gdrcopy" in unknown.stderr
    planned = invoke("plan", "--target", "gdrcopy", "--manifest", str(manifest), "--json",
                     stage_dirs=str(team), tmp=tmp_path)
    assert planned.returncode == 0, planned.stderr
    stages = {s["name"]: s for s in json.loads(planned.stdout)["stages"]}
    assert list(stages) == ["base", "gdrcopy"]
    rendered = invoke("render", "--target", "gdrcopy", "--manifest", str(manifest),
                      stage_dirs=str(team), tmp=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    assert "FROM base AS gdrcopy" in rendered.stdout
    assert 'make -j"$(nproc)" prefix=/opt/gdrcopy' in rendered.stdout
    bumped = invoke("plan", "--target", "gdrcopy", "--manifest", str(manifest), "--json",
                    "--set", "stages.gdrcopy.version=2.4.2", stage_dirs=str(team), tmp=tmp_path)
    keys = {s["name"]: s["key"] for s in json.loads(bumped.stdout)["stages"]}
    assert keys["gdrcopy"] != stages["gdrcopy"]["key"]
    assert keys["base"] == stages["base"]["key"]


@pytest.mark.parametrize(("body", "says"), [
    ("import nonexistent_team_helper\n", "loading the stage module failed: "
                                         "ModuleNotFoundError"),
    ("VALUE = 1\n", "must define STAGE = Stage(...)"),
    ("from stages.nccl import STAGE\n", "stage 'nccl' is already defined in imageforge's"),
    (None, "needs cuda-toolkit, which no stage module defines"),
])
def test_a_broken_team_stage_is_refused_naming_its_file(
        body: str | None, says: str, manifest: Path, tmp_path: Path) -> None:
    team = tmp_path / "team-stages"
    team.mkdir()
    if body is None:
        body = gdrcopy_module().replace('deps=("base",)', 'deps=("base", "cuda-toolkit")')
    (team / "broken.py").write_text(body)
    result = invoke("plan", "--target", "smddp", "--manifest", str(manifest),
                    stage_dirs=str(team), tmp=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert says in result.stderr, result.stderr
    assert str(team) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_stage_directory_is_refused(manifest: Path, tmp_path: Path) -> None:
    result = invoke("plan", "--target", "smddp", "--manifest", str(manifest),
                    stage_dirs=str(tmp_path / "nowhere"), tmp=tmp_path)
    assert result.returncode == 1
    assert "nowhere is not a directory" in result.stderr
    assert "Traceback" not in result.stderr

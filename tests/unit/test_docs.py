"""The docs as a new user reads them: generated pages current, the worked example correct,
every command's task and flags real, the offline ones run."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest

from imageforge.model.manifest import load
from imageforge.model.reference import page
from imageforge.planning.plan import make_plan
from imageforge.sources.sources import GitSource
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)


def blocks(path: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if lang == language]


def commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in [*DOCS, ROOT / "README.md"]:
        for body in blocks(path, "sh"):
            for text in body.splitlines():
                line = text.split("  #", 1)[0].strip()
                if line.startswith(".venv/bin/invoke "):
                    found.append((path.name, shlex.split(line)[1:]))
    return found


def test_manifest_page_is_current() -> None:
    assert (ROOT / "docs/manifest.md").read_text() == page(STAGES), "run `invoke docs`"


def test_the_gdrcopy_example_is_a_working_stage(tmp_path: Path) -> None:
    (code,) = blocks(ROOT / "docs/adding-a-stage.md", "python")
    module = types.ModuleType("gdrcopy_example")
    exec(compile(code, "docs/adding-a-stage.md", "exec"), module.__dict__)
    registry = {**STAGES, "gdrcopy": module.STAGE}
    manifest = tmp_path / "m.toml"
    manifest.write_text('[image]\nbase = "nvidia/cuda:12.4.1-devel-ubuntu22.04"\n'
                        'cuda_arch = ["9.0"]\npython = "3.11"\n'
                        '[stages.gdrcopy]\nversion = "2.4.1"\n')
    planned = make_plan(load(manifest, registry=registry), "gdrcopy", registry)
    stage = planned.stage("gdrcopy")
    assert stage.deps == ("base",)
    assert "make -j\"$(nproc)\" prefix=/opt/gdrcopy" in stage.recipe
    source = stage.sources[0]
    assert isinstance(source, GitSource)
    assert source.ref == "v2.4.1"
    changed = make_plan(load(manifest, ("stages.gdrcopy.version=2.4.2",), registry=registry),
                        "gdrcopy", registry)
    assert changed.stage("gdrcopy").key != stage.key
    assert changed.stage("base").key == planned.stage("base").key


@pytest.mark.parametrize(("page_name", "argv"), commands(), ids=lambda v: str(v)[:60])
def test_documented_command_uses_real_tasks_and_flags(page_name: str, argv: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    task = argv[0]
    help_text = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), task, "--help"],
                               cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    assert help_text.returncode == 0, f"{page_name}: no task {task!r}"
    for flag in (a.split("=", 1)[0] for a in argv[1:] if a.startswith("--")):
        assert flag in help_text.stdout, f"{page_name}: `invoke {task}` has no {flag}"


@pytest.mark.parametrize("argv", [argv for _, argv in commands()
                                  if argv[0] in ("plan", "render", "check") and
                                  "gdrcopy" not in argv and not any("<" in a for a in argv)],
                         ids=lambda v: " ".join(v)[:60])
def test_offline_documented_commands_run(argv: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path)}
    argv = [a.replace("docs/dag.svg", str(tmp_path / "dag.svg")) for a in argv]
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *argv], cwd=ROOT,
                            capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr


def test_every_doc_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in DOCS if f"docs/{p.name}" not in readme]
    assert not missing, missing

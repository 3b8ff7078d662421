"""Compatibility rules are hooks of the stages they constrain (`Stage.rules`): the engine's rule
machinery (imageforge/model/compat.py, imageforge/planning/rules.py) names no stage, the
rules run in registry order, and a team's stage module declares a rule that `invoke check`
reports like imageforge's own (the example of docs/adding-a-stage.md)."""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.errors import CompatibilityError
from imageforge.model import compat
from imageforge.model.manifest import load
from stages import STAGES, discover

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
ENGINE = ("imageforge/model/compat.py", "imageforge/planning/rules.py")
NAMED = re.compile(r"(?<![\w-])stages\.(" + "|".join(map(re.escape, STAGES)) + r")(?![\w-])")


def stage_literals(source: str) -> list[str]:
    """The string literals of `source` that name a stage (a stage name, or stages.<name> in
    a longer text), outside docstrings and keys of `[image]` (image.base, image.python)."""
    tree = ast.parse(source)
    ignored: set[int] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and node.body and isinstance(node.body[0], ast.Expr)):
            ignored.add(id(node.body[0].value))
        if isinstance(node, ast.Subscript) and _is_image(node.value):
            ignored.add(id(node.slice))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and _is_image(node.func.value) and node.args):
            ignored.add(id(node.args[0]))
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in ignored
            and (node.value in STAGES or NAMED.search(node.value))]


def _is_image(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "image"


def test_the_rule_machinery_names_no_stage() -> None:
    found = {path: stage_literals((ROOT / path).read_text()) for path in ENGINE}
    assert found == {path: [] for path in ENGINE}


def test_the_stage_name_check_finds_what_it_looks_for() -> None:
    source = ('"""The efa stage."""\n'
              'def rule(manifest, version):\n'
              '    efa = manifest.stages.get("efa")\n'
              '    base = manifest.image["base"], manifest.image.get("python")\n'
              '    return f"stages.aws-ofi-nccl.configure_flags has {version}", "image.cuda"\n'
              'def nccl_pin_rule(manifest):\n'
              '    return manifest.stages["nccl"]\n')
    flags = "stages.aws-ofi-nccl.configure_flags has "
    assert sorted(stage_literals(source)) == ["efa", "nccl", flags]


def test_rules_run_in_registry_order_and_each_stage_reads_its_own_data_file() -> None:
    # The order of the violations in every report.
    assert [rule.id for rule in compat.rules(STAGES)] == [
        "base-cuda", "cuda-arch", "ptx-arch", "plugin-libfabric", "plugin-platform-aws",
        "plugin-disable-tests", "plugin-nccl", "efa-bundled-plugin", "plugin-from-efa",
        "torchvision-pytorch", "torch-wheel-companions", "smddp-wheel", "smddp-python",
        "smddp-pytorch", "smddp-cuda", "smddp-no-pytorch-2-6"]
    files = {name: getattr(compat.data_of(STAGES, name), "name", None)
             for name, stage in STAGES.items() if stage.rules}
    assert [rule.id for rule in compat.pin_rules(STAGES)] == ["nccl-pytorch-pin"]
    assert files == {"base": "base_rules.toml", "efa": "efa_rules.toml", "nccl": "nccl_rules.toml",
                     "aws-ofi-nccl": "aws_ofi_nccl_rules.toml",
                     "torchvision": "torchvision_rules.toml", "smddp": "smddp_rules.toml"}


def test_a_rule_that_reads_another_stages_facts_judges_nothing_without_them() -> None:
    # aws-ofi-nccl's rules read what each EFA installer bundles from the efa stage's data.
    loaded = load(ROOT / "manifests/pt25-cu124.toml", ["stages.efa.version=1.38.0"],
                  registry=STAGES)
    assert [v.rule for v in compat.check(loaded, registry=STAGES)] == ["efa-bundled-plugin"]
    bare = {**STAGES, "efa": dataclasses.replace(STAGES["efa"], rules=())}
    assert compat.data_of(bare, "efa") is None
    assert compat.check(loaded, registry=bare) == []
    older = load(ROOT / "manifests/pt25-cu124.toml", ["stages.efa.version=1.22.0"],
                 registry=STAGES)
    assert [v.rule for v in compat.check(older, registry=STAGES)] == ["plugin-platform-aws"]
    assert compat.check(older, registry=bare) == []


def team_stages(tmp_path: Path) -> Path:
    """docs/adding-a-stage.md's GDRCopy module with its rule, in a team stage directory."""
    blocks = FENCE.findall((ROOT / "docs/adding-a-stage.md").read_text())
    (module,) = [body for lang, body in blocks if lang == "python"]
    (rule,) = [body for lang, body in blocks if lang == "py"]
    (data,) = [body for lang, body in blocks if lang == "toml" and "[rules." in body]
    assert "\nSTAGE = Stage(" in module
    assert "    checks=checks,\n)" in module
    module = module.replace("\nSTAGE = Stage(", f"\n{rule}\n\nSTAGE = Stage(", 1)
    module = module.replace("    checks=checks,\n)", "    checks=checks,\n    rules=RULES,\n)")
    team = tmp_path / "team-stages"
    team.mkdir()
    (team / "gdrcopy.py").write_text(module)
    (team / "gdrcopy_rules.toml").write_text(data)
    return team


def team_manifest(tmp_path: Path, cuda: str) -> Path:
    path = tmp_path / "team.toml"
    path.write_text(f'[image]\nbase = "ubuntu:22.04"\ncuda = "{cuda}"\ncuda_arch = ["3.5"]\n'
                    'python = "3.11"\n\n[stages.gdrcopy]\nversion = "2.4.1"\n')
    return path


def test_a_team_stage_declares_a_rule_that_check_reports(tmp_path: Path) -> None:
    registry = discover([team_stages(tmp_path)])
    settings = Workspace(registry=registry, manifest=team_manifest(tmp_path, "5.5"),
                                cache_dir=tmp_path / "cache")

    with pytest.raises(CompatibilityError) as refused:
        project.check(settings)

    report = str(refused.value).splitlines()
    assert report[1:4] == [
        "  [gdrcopy-cuda] image.cuda: GDRCopy needs CUDA 6.0 or newer, but the image's CUDA "
        "is 5.5.",
        "      fix: use a CUDA 6.0 or newer base image, or drop [stages.gdrcopy].",
        "      source: https://github.com/NVIDIA/gdrcopy#requirements (the library and tests "
        "require CUDA >= 6.0)"]
    assert "gdrcopy-cuda" in compat.rule_ids(registry=registry)
    waived = dataclasses.replace(settings, overrides=("waive.gdrcopy-cuda=an old toolkit",))
    assert any(line.startswith("waived [gdrcopy-cuda] image.cuda: ")
               for line in project.check(waived))
    newer = dataclasses.replace(settings, manifest=team_manifest(tmp_path, "6.0"))
    assert not any("gdrcopy-cuda" in line for line in project.check(newer))


def test_invoke_check_refuses_a_team_rules_violation_with_exit_3(tmp_path: Path) -> None:
    team = team_stages(tmp_path)
    env = {**os.environ, "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path / "cache"),
           "INVOKE_IMAGEFORGE_STAGE_DIRS": str(team)}
    result = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "check", "--manifest",
         str(team_manifest(tmp_path, "5.5"))],
        cwd=tmp_path, capture_output=True, text=True, env=env, check=False, timeout=120)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "[gdrcopy-cuda] image.cuda: GDRCopy needs CUDA 6.0 or newer" in result.stderr

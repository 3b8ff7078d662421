"""Stage keys: one pin changes its stage and the stages that depend on it, nothing else."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.model.dag import closure
from imageforge.model.manifest import IMAGE_FIELDS, load
from imageforge.model.stage import Field
from imageforge.planning.plan import make_plan
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
SMDDP = ROOT / "manifests/smddp.toml"
EFA_NCCL = ROOT / "manifests/efa-nccl.toml"

CHANGED: dict[str, str] = {
    "version": "9.9.9",
    "url": "https://mirror.example/file-{version}.tar.gz",
    "repo": "https://mirror.example/repo.git",
    "ref": "release-9",
    "sha256": "f" * 64,
    "commit": "e" * 40,
    "digest": "sha256:" + "d" * 64,
    "path": "/opt/changed",
    "image": "example/base:9",
    "arch": "6.1",
    "text": "-O3",
    "name": "changed",
    "specifier": ">=9,<10",
    "fingerprint": "ABCD " * 10,
    "entry_point": "other_framework.training:main",
    "file_name": "other.py",
    "cuda": "12.9",
    "python": "3.12",
}


def changed_value(field: Field, current: Any) -> str:
    """An override string giving `key` a different valid value."""
    if field.choices:
        return next(c for c in field.choices if c != current)
    if field.kind == "bool":
        return "false" if current else "true"
    if field.kind in ("int", "jobs"):
        return str((current or 0) + 3)
    if field.kind in ("arch_list", "packages", "flags", "args", "names"):
        sample = {"arch_list": "6.1", "packages": "extra-pkg", "flags": "--extra",
                  "args": "extra=1", "names": "efa"}[field.kind]
        return json.dumps([*(current or []), sample])
    return CHANGED[field.kind]


def dependents(name: str, target: str) -> set[str]:
    return {n for n in closure(target, STAGES) if name in closure(n, STAGES)}


def keys(manifest: Path, target: str, overrides: tuple[str, ...] = ()) -> dict[str, str]:
    plan = make_plan(load(manifest, overrides, registry=STAGES), target, STAGES)
    return {s.name: s.key for s in plan.stages}


def stage_pins(*, keyed: bool = True) -> list[tuple[Path, str, str, str]]:
    cases = []
    for manifest, target in ((SMDDP, "smddp"), (EFA_NCCL, "efa-nccl")):
        for name in closure(target, STAGES):
            for key, field in STAGES[name].fields.items():
                # python.version must equal image.python: the image.python case covers it.
                if (name, key) == ("python", "version") or field.keyed != keyed:
                    continue
                cases.append((manifest, target, name, key))
    return cases


@pytest.mark.parametrize(("manifest", "target", "stage", "key"), stage_pins(),
                         ids=lambda v: v.name if isinstance(v, Path) else str(v))
def test_a_pin_changes_its_stage_and_dependents_only(manifest: Path, target: str, stage: str,
                                                     key: str) -> None:
    field = STAGES[stage].fields[key]
    loaded = load(manifest, registry=STAGES)
    current = loaded.stages.get(stage, {}).get(key, field.default)
    before = keys(manifest, target)
    after = keys(manifest, target, (f"stages.{stage}.{key}={changed_value(field, current)}",
                                     *new_pins(manifest, stage, key)))
    moved = {n for n in before if before[n] != after[n]}
    assert moved == dependents(stage, target)


def new_pins(manifest: Path, stage: str, key: str) -> list[str]:
    """A new version moves a file the manifest pins by sha256 (or a ref it pins by commit):
    the --set must give the new pin too (tests/unit/test_pinned_moves.py)."""
    table = tomllib.loads(manifest.read_text()).get("stages", {}).get(stage, {})
    if key != "version":
        return []
    return [f"stages.{stage}.{field.locates}={CHANGED[STAGES[stage].fields[field.locates].kind]}"
            for name, field in STAGES[stage].fields.items()
            if field.locates and field.locates in table
            and "{version" in str(table.get(name, field.default))]


@pytest.mark.parametrize(("manifest", "target", "stage", "key"), stage_pins(keyed=False),
                         ids=lambda v: v.name if isinstance(v, Path) else str(v))
def test_resolution_and_verification_keys_change_no_key(manifest: Path, target: str, stage: str,
                                                        key: str) -> None:
    field = STAGES[stage].fields[key]
    current = load(manifest, registry=STAGES).stages.get(stage, {}).get(key, field.default)
    override = f"stages.{stage}.{key}={changed_value(field, current)}"
    assert keys(manifest, target, (override,)) == keys(manifest, target)


@pytest.mark.parametrize("key", ["base", "base_digest", "platform", "cuda_arch", "cuda_home",
                                 "python"])
def test_an_image_pin_changes_exactly_the_stages_that_use_it(key: str) -> None:
    loaded = load(SMDDP, registry=STAGES)
    value = changed_value(IMAGE_FIELDS[key], loaded.image[key])
    before = keys(SMDDP, "smddp")
    extra = (f"stages.python.version={value}",) if key == "python" else ()
    after = keys(SMDDP, "smddp", (f"image.{key}={value}", *extra))
    moved = {n for n in before if before[n] != after[n]}
    if key in ("base", "base_digest", "platform"):
        assert moved == set(before)
    elif key == "python":
        assert moved == dependents("python", "smddp")
    elif key == "cuda_arch":
        assert moved == {"nccl", "aws-ofi-nccl", "pytorch", "torchvision", "smddp"}
    else:
        expected: set[str] = set()
        for user in ("nccl", "aws-ofi-nccl", "pytorch"):
            expected |= dependents(user, "smddp")
        assert moved == expected


def test_keys_are_identical_from_another_directory_and_process(tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere" / "m.toml"
    copy.parent.mkdir()
    shutil.copy(SMDDP, copy)
    script = (
        "import json, sys; from pathlib import Path; from imageforge.app import project; "
        "from imageforge.app.workspace import Workspace; from stages import STAGES; "
        "p = project.plan(Workspace(registry=STAGES, manifest=Path(sys.argv[1])), "
        "'smddp'); "
        "print(json.dumps({s.name: s.key for s in p.stages}))"
    )
    out = subprocess.run([sys.executable, "-c", script, str(copy)], cwd=tmp_path,
                         env={"PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "123"},
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == keys(SMDDP, "smddp")


def test_recipe_text_is_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    before = keys(SMDDP, "smddp")
    boost = STAGES["boost"]
    original = boost.recipe
    monkeypatch.setitem(STAGES, "boost", dataclasses.replace(
        boost, recipe=lambda ctx: original(ctx) + "\nRUN true"))
    after = keys(SMDDP, "smddp")
    assert {n for n in before if before[n] != after[n]} == {"boost", "smddp"}


def test_key_is_sha256_of_canonical_document() -> None:
    plan = project.plan(Workspace(registry=STAGES, manifest=SMDDP), "boost")
    for stage in plan.stages:
        assert stage.key.startswith("sha256:")
        assert len(stage.key) == 71

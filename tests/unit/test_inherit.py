"""`inherit = "<manifest>"`: a manifest that takes another's tables and overrides only what
differs. Keys and the lock depend on the effective values alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.errors import ManifestError
from imageforge.model.manifest import load, show
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
PARENT = ROOT / "manifests/smddp.toml"
CHILD = f'''inherit = "{PARENT}"

[image]
name = "smddp-sm86"
cuda_arch = ["7.0", "8.0", "8.6"]

[stages.nccl]
version = "2.10.3"
prefix = "/opt/nccl"
'''


def keys(path: Path) -> dict[str, str]:
    planned = project.plan(Workspace(registry=STAGES,
                                            manifest=path, cache_dir=path.parent / "cache"),
                           "smddp")
    return {s.name: s.key for s in planned.stages}


def test_inherited_and_copied_manifests_have_the_same_keys_and_digest(tmp_path: Path) -> None:
    child = tmp_path / "child.toml"
    child.write_text(CHILD)
    # `invoke show` prints the effective manifest as TOML: a full copy of it.
    copy = tmp_path / "copy.toml"
    copy.write_text(show(child, registry=STAGES))
    assert load(child, registry=STAGES).digest() == load(copy, registry=STAGES).digest()
    assert keys(child) == keys(copy)
    merged = load(child, registry=STAGES)
    assert merged.image["cuda_arch"] == ["7.0", "8.0", "8.6"]
    assert merged.stages["nccl"]["prefix"] == "/opt/nccl"
    # What the child does not set is the parent's, the parent's keys left as they are.
    assert merged.stages["nccl"]["ref"] == "v2.10.3-1"
    assert merged.stages["pytorch"]["version"] == load(PARENT, registry=STAGES).stages[
        "pytorch"]["version"]


def test_a_chain_and_set_apply_nearest_first(tmp_path: Path) -> None:
    (tmp_path / "child.toml").write_text(CHILD)
    grandchild = tmp_path / "grandchild.toml"
    grandchild.write_text('inherit = "child.toml"\n\n[stages.nccl]\nprefix = "/opt/n2"\n')
    merged = load(grandchild, ("stages.efa.version=1.15.1",), registry=STAGES)
    assert merged.stages["nccl"]["prefix"] == "/opt/n2"
    assert merged.stages["nccl"]["version"] == "2.10.3"
    assert merged.stages["efa"]["version"] == "1.15.1"
    text = show(grandchild, ("stages.efa.version=1.15.1",), registry=STAGES)
    assert f"{grandchild}:4" in text.split('prefix = "/opt/n2"')[1].splitlines()[0]
    assert "--set stages.efa.version=1.15.1" in text
    assert f"{tmp_path / 'child.toml'}:" in text
    assert f"{PARENT}:" in text


def test_a_loop_and_a_missing_parent_are_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text('inherit = "b.toml"\n')
    (tmp_path / "b.toml").write_text('inherit = "a.toml"\n')
    with pytest.raises(ManifestError, match=r"makes a loop .*a\.toml -> .*b\.toml -> .*a\.toml"):
        load(tmp_path / "a.toml", registry=STAGES)
    (tmp_path / "c.toml").write_text('inherit = "gone.toml"\n')
    with pytest.raises(ManifestError, match=r"c\.toml: inherit = 'gone\.toml': no such manifest"):
        load(tmp_path / "c.toml", registry=STAGES)


def test_a_bad_key_in_the_parent_names_the_parents_file_and_line(tmp_path: Path) -> None:
    parent = tmp_path / "parent.toml"
    parent.write_text(PARENT.read_text().replace('[stages.efa]\n', '[stages.efa]\nflavour = 1\n'))
    child = tmp_path / "child.toml"
    child.write_text('inherit = "parent.toml"\n\n[image]\nname = "x"\n')
    with pytest.raises(ManifestError) as caught:
        load(child, registry=STAGES)
    line = parent.read_text().splitlines().index("flavour = 1") + 1
    assert f"{parent}: stages.efa.flavour (line {line}) (inherited by {child})" in str(
        caught.value)


def test_invoke_show_and_check_through_the_cli(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text('inherit = "a.toml"\n')
    env = {**os.environ, "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path / "cache")}
    looped = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "check",
                             "--manifest", str(tmp_path / "a.toml")], capture_output=True,
                            text=True, env=env, check=False)
    assert looped.returncode == 2
    assert "makes a loop" in looped.stderr
    assert "Traceback" not in looped.stderr
    child = tmp_path / "child.toml"
    child.write_text(CHILD)
    shown = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "show",
                            "--manifest", str(child)], capture_output=True, text=True,
                           env=env, check=False)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"# effective manifest: {child} -> {PARENT}")

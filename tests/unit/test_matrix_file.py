"""The matrix file: [[image]] tables, axes expanded to one image per combination, tags filled
from them, and every mistake one sentence naming the file and the image."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from imageforge.errors import ManifestError
from imageforge.model.matrix import MAX_IMAGES, Entry, Planned, load, summary

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    """The matrix file, beside copies of the manifests it may name."""
    path = tmp_path / "images.toml"
    path.write_text(text)
    (tmp_path / "manifests").mkdir(exist_ok=True)
    for name in ("efa-nccl.toml", "smddp.toml", "torch211-nccl-wheel.toml"):
        (tmp_path / "manifests" / name).write_text((ROOT / "manifests" / name).read_text())
    (tmp_path / "m.toml").write_text((ROOT / "manifests" / "efa-nccl.toml").read_text())
    return path


def test_axes_expand_to_every_combination_with_their_tags(tmp_path: Path) -> None:
    path = write(tmp_path, '''
[[image]]
manifest = "manifests/efa-nccl.toml"

[[image]]
manifest = "manifests/smddp.toml"
target = "smddp"
tag = "registry.example.com/smddp:efa{stages.efa.version}-py{image.python}"
set = ["stages.pytorch.max_jobs=8"]
[image.matrix]
"stages.efa.version" = ["1.14.1", "1.15.1"]
"image.python" = ["3.8", "3.9"]
''')
    entries = load(path)
    assert entries[0] == Entry(manifest=tmp_path / "manifests/efa-nccl.toml", target=None,
                               tag=None, overrides=(), where=f"{path}: image 1")
    assert entries[1].axes == ("stages.efa.version", "image.python")
    assert [e.tag for e in entries[1:]] == [
        "registry.example.com/smddp:efa1.14.1-py3.8", "registry.example.com/smddp:efa1.14.1-py3.9",
        "registry.example.com/smddp:efa1.15.1-py3.8", "registry.example.com/smddp:efa1.15.1-py3.9"]
    assert entries[4].overrides == ("stages.pytorch.max_jobs=8", "stages.efa.version=1.15.1",
                                    "image.python=3.9")


@pytest.mark.parametrize(("text", "says"), [
    ("", "a matrix is a list of [[image]] tables"),
    ('[[image]]\ntarget = "smddp"\n', "image 1: manifest = \"<path>\" is required"),
    ('[[image]]\nmanifest = "m.toml"\nflavour = 1\n', "image 1: unknown key 'flavour'"),
    ('[[image]]\nmanifest = "m.toml"\nset = ["nokey"]\n', 'list of "KEY=VALUE" strings'),
    ('[[image]]\nmanifest = "m.toml"\n[image.matrix]\n"stages.efa.version" = []\n',
     "non-empty lists of strings"),
    ('[[image]]\nmanifest = "m.toml"\ntag = "x:{stages.nccl.version}"\n',
     "names {stages.nccl.version}, which is not one of its matrix axes"),
    ('[[image]\n', "invalid TOML"),
    ('[[image]]\nmanifest = "m.toml"\ntag = "Bad Tag!!"\n',
     "image 1: tag 'Bad Tag!!' is not an image reference"),
    ('[[image]]\nmanifest = "nope.toml"\n',
     "image 1: manifest = 'nope.toml': no such file (paths are relative to"),
    # Ten axes of ten values: refused before a single combination is made.
    ('[[image]]\nmanifest = "m.toml"\n[image.matrix]\n' + "".join(
        f'"stages.x{i}.version" = [{", ".join(f"{chr(34)}{v}{chr(34)}" for v in range(10))}]\n'
        for i in range(10)), "image 1: [image.matrix] expands the file past 256 images"),
    # The limit counts the whole file: 256 plain images, then one more.
    ('[[image]]\nmanifest = "m.toml"\n' * 257, "image 257: [image.matrix] expands the file"),
])
def test_a_bad_matrix_is_one_sentence_naming_file_and_image(tmp_path: Path, text: str,
                                                            says: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ManifestError) as caught:
        load(path)
    assert says in str(caught.value)
    assert str(path) in str(caught.value)


def test_a_file_of_exactly_the_limit_loads(tmp_path: Path) -> None:
    """The limit refuses only what lies beyond it: two axes of 16 values make 256 images."""
    axis = ", ".join(f'"{v}"' for v in range(16))
    path = write(tmp_path, f'[[image]]\nmanifest = "m.toml"\n[image.matrix]\n'
                 f'"stages.efa.version" = [{axis}]\n"image.python" = [{axis}]\n')
    assert len(load(path)) == MAX_IMAGES == 256


def test_the_label_escapes_what_the_file_says(tmp_path: Path) -> None:
    """A matrix entry's output line shows its values escaped: a newline in a set value cannot
    forge a second line, an escape sequence cannot reach the terminal."""
    path = write(tmp_path, '[[image]]\nmanifest = "m.toml"\ntarget = "efa\\u001b[2J"\n'
                 'set = ["stages.efa.version=1\\nPASS all"]\n')
    label = load(path)[0].label
    assert "\n" not in label
    assert "\x1b" not in label
    assert label == f"{tmp_path / 'm.toml'} efa\\x1b[2J --set stages.efa.version=1\\nPASS all"


def test_the_summary_counts_each_shared_key_once() -> None:
    def planned(target: str, keys: dict[str, str], statuses: dict[str, str]) -> Planned:
        return Planned(entry=Entry(manifest=Path("m.toml"), target=target, tag=None,
                                   overrides=()),
                       target=target, keys=keys, statuses=statuses)

    plans = [planned("efa-nccl", {"base": "k0", "efa": "k1", "nccl": "k2", "efa-nccl": "k3"},
                     {"base": "cached", "efa": "build", "nccl": "build", "efa-nccl": "build"}),
             planned("smddp", {"base": "k0", "efa": "k1", "nccl": "k2", "smddp": "k4"},
                     {"base": "cached", "efa": "build", "nccl": "build", "smddp": "build"})]
    found = summary(plans)
    assert found["stage_slots"] == 8
    assert found["distinct_keys"] == 5
    assert found["keys_to_build"] == 4
    assert found["images"][1]["builds"] == ["smddp"]
    assert found["images"][1]["shared"] == ["base", "efa", "nccl"]


@pytest.mark.parametrize(("text", "says", "code"), [
    # An axis is blamed as an axis, a set entry as one: nobody passed --set.
    ('[[image]]\nmanifest = "manifests/efa-nccl.toml"\n[image.matrix]\n'
     '"stages.efa.versio" = ["1.36.0"]\n',
     "image 1: [image.matrix] axis stages.efa.versio=1.36.0: unknown key; did you mean "
     "'version'?", 2),
    ('[[image]]\nmanifest = "manifests/efa-nccl.toml"\nset = ["stages.efa.versio=1"]\n',
     "image 1: set entry stages.efa.versio=1: unknown key", 2),
    ('[[image]]\nmanifest = "manifests/efa-nccl.toml"\n\n[[image]]\n'
     'manifest = "manifests/efa-nccl.toml"\ntarget = "nope"\n',
     "image 2: target nope: unknown stage; targets are: base", 2),
    ('[[image]]\nmanifest = "manifests/torch211-nccl-wheel.toml"\n',
     "torch211-nccl-wheel.toml defines 2 images (efa-nccl, training); add target = \"...\" "
     "to this image.", 2),
])
def test_planning_errors_name_the_matrix_entry_not_flags(tmp_path: Path, text: str, says: str,
                                                         code: int) -> None:
    path = write(tmp_path, text)
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "matrix.plan",
                             "--file", str(path)], cwd=tmp_path, capture_output=True, text=True,
                            check=False)
    assert result.returncode == code, result.stderr
    # The last line is the error (planning the images before it may note a missing lock).
    error = result.stderr.splitlines()[-1]
    assert error.startswith(f"imageforge: error: {path}: image ")
    assert says in error
    assert "Traceback" not in result.stderr
    assert "--set" not in result.stderr
    assert "pass --target" not in result.stderr

"""What a builder makes must reach the image: PyTorch's runtime requirements and the image
codecs torchvision's extension links (defects the seed's single image hid, read from the
recipes: `setup.py install --root` exports only the package itself)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.model.stage import Context
from stages import STAGES, pytorch, torchvision

ROOT = Path(__file__).resolve().parents[2]
SMDDP = ROOT / "manifests/smddp.toml"
SAMPLE = ROOT / "manifests/sample.toml"


def stage_recipe(manifest: Path, name: str, *sets: str) -> str:
    planned = project.plan(Workspace(registry=STAGES,
                                            manifest=manifest, overrides=sets), "smddp")
    return next(s.recipe for s in planned.stages if s.name == name)


@pytest.mark.parametrize(("version", "wanted"), [
    ("1.10.2", ["typing-extensions"]),
    ("2.0.1", ["filelock", "typing-extensions", "sympy", "networkx", "jinja2"]),
    ("2.5.1", ["filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec"]),
])
def test_torch_runtime_requirements_follow_its_release(version: str, wanted: list[str]) -> None:
    ctx = Context(image={}, stages={"pytorch": {"version": version}})
    assert pytorch.runtime_requirements(ctx) == wanted
    assert list(pytorch.STAGE.pip_requirements(ctx)) == wanted


def test_torch_runtime_requirements_are_installed_into_the_exported_tree() -> None:
    recipe = stage_recipe(SAMPLE, "pytorch")
    install = next(line for line in recipe.splitlines() if "pip install" in line)
    # Into /out (what the image copies), even where the builder already has them, and
    # from the lock's exact versions and hashes.
    assert "--prefix=/out/opt/conda --ignore-installed" in install
    assert "--require-hashes" in install
    assert "typing-extensions==" in recipe
    assert "--hash=sha256:" in recipe
    assert recipe.index("setup.py install") < recipe.index("pip install")
    override = stage_recipe(SAMPLE, "pytorch", 'stages.pytorch.runtime_requirements=["six"]')
    assert "six\n" in override
    assert "typing-extensions" not in override


def test_torchvision_builder_has_the_codec_headers() -> None:
    recipe = stage_recipe(SMDDP, "torchvision")
    assert "libjpeg-dev libpng-dev" in recipe
    assert recipe.index("libpng-dev") < recipe.index("setup.py install")


def test_the_codecs_an_extension_loads_are_exported_as_files(tmp_path: Path) -> None:
    # A real shared object linking the system's libpng and libjpeg, where torchvision puts
    # its image extension; the rendered step copies what ldd says it loads.
    out = tmp_path / "out"
    package = out / "opt/conda/lib/python3.11/site-packages/torchvision"
    package.mkdir(parents=True)
    source = tmp_path / "image.c"
    source.write_text("#include <png.h>\n#include <stdio.h>\n#include <jpeglib.h>\n"
                      "const char *v(void) { struct jpeg_error_mgr e; jpeg_std_error(&e);"
                      " return png_get_libpng_ver(0); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(package / "image.so"), str(source),
                    "-lpng16", "-ljpeg"], check=True)
    subprocess.run(["sh", "-c", torchvision.bundle_libraries(str(out))], check=True)
    ldd = subprocess.run(["ldd", str(package / "image.so")], capture_output=True, text=True,
                         check=True).stdout
    loaded = {line.split()[0]: line.split()[2] for line in ldd.splitlines() if "=>" in line}
    for name in ("libpng16.so.16", "libjpeg.so.62"):
        real = Path(os.path.realpath(loaded[name]))
        copied = out / os.path.relpath(real.parent, "/") / name
        assert copied.is_file(), sorted(out.rglob("*"))
        assert not copied.is_symlink(), sorted(out.rglob("*"))
        assert copied.read_bytes() == real.read_bytes()
    # Only the codecs: libc and the rest come from the image's own base.
    assert sorted(p.name for p in out.rglob("lib*.so*")) == ["libjpeg.so.62", "libpng16.so.16"]
    # Never under a /lib that is a symlink on merged-/usr systems.
    assert not (out / "lib").exists() or not Path("/lib").is_symlink()


def test_a_codec_that_cannot_be_copied_fails_the_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "c.c").write_text(
        "#include <png.h>\nconst char *f(void) { return png_get_libpng_ver(0); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out / "x.so"), str(tmp_path / "c.c"),
                    "-lpng16"], check=True)
    # out/usr is a file, so the library's directory cannot be made: the step must fail,
    # not leave an image without its codec.
    (out / "usr").write_text("")
    # LC_ALL=C: mkdir's message and its quotes follow the locale.
    result = subprocess.run(["sh", "-c", torchvision.bundle_libraries(str(out))],
                            capture_output=True, text=True, check=False,
                            env={**os.environ, "LC_ALL": "C"})
    # The step's own `|| exit 1`, with mkdir's one line naming the path it could not make.
    assert result.returncode == 1, result.stderr
    assert result.stderr == f"mkdir: cannot create directory '{out}/usr': Not a directory\n"
    # Nothing was copied: the tree holds only what the test put there.
    assert sorted(p.name for p in out.rglob("*")) == ["usr", "x.so"]

"""torchvision: built from source against the pytorch stage.

Seed 002 pins torchvision 0.9.1, which belongs to PyTorch 1.8; PyTorch 1.10.2 pairs with
torchvision 0.11.3 (https://github.com/pytorch/vision#installation), so our manifests pin that.
Its image extension (torchvision.io's PNG and JPEG codecs) is built only where setup.py finds
libpng and libjpeg: the builder installs their -dev packages (the seed had them from the
PyTorch step, which is another builder here), and the libraries the built extensions link are
exported beside them at the same paths, as torchvision's own wheels bundle them, so the image
loads them without a runtime package whose name differs between distributions.

# Parameters
version, repo, ref, commit: the git source (ref defaults to `v{version}`).
build_version: BUILD_VERSION passed to setup.py (seed style: "0.11.3+cu113").
apt_packages: build dependencies (libjpeg-dev, libpng-dev).

# Examples
```toml
[stages.torchvision]
version = "0.11.3"
build_version = "0.11.3+cu113"
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from imageforge.stageapi import (
    EXPORT_ROOT,
    Check,
    Context,
    Field,
    Inputs,
    Source,
    Stage,
    apt_install,
    bind,
    git_fields,
    git_source,
    run,
    sh,
    smoke,
)
from stages import pytorch_wheel
from stages.torchvision_rules import RULES


def sources(ctx: Context) -> Sequence[Source]:
    return [git_source("torchvision", ctx.of("torchvision"))]


# The system libraries of the image codecs, exported with the extensions that link them.
BUNDLED = r"/lib(jpeg|png)[^/]*$"


def bundle_libraries(root: str) -> str:
    """Copy the libjpeg/libpng files the extensions under `root` load into `root`, under the
    name the loader asks for (-L) and the real directory (/lib may be a symlink to /usr/lib,
    which a copied /lib directory would replace)."""
    copy = ('while read -r lib; do dir=' + sh(root) + '"$(readlink -f "$(dirname "$lib")")"; '
            'mkdir -p "$dir" && cp -L "$lib" "$dir/" || exit 1; done')
    return (f"find {sh(root)} -name '*.so' -exec ldd {{}} + | awk '$2 == \"=>\" "
            f"&& $3 ~ /^\\// {{print $3}}' | grep -E {sh(BUNDLED)} | sort -u | {copy}")


def recipe(ctx: Context) -> str:
    inputs = ctx.of("torchvision")
    build_version = str(inputs.get("build_version") or inputs["version"])
    steps = [apt_install(inputs["apt_packages"])] if ctx.image["apt"] else []
    steps.append(run(
        "cd /tmp/vision",
        sh("env", f"BUILD_VERSION={build_version}", "/opt/conda/bin/python", "setup.py",
           "install", f"--root={EXPORT_ROOT}"),
        bundle_libraries(EXPORT_ROOT),
        mounts=[bind("src-torchvision", "/tmp/vision", rw=True)],
    ))
    return "\n".join(steps)


def checks(ctx: Context) -> Sequence[Check]:
    version = str(ctx.of("torchvision")["version"])
    script = (f"import torchvision; v = torchvision.__version__; "
              f"assert v.startswith('{version}'), v; print(v)")
    where = ("import os, torchvision; print(os.path.dirname(torchvision.__file__))")
    extensions = (f"dir=$(/opt/conda/bin/python -c {sh(where)}) || exit 1\n"
                  + smoke.links('$(find "$dir" -name "*.so")'))
    return [Check(name=f"torchvision {version} imports",
                  script=sh("/opt/conda/bin/python", "-c", script)),
            Check(name="torchvision's native extensions link (image codecs included)",
                  script=extensions)]


def deps_for(tables: Mapping[str, Inputs]) -> tuple[str, ...]:
    """setup.py imports torch, which loads libnccl: a wheel torch's link to the nccl stage's
    library needs that stage here (a source-built torch brings it)."""
    return ("python", "pytorch", "nccl") if pytorch_wheel.chosen(tables) else ("python", "pytorch")


STAGE = Stage(
    name="torchvision",
    doc=__doc__ or "",
    deps=("python", "pytorch", "nccl"),
    deps_for=deps_for,
    parent="python",
    fields={
        **git_fields(repo="https://github.com/pytorch/vision.git", ref="v{version}",
                     what="torchvision"),
        "build_version": Field(kind="version", help="BUILD_VERSION (defaults to version)"),
        "apt_packages": Field(kind="packages", default=["libjpeg-dev", "libpng-dev"],
                              help="build dependencies installed with apt"),
    },
    sources=sources,
    recipe=recipe,
    checks=checks,
    rules=RULES,
)

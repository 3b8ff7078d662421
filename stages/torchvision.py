"""torchvision: built from source against the pytorch stage.

Seed 002 pins torchvision 0.9.1, which belongs to PyTorch 1.8; PyTorch 1.10.2 pairs with
torchvision 0.11.3 (https://github.com/pytorch/vision#installation), so our manifests pin that.

# Parameters
version, repo, ref, commit: the git source (ref defaults to `v{version}`).
build_version: BUILD_VERSION passed to setup.py (seed style: "0.11.3+cu113").

# Examples
```toml
[stages.torchvision]
version = "0.11.3"
build_version = "0.11.3+cu113"
```
"""

from __future__ import annotations

from collections.abc import Sequence

from imageforge.dockerfile import bind, run, sh
from imageforge.sources import Source
from imageforge.stage import EXPORT_ROOT, Check, Context, Field, Stage, git_fields, git_source


def sources(ctx: Context) -> Sequence[Source]:
    return [git_source("torchvision", ctx.of("torchvision"))]


def recipe(ctx: Context) -> str:
    inputs = ctx.of("torchvision")
    build_version = str(inputs.get("build_version") or inputs["version"])
    return run(
        "cd /tmp/vision",
        sh("env", f"BUILD_VERSION={build_version}", "/opt/conda/bin/python", "setup.py",
           "install", f"--root={EXPORT_ROOT}"),
        mounts=[bind("src-torchvision", "/tmp/vision", rw=True)],
    )


def checks(ctx: Context) -> Sequence[Check]:
    version = str(ctx.of("torchvision")["version"])
    script = (f"import torchvision; v = torchvision.__version__; "
              f"assert v.startswith('{version}'), v; print(v)")
    return [Check(name=f"torchvision {version} imports",
                  script=sh("/opt/conda/bin/python", "-c", script))]


STAGE = Stage(
    name="torchvision",
    doc=__doc__ or "",
    deps=("python", "pytorch"),
    parent="python",
    fields={
        **git_fields(repo="https://github.com/pytorch/vision.git", ref="v{version}",
                     what="torchvision"),
        "build_version": Field(kind="version", help="BUILD_VERSION (defaults to version)"),
    },
    sources=sources,
    recipe=recipe,
    checks=checks,
)

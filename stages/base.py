"""base: the manifest's base image plus the tools every stage uses to fetch and build.

# Parameters
apt_packages: Debian/Ubuntu packages installed when `[image] apt = true`
(seed 002: curl, wget, git).

# Examples
```toml
[stages.base]
apt_packages = ["curl", "wget", "git"]
```
"""

from __future__ import annotations

from collections.abc import Sequence

from imageforge.stageapi import Check, Context, Field, Stage, apt_install, sh, smoke
from stages.base_rules import RULES


def recipe(ctx: Context) -> str:
    if not ctx.image["apt"]:
        return ""
    return apt_install(ctx.of("base")["apt_packages"])


def checks(ctx: Context) -> Sequence[Check]:
    cuda = ctx.image.get("cuda")
    # Runtime bases have no compiler; a devel base's nvcc must be the CUDA the manifest says.
    nvcc = ("if ! command -v nvcc >/dev/null; then echo no-nvcc; else nvcc --version | "
            "sed -n 's/.*release \\([0-9.]*\\),.*/\\1/p'; fi")
    return [Check(name="nvcc is the manifest's CUDA (when the base has nvcc)",
                  script=smoke.reports_version("nvcc", nvcc, None) + (
                      f'\n[ "$found" = no-nvcc ] || [ "$found" = {sh(str(cuda))} ] || '
                      f'{{ echo "nvcc is $found, [image] cuda is {cuda}"; exit 1; }}'
                      if cuda else ""))]


STAGE = Stage(
    name="base",
    doc=__doc__ or "",
    deps=(),
    parent=None,
    fields={
        "apt_packages": Field(kind="packages", default=["curl", "wget", "git"],
                              help="packages every stage needs"),
    },
    recipe=recipe,
    exports=(),
    checks=checks,
    rules=RULES,
)

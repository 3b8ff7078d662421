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

from imageforge.dockerfile import apt_install
from imageforge.stage import Context, Field, Stage


def recipe(ctx: Context) -> str:
    if not ctx.image["apt"]:
        return ""
    return apt_install(ctx.of("base")["apt_packages"])


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
)

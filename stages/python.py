"""python: the Python every Python stage builds against, at /opt/conda.

Seed 002 installs Miniconda and `conda install python=3.8 ...`. Miniconda's "latest" installer
is not a pin, so the manifest names one installer file and its sha256. The `venv` provider
makes /opt/conda a virtual environment of the base image's own Python instead (for base images
that ship the right Python, and for air-gapped sample builds).

# Parameters
version: Python major.minor; must equal `[image] python`.
provider: "miniconda" (url + sha256 of a Miniconda installer) or "venv".
url, sha256: the Miniconda installer (provider = "miniconda").
packages: conda packages installed with Python (seed: conda-build pyyaml numpy ipython).

# Examples
```toml
[stages.python]
version = "3.8"
provider = "miniconda"
url = "https://repo.anaconda.com/miniconda/Miniconda3-py38_4.10.3-Linux-x86_64.sh"
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from imageforge.stageapi import Check, Context, Field, Source, Stage, bind, run, sh, url_source

PREFIX = "/opt/conda"


def sources(ctx: Context) -> Sequence[Source]:
    inputs = ctx.of("python")
    return [url_source("python", inputs)] if inputs["provider"] == "miniconda" else []


def recipe(ctx: Context) -> str:
    inputs = ctx.of("python")
    version = str(inputs["version"])
    check = sh(f"{PREFIX}/bin/python", "-c",
               f'import sys; v = "%d.%d" % sys.version_info[:2]; assert v == "{version}", v')
    if inputs["provider"] == "venv":
        return run(sh("python3", "-m", "venv", "--system-site-packages", PREFIX), check)
    installer = url_source("python", inputs).filename
    return run(
        sh("bash", f"/src/{installer}", "-b", "-p", PREFIX),
        sh(f"{PREFIX}/bin/conda", "install", "-y", f"python={version}", *inputs["packages"]),
        sh(f"{PREFIX}/bin/conda", "clean", "-ya"),
        check,
        mounts=[bind("src-python", "/src")],
    )


def env_paths(_ctx: Context) -> Mapping[str, Sequence[str]]:
    return {"PATH": [f"{PREFIX}/bin"]}


def checks(ctx: Context) -> Sequence[Check]:
    version = str(ctx.of("python")["version"])
    script = f'import sys; v = "%d.%d" % sys.version_info[:2]; assert v == "{version}", v'
    return [Check(name=f"python is {version}", script=sh(f"{PREFIX}/bin/python", "-c", script))]


STAGE = Stage(
    name="python",
    doc=__doc__ or "",
    deps=("base",),
    fields={
        "version": Field(kind="version", same_as="python",
                         help="Python major.minor (defaults to [image] python)"),
        "provider": Field(kind="name", default="miniconda", choices=("miniconda", "venv"),
                          help="how /opt/conda is made: miniconda or venv"),
        "url": Field(kind="url", locates="sha256",
                     help="Miniconda installer URL (provider = miniconda)"),
        "sha256": Field(kind="sha256", locked=True, help="sha256 of the installer (lock)"),
        "packages": Field(kind="packages", default=["conda-build", "pyyaml", "numpy", "ipython"],
                          help="conda packages installed with Python"),
    },
    sources=sources,
    recipe=recipe,
    exports=(PREFIX,),
    env_paths=env_paths,
    checks=checks,
)

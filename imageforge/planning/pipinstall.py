"""The Dockerfile steps that install a stage's locked pip set (imageforge.sources.piplock
resolves it at lock time): a requirements file with every sha256, installed with
--require-hashes, and the removal of stale dist-info where an image gathers several sets."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from imageforge.model.stage import Inputs
from imageforge.planning.dockerfile import (
    CA_BUNDLE_MOUNT,
    PIP_CACHE_MOUNT,
    REPRODUCIBLE_C,
    USE_CA_BUNDLE,
    run,
    sh,
)
from imageforge.sources.piplock import INPUT

# Where a stage's requirements file is written inside its build.
REQUIREMENTS_DIR = "/opt/imageforge/pip"


def requirements_text(packages: Sequence[Mapping[str, Any]]) -> str:
    """A requirements file pip reads with --require-hashes."""
    lines = []
    for package in packages:
        hashes = "".join(f" \\\n    --hash={h}" for h in package["hashes"])
        lines.append(f"{package['name']}=={package['version']}{hashes}\n")
    return "".join(lines)


def install(stage: str, inputs: Inputs, wanted: Sequence[str], pip: str, *options: str,
            then: Sequence[str] = ()) -> list[str]:
    """Dockerfile steps that pip install the stage's locked set with hash checking (and run
    `then` in the same step); a stage not locked yet installs `wanted` as written, which
    `invoke lock --check` and `build --locked` refuse."""
    locked = inputs.get(INPUT)
    path = f"{REQUIREMENTS_DIR}/{stage}.txt"
    text = requirements_text(locked) if locked else "".join(f"{r}\n" for r in wanted)
    checking = ["--require-hashes"] if locked else []
    return [
        f"COPY <<'EOF' {path}\n{text}EOF",
        run(USE_CA_BUNDLE, REPRODUCIBLE_C,
            sh(pip, "install", "--disable-pip-version-check", *checking, *options, "-r", path),
            *then, mounts=[CA_BUNDLE_MOUNT, PIP_CACHE_MOUNT]),
    ]


# Run in an image: the locked set's dist-info of any other version goes. A set installed with
# --prefix into /out and copied over a Python that already had some of its packages (the venv's
# pip and setuptools) leaves two dist-info directories per such package, and importlib.metadata
# (so `pip check`) may read the stale one. The files themselves are the locked version's.
_STALE = """\
import pathlib, re, shutil, sys
locked = dict(line.split("==") for line in sys.argv[2:])
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
for info in sorted(pathlib.Path(sys.argv[1]).glob("*.dist-info")):
    name, _, version = info.name[:-len(".dist-info")].partition("-")
    if locked.get(norm(name), version) != version:
        shutil.rmtree(info)
        print("removed stale", info.name)
"""


def drop_stale_dist_info(python: str, site: str, packages: Sequence[Mapping[str, Any]]) -> str:
    """A RUN line for an image stage: remove the dist-info of every version of a locked
    package other than the locked one from `site`."""
    pins = sorted({f"{_normalized(p['name'])}=={p['version']}" for p in packages})
    # A heredoc: a RUN line cannot carry the script's newlines.
    return f"RUN {sh(python, '-', site, *pins)} <<'EOF'\n{_STALE}EOF"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()

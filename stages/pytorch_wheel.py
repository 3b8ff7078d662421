"""pytorch with `provider = "wheel"`: PyTorch's own binary wheels, as teams install them today.

The wheel closure (torch, what `packages` adds such as torchvision, and every nvidia-* wheel
they require) is locked with sha256 hashes like any pip set (imageforge.sources.piplock),
resolved on `index` (PyPI, or a PyTorch-style per-variant index such as
https://download.pytorch.org/whl/cu130), and installed with --require-hashes.

Which libnccl torch loads is decided by the wheel, not by LD_LIBRARY_PATH: libtorch's DT_RPATH
and `torch/__init__.py`'s preload both name `site-packages/nvidia/nccl/lib/libnccl.so.2`
(pytorch #138460). So that one file becomes a symlink to the nccl stage's library, whether the
nccl stage built it from source or unpacked the NCCL wheel's own (`provider = "wheel"`,
stages/nccl_wheel.py): one libnccl on disk, the one the manifest chose, no LD_PRELOAD, and
nvidia-nccl-cuXX stays installed so `pip check` is clean. The checks read the library
`import torch` really mapped (/proc/self/maps, ncclGetVersion), because
`torch.cuda.nccl.version()` only reports the headers torch was compiled with.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from imageforge.stageapi import EXPORT_ROOT, Check, Context, pipinstall, piplock, sh

PREFIX = "/opt/conda"
PYTHON = f"{PREFIX}/bin/python"
PYPI = piplock.PYPI_SIMPLE
# Where the wheel keeps its NCCL, relative to site-packages (nvidia-nccl-cu12/cu13).
WHEEL_NCCL = "nvidia/nccl/lib/libnccl.so.2"
CUDA = re.compile(r"(\d+)\.(\d+)")


def chosen(tables: Mapping[str, Mapping[str, Any]]) -> bool:
    """True when the manifest's stage tables install torch from wheels."""
    return str(tables.get("pytorch", {}).get("provider", "source")) == "wheel"


def site_packages(ctx: Context) -> str:
    return f"{PREFIX}/lib/python{ctx.image['python']}/site-packages"


def variant(ctx: Context) -> str | None:
    """The wheel's CUDA variant, e.g. "cu130": the manifest's, else made from image.cuda."""
    given = ctx.of("pytorch").get("variant")
    if given:
        return str(given)
    found = CUDA.match(str(ctx.image.get("cuda") or ""))
    return f"cu{found[1]}{found[2]}" if found else None


def requirements(ctx: Context) -> list[str]:
    """What the closure is resolved from: exactly this torch, and its companions."""
    inputs = ctx.of("pytorch")
    return [f"torch=={inputs['version']}", *inputs["packages"]]


def nccl_provider(ctx: Context) -> str:
    """How the nccl stage made the library torch loads: "source" or "wheel"."""
    return str(ctx.of("nccl").get("provider") or "source")


def recipe(ctx: Context) -> str:
    site = f"{EXPORT_ROOT}{site_packages(ctx)}"
    lib = f"{ctx.of('nccl')['prefix']}/lib/libnccl.so.2"
    # The wheel's file replaced by a link, not shadowed: nothing else on disk to load.
    then = [sh("test", "-f", f"{site}/{WHEEL_NCCL}"),
            sh("ln", "-sfn", lib, f"{site}/{WHEEL_NCCL}")]
    # --ignore-installed: the venv sees the base's system packages, and what the base has
    # must still be installed into /out, or the image would depend on the base's copy.
    return "\n".join(pipinstall.install(
        "pytorch", ctx.of("pytorch"), requirements(ctx), f"{PREFIX}/bin/pip",
        f"--prefix={EXPORT_ROOT}{PREFIX}", "--ignore-installed", "--no-deps", then=then))


# The check is a file of its own: GPU hosts run the same code on their torch
# (scripts/torch_gpu_check.py).
LOADED = Path(__file__).with_name("nccl_loaded.py").read_text()


def loaded_nccl(ctx: Context) -> str:
    """The libnccl.so.2 `import torch` must load: the nccl stage's, however it was made."""
    return f"{ctx.of('nccl')['prefix']}/lib/libnccl.so.2"


def checks(ctx: Context) -> Sequence[Check]:
    version = str(ctx.of("nccl")["version"])
    expected = loaded_nccl(ctx)
    source = "nccl stage" if nccl_provider(ctx) == "source" else "NCCL wheel"
    torch = str(ctx.of("pytorch")["version"])
    return [
        Check(name=f"torch {torch} is installed from its wheel",
              script=sh(PYTHON, "-c", "import importlib.metadata as m, sys; "
                                      f"v = m.version('torch'); print('torch', v); "
                                      f"sys.exit(v.split('+')[0] != {torch!r})")),
        Check(name="pip check is clean", script=sh(PYTHON, "-m", "pip", "check")),
        Check(name=f"import torch maps one libnccl, the {source}'s, at NCCL {version}",
              script=sh(PYTHON, "-c", LOADED, version, expected, source)),
        Check(name="torch sees a GPU", needs="gpu",
              script=sh(PYTHON, "-c", "import torch; assert torch.cuda.is_available(), "
                                      "'torch.cuda.is_available() is False'; "
                                      "print(torch.cuda.get_device_name(0))")),
    ]

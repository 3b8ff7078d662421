"""pytorch: PyTorch built from source against the image's NCCL stage, or its wheels.

With `provider = "wheel"` PyTorch's own binary wheels are installed instead, the whole closure
locked by sha256, and the wheel's libnccl replaced by the nccl stage's (stages/pytorch_wheel.py);
the rest of this text is about the source build (`provider = "source"`, the default).

Seed 002 replaces `third_party/nccl/nccl` with its NCCL checkout; we build with
`USE_SYSTEM_NCCL=1` and point NCCL_ROOT / NCCL_INCLUDE_DIR / NCCL_LIB_DIR at the nccl stage,
which has the same effect and cannot silently fall back to the bundled copy. The CUDA arch
list is `[image] cuda_arch` plus `extra_cuda_arch`, with `+PTX` on `ptx_arch`.
Installed with `setup.py install --root=/out`, so only PyTorch's files are exported; that
installs none of PyTorch's runtime requirements (the seed's image had them from its conda
install), so the stage pip installs them, locked with hashes, into the exported tree too.

# Parameters
provider: "source" (default) or "wheel".
variant, index, packages (wheel): the CUDA variant (default from image.cuda, e.g. cu130), the
package index (PyPI, or a PyTorch-style per-variant index) and wheels installed with torch.
version, repo, ref, commit: the git source (ref defaults to `v{version}`).
submodules: fetch git submodules (the real repo needs them; the NCCL one is never used).
extra_cuda_arch: archs beyond [image] cuda_arch (seed: ["3.7", "5.0"]).
ptx_arch: arch that also gets PTX (seed: "7.0").
nvcc_flags: TORCH_NVCC_FLAGS (seed: "-Xfatbin -compress-all").
max_jobs: MAX_JOBS (compile parallelism; unset means PyTorch's default).
build_packages: packages installed before the build (seed: conda's list).
apt_packages: system build dependencies (seed: build-essential cmake ...).
runtime_requirements: pip requirements `import torch` needs (default: what the release's
setup.py declares in install_requires).

# Examples
```toml
[stages.pytorch]
version = "1.10.2"
extra_cuda_arch = ["3.7", "5.0"]
ptx_arch = "7.0"
```
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from imageforge.stageapi import (
    CCACHE_MOUNT,
    EXPORT_ROOT,
    USE_CCACHE,
    Check,
    Context,
    Field,
    Inputs,
    ManifestError,
    Source,
    Stage,
    apt_install,
    bind,
    git_fields,
    git_source,
    pipinstall,
    run,
    sh,
)
from stages import pytorch_wheel

PYTHON = "/opt/conda/bin/python"
PREFIX = "/opt/conda"
# install_requires of PyTorch's setup.py, by release (v1.10.2 ... v2.0.0 ... v2.1.0 onwards;
# the CUDA wheels and triton only concern PyPI's binary wheels, not a source build).
INSTALL_REQUIRES = (
    (Version("2.1"), ["filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec"]),
    (Version("2.0"), ["filelock", "typing-extensions", "sympy", "networkx", "jinja2"]),
    (Version("0"), ["typing-extensions"]),
)


def runtime_requirements(ctx: Context) -> list[str]:
    """What `import torch` needs beside PyTorch's own files (a branch: the newest list)."""
    inputs = ctx.of("pytorch")
    if inputs.get("runtime_requirements") is not None:
        return list(inputs["runtime_requirements"])
    try:
        release = Version(str(inputs["version"]))
    except InvalidVersion:
        return list(INSTALL_REQUIRES[0][1])
    return next(list(names) for floor, names in INSTALL_REQUIRES if release >= floor)


def arch_list(ctx: Context) -> str:
    """TORCH_CUDA_ARCH_LIST, e.g. "3.7 5.0 7.0+PTX 8.0" for the seed's settings."""
    inputs = ctx.of("pytorch")
    ptx = str(inputs.get("ptx_arch") or "").removesuffix("+PTX")
    # The lists may say "7.0+PTX" themselves (validation allows it): one entry per arch,
    # with PTX when either asks for it.
    with_ptx: dict[str, bool] = {}
    for arch in [*inputs["extra_cuda_arch"], *ctx.image["cuda_arch"]]:
        number = arch.removesuffix("+PTX")
        with_ptx[number] = with_ptx.get(number, False) or arch != number or number == ptx
    ordered = sorted(with_ptx, key=lambda a: tuple(int(x) for x in a.split(".")))
    return " ".join(f"{a}+PTX" if with_ptx[a] else a for a in ordered)


def from_wheel(ctx: Context) -> bool:
    return pytorch_wheel.chosen(ctx.stages)


# Keys that mean something for one provider only: given with the other, they are a mistake.
SOURCE_ONLY = ("repo", "ref", "commit", "submodules", "extra_cuda_arch", "ptx_arch",
               "nvcc_flags", "max_jobs", "build_packages", "apt_packages",
               "runtime_requirements")
WHEEL_ONLY = ("variant", "index", "packages")


def prepare(table: Mapping[str, Any], manifest: Path) -> Mapping[str, Any]:
    """Refuse a key the table's provider does not use, rather than ignore it."""
    provider = str(table.get("provider", "source"))
    other, wrong = ("source", SOURCE_ONLY) if provider == "wheel" else ("wheel", WHEEL_ONLY)
    for key in wrong:
        # The table arrives with every default filled in: a key counts when it differs.
        default = STAGE.fields[key].default
        if isinstance(default, str):
            default = default.replace("{version}", str(table.get("version")))
        if table.get(key) not in (None, default):
            raise ManifestError(f"{manifest}: stages.pytorch.{key} applies only to provider = "
                                f"\"{other}\", and this table has provider = \"{provider}\"; "
                                "remove the key or change the provider.")
    return table


def wheel_index(ctx: Context) -> tuple[str, str] | None:
    return (str(ctx.of("pytorch")["index"]), "torch") if from_wheel(ctx) else None


def pip_requirements(ctx: Context) -> list[str]:
    return pytorch_wheel.requirements(ctx) if from_wheel(ctx) else runtime_requirements(ctx)


def sources(ctx: Context) -> Sequence[Source]:
    inputs = ctx.of("pytorch")
    if from_wheel(ctx):
        return []
    return [git_source("pytorch", inputs, submodules=bool(inputs["submodules"]))]


def install_packages(ctx: Context, packages: Sequence[str]) -> str:
    if ctx.of("python")["provider"] == "miniconda":
        return run(sh("/opt/conda/bin/conda", "install", "-y", *packages),
                   "/opt/conda/bin/conda clean -ya")
    return run(sh(PYTHON, "-m", "pip", "install", "--no-cache-dir", *packages))


def recipe(ctx: Context) -> str:
    if from_wheel(ctx):
        return pytorch_wheel.recipe(ctx)
    inputs = ctx.of("pytorch")
    nccl = str(ctx.of("nccl")["prefix"])
    steps = [apt_install(inputs["apt_packages"])] if ctx.image["apt"] else []
    if inputs["build_packages"]:
        steps.append(install_packages(ctx, inputs["build_packages"]))
    variables = [
        "USE_SYSTEM_NCCL=1", f"NCCL_ROOT={nccl}", f"NCCL_INCLUDE_DIR={nccl}/include",
        f"NCCL_LIB_DIR={nccl}/lib", f"TORCH_CUDA_ARCH_LIST={arch_list(ctx)}",
        f"TORCH_NVCC_FLAGS={inputs['nvcc_flags']}", "CMAKE_PREFIX_PATH=/opt/conda",
        f"CUDA_HOME={ctx.image['cuda_home']}",
    ]
    if inputs.get("max_jobs"):
        variables.append(f"MAX_JOBS={inputs['max_jobs']}")
    steps.append(run(
        USE_CCACHE,
        "cd /tmp/pytorch",
        sh("env", *variables, PYTHON, "setup.py", "install", f"--root={EXPORT_ROOT}"),
        mounts=[bind("src-pytorch", "/tmp/pytorch", rw=True), CCACHE_MOUNT],
    ))
    wanted = runtime_requirements(ctx)
    if wanted:
        # --ignore-installed: the builder may already have them (build_packages), and what
        # only the builder has never reaches the image.
        steps.extend(pipinstall.install("pytorch", inputs, wanted, f"{PREFIX}/bin/pip",
                                     f"--prefix={EXPORT_ROOT}{PREFIX}", "--ignore-installed"))
    return "\n".join(steps)


# torch.cuda.nccl.version() reports the NCCL headers PyTorch was compiled with (an int before
# 1.10, a tuple since); ncclGetVersion reports the library actually loaded. Both must equal
# the nccl stage's version. The loaded library is the one /proc/self/maps shows after
# `import torch`, whatever its file is called.
NCCL_VERSIONS = """\
import ctypes, os, torch
want = tuple(int(x) for x in "{version}".split("."))
def split(code):
    return (code // 10000, code // 100 % 100, code % 100) if code >= 20900 else \\
        (code // 1000, code // 100 % 10, code % 100)
def dotted(parts):
    return ".".join(map(str, parts))
"""

COMPILED_NCCL = NCCL_VERSIONS + """\
assert torch.__version__.startswith("{torch}"), f"torch is {{torch.__version__}}, want {torch}"
got = torch.cuda.nccl.version()
got = tuple(got[:3]) if isinstance(got, tuple) else split(got)
assert got == want, f"torch was compiled with NCCL {{dotted(got)}}, the nccl stage is {version}"
print("torch", torch.__version__, "compiled with NCCL", dotted(got))
"""

LOADED_NCCL = NCCL_VERSIONS + """\
fields = (line.split(None, 5) for line in open("/proc/self/maps"))
paths = sorted({{f[5].strip() for f in fields
                if len(f) == 6 and os.path.basename(f[5]).startswith("libnccl.so")}})
assert len(paths) == 1, f"import torch loaded {{len(paths)}} libnccl files: {{paths}}"
code = ctypes.c_int()
assert ctypes.CDLL(paths[0]).ncclGetVersion(ctypes.byref(code)) == 0, "ncclGetVersion failed"
got = split(code.value)
assert got == want, f"{{paths[0]}} reports NCCL {{dotted(got)}}, the nccl stage is {version}"
print(paths[0], "reports NCCL", dotted(got))
"""


def checks(ctx: Context) -> Sequence[Check]:
    if from_wheel(ctx):
        return pytorch_wheel.checks(ctx)
    values = {"version": str(ctx.of("nccl")["version"]), "torch": ctx.of("pytorch")["version"]}
    names = [re.split(r"[\s<>=!~;\[(@]", r, maxsplit=1)[0] for r in runtime_requirements(ctx)]
    installed = ("import importlib.metadata as m\n"
                 f"for name in {names!r}:\n"
                 "    print(name, m.version(name))\n")
    return [
        Check(name="torch's runtime requirements are installed",
              script=sh(PYTHON, "-c", installed)),
        Check(name="torch compiled with the nccl stage's NCCL",
              script=sh(PYTHON, "-c", COMPILED_NCCL.format(**values))),
        Check(name="libnccl loaded by import torch is the nccl stage's (ncclGetVersion)",
              script=sh(PYTHON, "-c", LOADED_NCCL.format(**values))),
        Check(name="torch sees a GPU", needs="gpu",
              script=sh(PYTHON, "-c", "import torch; assert torch.cuda.is_available(), "
                                      "'torch.cuda.is_available() is False'; "
                                      "print(torch.cuda.get_device_name(0))")),
    ]


def deps_for(tables: Mapping[str, Inputs]) -> tuple[str, ...]:
    """Wheels only link the wheel's libnccl to the nccl stage's path, which the images that
    gather both fill: an NCCL bump then neither re-keys nor reinstalls the wheel closure. A
    source build compiles against the nccl stage."""
    return ("python",) if pytorch_wheel.chosen(tables) else ("python", "nccl")


STAGE = Stage(
    name="pytorch",
    doc=__doc__ or "",
    deps=("python", "nccl"),
    deps_for=deps_for,
    parent="python",
    fields={
        **git_fields(repo="https://github.com/pytorch/pytorch.git", ref="v{version}",
                     what="PyTorch"),
        "provider": Field(kind="name", default="source", choices=("source", "wheel"),
                          help="source (compiled against the nccl stage) or wheel"),
        "variant": Field(kind="name",
                         help="the wheel's CUDA variant, e.g. cu130 (default: from image.cuda)"),
        "index": Field(kind="url", default=pytorch_wheel.PYPI, keyed=False,
                       help="the package index the wheels are locked from (provider = wheel)"),
        "packages": Field(kind="packages", default=[],
                          help="wheels installed with torch, e.g. torchvision (provider = wheel; "
                               "torchvision and torchaudio must be the releases for this torch: "
                               "rule torch-wheel-companions)"),
        "submodules": Field(kind="bool", default=True, help="fetch git submodules"),
        "extra_cuda_arch": Field(kind="arch_list", default=[], help="archs beyond cuda_arch"),
        "ptx_arch": Field(kind="arch", help="arch that also gets PTX"),
        "nvcc_flags": Field(kind="text", default="-Xfatbin -compress-all",
                            help="TORCH_NVCC_FLAGS"),
        "max_jobs": Field(kind="jobs", help="MAX_JOBS for the compile"),
        "build_packages": Field(kind="packages", default=[], help="build requirements"),
        "runtime_requirements": Field(
            kind="packages",
            help="pip requirements import torch needs (default: the release's install_requires)"),
        "apt_packages": Field(
            kind="packages",
            default=["build-essential", "ca-certificates", "ccache", "cmake", "git",
                     "libjpeg-dev", "libpng-dev"],
            help="system build dependencies"),
    },
    sources=sources,
    recipe=recipe,
    # Its build dependencies take minutes to install before the compile even starts.
    layer_cache="max",
    checks=checks,
    pip_requirements=pip_requirements,
    prepare=prepare,
    wheel_index=wheel_index,
)

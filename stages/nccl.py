"""nccl: NVIDIA NCCL built from source, the one NCCL of the image.

PyTorch and the aws-ofi-nccl plugin are both built against this stage, so the NCCL the image
loads is the NCCL PyTorch was compiled with. NVCC_GENCODE comes from `[image] cuda_arch`.
It builds `src.build` and installs it with `src.install` into the prefix, with the license:
the files seed 002's `pkg.txz.build` packs and unpacks there. Only the headers, tools and
shared libraries reach the image (`libnccl_static.a`, 108 MB for 2.30, only with
`static = true`). Every make line that compiles gets NVCC_GENCODE, with PTX for
the newest arch so the library also runs on GPUs newer than the list. NCCL >= 2.19 runs python3
while it builds. Image stages remove any other libnccl (CUDA devel bases carry a distro NCCL in
/usr/lib/x86_64-linux-gnu), so the image has exactly one.

# Parameters
version: NCCL version (e.g. "2.10.3"), or "auto" for the NCCL the pinned PyTorch uses.
repo, ref, commit: the git source; ref defaults to the release tag `v{version}-1`.
prefix: where include/ and lib/ go (seed 000: /usr/local, seed 002: /opt/conda).
static: also install libnccl_static.a (default false).
provider: "source" (default, built with nvcc) or "wheel": the library of the nvidia-nccl-cuXX
  wheel the torch wheel pins, unpacked into `prefix` and compiled by no one here; needs
  `version = "auto"` and `[stages.pytorch] provider = "wheel"` (stages/nccl_wheel.py).
wheel_url, sha256: that wheel and its sha256 (filled by `invoke lock`).
only_funcs: NCCL's developer switch ONLY_FUNCS (e.g. "AllReduce Sum f32 * *"): builds only
  those collectives' kernels, 4x faster; for CI builds, never for production images.

# Examples
```toml
[stages.nccl]
version = "2.10.3"
prefix = "/opt/conda"
```

```toml
[stages.nccl]
version = "auto"
provider = "wheel"
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from imageforge.stageapi import (
    CCACHE_MOUNT,
    EXPORT_ROOT,
    LDCONFIG,
    USE_CCACHE,
    Check,
    Context,
    Field,
    Source,
    Stage,
    apt_install,
    bind,
    git_fields,
    git_source,
    numeric,
    run,
    sh,
    smoke,
)
from stages import nccl_wheel
from stages.nccl_pytorch_pin import PIN as PYTORCH_PIN
from stages.nccl_rules import RULES

BUILDDIR = "/tmp/nccl-build"


# Directories a distro NCCL lives in (libnccl2/libnccl-dev, NVIDIA's CUDA devel images).
SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib",
                   "/usr/local/lib", "/lib/x86_64-linux-gnu")
# NCCL's build runs python3 scripts (src/device/generate.py) from this release on.
NEEDS_PYTHON = Version("2.19")
# nvcc names its intermediate files /tmp/tmpxft_<pid>_..., and the host compiler writes that
# name into every object: two builds of the real libnccl.so and of nccl-tests differed. With
# -objtemp (nvcc 12.4 on) they are named after the object file, which is the same every build.
OBJTEMP_SINCE = Version("12.4")


def gencode(arches: Sequence[str]) -> str:
    """NVCC_GENCODE for a list like ["7.0", "8.0"]: SASS for each, and PTX for the newest so the
    library JIT-compiles on GPUs newer than the list."""
    codes = sorted({a.split("+")[0].replace(".", "") for a in arches}, key=int)
    sass = [f"-gencode=arch=compute_{c},code=sm_{c}" for c in codes]
    return " ".join([*sass, f"-gencode=arch=compute_{codes[-1]},code=compute_{codes[-1]}"])


def sources(ctx: Context) -> Sequence[Source]:
    if nccl_wheel.from_wheel(ctx.of("nccl")):
        return nccl_wheel.sources(ctx.of("nccl"))
    return [git_source("nccl", ctx.of("nccl"))]


def prepare(table: Mapping[str, Any], manifest: Path) -> Mapping[str, Any]:
    return nccl_wheel.prepare(table, manifest,
                              {key: field.default for key, field in STAGE.fields.items()})


def reproducible_nvcc(cuda: object, *, device_link: bool = True) -> list[str]:
    """The commands that make this CUDA's nvcc write the same files every build: one
    variable (NVCC_APPEND_FLAGS reaches every nvcc a makefile runs, whatever flags it builds).
    Before 12.4 nvcc has no -objtemp, and a CUDA the manifest leaves out gets nothing.

    `device_link=False` is for programs of whole-program CUDA (no -rdc), like nccl-tests:
    their link step's device link has nothing to link, yet compiles a stub from
    /tmp/tmpxft_<pid>_..._dlink.fatbin.c with -g, whose name lands in the debug information
    (every nccl-tests binary differed by it); -nodlink skips that step. NCCL itself is
    relocatable device code and links it (it runs nvcc -dlink itself)."""
    version = numeric(cuda)
    if version is None or version < OBJTEMP_SINCE:
        return []
    flags = "-objtemp" if device_link else "-objtemp -nodlink"
    return [f'export NVCC_APPEND_FLAGS="${{NVCC_APPEND_FLAGS:+$NVCC_APPEND_FLAGS }}{flags}"']


def needs_python(version: str) -> bool:
    try:
        return Version(version) >= NEEDS_PYTHON
    except InvalidVersion:
        return True   # a branch or commit: assume a current tree


def recipe(ctx: Context) -> str:
    inputs = ctx.of("nccl")
    if nccl_wheel.from_wheel(inputs):
        return nccl_wheel.recipe(ctx)
    prefix = f"{EXPORT_ROOT}{inputs['prefix']}"
    cuda = str(ctx.image["cuda_home"])
    # No arch list means NCCL's own default (every arch), as seed 000 builds it.
    arches = ctx.image["cuda_arch"]
    make_vars = [f"CUDA_HOME={cuda}", f"BUILDDIR={BUILDDIR}"]
    if arches:
        make_vars.append(f"NVCC_GENCODE={gencode(arches)}")
    if inputs.get("only_funcs"):
        make_vars.append(f"ONLY_FUNCS={inputs['only_funcs']}")
    steps = []
    python = needs_python(str(inputs["version"]))
    if python and ctx.image["apt"]:
        steps.append(apt_install(["python3"]))
    guard = ([f'if ! command -v python3 >/dev/null; then echo "NCCL {inputs["version"]} needs '
              'python3 to build: add it to the base image or set [image] apt = true" >&2; '
              'exit 1; fi'] if python else [])
    # src.install gets the same variables: were anything stale, it would otherwise rebuild
    # every arch NCCL knows, on one core. It copies what seed 002's pkg.txz.build packs,
    # without xz-packing the libraries on one core only to unpack them (about 30 s for an
    # ONLY_FUNCS build, minutes for a full one).
    steps.append(run(
        USE_CCACHE,
        *reproducible_nvcc(ctx.image.get("cuda")),
        *guard,
        "cd /tmp/nccl",
        'make -j"$(nproc)" ' + sh("src.build", *make_vars),
        sh("make", "src.install", f"PREFIX={prefix}", *make_vars) + " >/dev/null",
        sh("cp", "LICENSE.txt", f"{prefix}/"),
        *([] if inputs.get("static") else [sh("rm", "-f", f"{prefix}/lib/libnccl_static.a")]),
        sh("rm", "-rf", BUILDDIR),
        mounts=[bind("src-nccl", "/tmp/nccl", rw=True), CCACHE_MOUNT],
    ))
    return "\n".join(steps)


def remove_other_libnccl(ctx: Context) -> str:
    """A RUN line for image stages: delete every libnccl (and nccl.h) outside the nccl stage's
    prefix from the system's library directories, so the image has exactly one NCCL."""
    prefix = str(ctx.of("nccl")["prefix"])
    dirs = [d for d in SYSTEM_LIB_DIRS if d != f"{prefix}/lib"]
    headers = [h for h in ("/usr/include/nccl.h", "/usr/include/nccl_net.h")
               if not h.startswith(f"{prefix}/")]
    # libnccl.so* and libnccl_static.a only: the net plugin (libnccl-net*.so) stays.
    return run(
        f"find {' '.join(dirs)} -maxdepth 1 \\( -name 'libnccl.so*' -o -name "
        f"'libnccl_static.a' \\) ! -path {sh(prefix + '/*')} -print -delete 2>/dev/null || true",
        sh("rm", "-f", *headers),
        LDCONFIG,
    )


def env_paths(ctx: Context) -> Mapping[str, Sequence[str]]:
    # ldconfig already searches /usr/local/lib; any other prefix must be on the path so the
    # NCCL the image loads is this one, not a copy bundled elsewhere.
    prefix = str(ctx.of("nccl")["prefix"])
    return {} if prefix == "/usr/local" else {"LD_LIBRARY_PATH": [f"{prefix}/lib"]}


def env(ctx: Context) -> Mapping[str, str]:
    return {"NCCL_VERSION": str(ctx.of("nccl")["version"])}


def checks(ctx: Context) -> Sequence[Check]:
    inputs = ctx.of("nccl")
    lib = f"{inputs['prefix']}/lib/libnccl.so.{inputs['version']}"
    version = str(inputs["version"])
    return [
        Check(name=f"{lib} present", script=sh("test", "-e", lib)),
        Check(name="ncclGetVersion of the libnccl a process loads is the pin",
              script=smoke.reports_version("nccl (ncclGetVersion)",
                                           f"{smoke.loaded_nccl()} | cut -d' ' -f1", version)),
        Check(name="nccl.h declares the pinned version",
              script=smoke.reports_version(
                  "nccl (nccl.h)", smoke.header_nccl(f"{inputs['prefix']}/include"), version)),
        Check(name="only NCCL's shared libraries, no libnccl_static.a",
              script=(f"! ls {sh(inputs['prefix'] + '/lib')}/libnccl_static.a 2>/dev/null"
                      if not inputs.get("static") else "true")),
        # A second libnccl makes the one a process loads depend on the search order.
        Check(name="exactly one libnccl visible to the dynamic linker",
              script=smoke.one_visible("libnccl.so")),
    ]


STAGE = Stage(
    name="nccl",
    doc=__doc__ or "",
    deps=("base",),
    fields={
        **git_fields(repo="https://github.com/NVIDIA/nccl.git", ref="v{version}-1", what="NCCL"),
        # "auto" is resolved from PyTorch's own NCCL pin when locking.
        "version": Field(kind="version", required=True, literals=("auto",),
                         help='NCCL version, or "auto" for the one the pinned PyTorch uses'),
        "prefix": Field(kind="path", default="/usr/local", help="install prefix"),
        "static": Field(kind="bool", default=False, help="also install libnccl_static.a"),
        "only_funcs": Field(
            kind="text",
            help='NCCL ONLY_FUNCS: build only these kernels, e.g. "AllReduce Sum f32 * *"'),
        "differs_from_pytorch": Field(
            kind="text", help="why this NCCL differs from the one PyTorch pins (required then)"),
        **nccl_wheel.FIELDS,
    },
    sources=sources,
    recipe=recipe,
    env_paths=env_paths,
    env=env,
    checks=checks,
    lock_pins=(PYTORCH_PIN,),
    rules=RULES,
    prepare=prepare,
)

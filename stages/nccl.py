"""nccl: NVIDIA NCCL built from source, the one NCCL of the image.

PyTorch and the aws-ofi-nccl plugin are both built against this stage, so the NCCL the image
loads is the NCCL PyTorch was compiled with. NVCC_GENCODE comes from `[image] cuda_arch`.
Like seed 002 it builds `src.build`, packs `pkg.txz.build` and unpacks the package into the
prefix, so only headers and libraries (no objects) reach the image.

# Parameters
version: NCCL version (e.g. "2.10.3"), or "auto" for the NCCL the pinned PyTorch uses.
repo, ref, commit: the git source; ref defaults to the release tag `v{version}-1`.
prefix: where include/ and lib/ go (seed 000: /usr/local, seed 002: /opt/conda).

# Examples
```toml
[stages.nccl]
version = "2.10.3"
prefix = "/opt/conda"
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from imageforge import smoke
from imageforge.dockerfile import CCACHE_MOUNT, USE_CCACHE, bind, run, sh
from imageforge.sources import Source
from imageforge.stage import EXPORT_ROOT, Check, Context, Field, Stage, git_fields, git_source

BUILDDIR = "/tmp/nccl-build"


def gencode(arches: Sequence[str]) -> str:
    """NVCC_GENCODE for a list like ["7.0", "8.0"] (PTX suffixes are PyTorch's business)."""
    codes = [a.split("+")[0].replace(".", "") for a in arches]
    return " ".join(f"-gencode=arch=compute_{c},code=sm_{c}" for c in codes)


def sources(ctx: Context) -> Sequence[Source]:
    return [git_source("nccl", ctx.of("nccl"))]


def recipe(ctx: Context) -> str:
    inputs = ctx.of("nccl")
    prefix = f"{EXPORT_ROOT}{inputs['prefix']}"
    cuda = str(ctx.image["cuda_home"])
    # No arch list means NCCL's own default (every arch), as seed 000 builds it.
    arches = ctx.image["cuda_arch"]
    gencode_var = [f"NVCC_GENCODE={gencode(arches)}"] if arches else []
    return run(
        USE_CCACHE,
        "cd /tmp/nccl",
        'make -j"$(nproc)" '
        + sh("src.build", f"CUDA_HOME={cuda}", *gencode_var, f"BUILDDIR={BUILDDIR}"),
        sh("make", "pkg.txz.build", f"CUDA_HOME={cuda}", f"BUILDDIR={BUILDDIR}"),
        sh("mkdir", "-p", prefix),
        f"tar -xvf {BUILDDIR}/pkg/txz/nccl_*.txz -C {sh(prefix)} --strip-components=1",
        sh("rm", "-rf", BUILDDIR),
        mounts=[bind("src-nccl", "/tmp/nccl", rw=True), CCACHE_MOUNT],
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
    return [
        Check(name=f"{lib} present", script=sh("test", "-e", lib)),
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
        "differs_from_pytorch": Field(
            kind="text", help="why this NCCL differs from the one PyTorch pins (required then)"),
    },
    sources=sources,
    recipe=recipe,
    env_paths=env_paths,
    env=env,
    checks=checks,
)

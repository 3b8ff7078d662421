"""nccl-tests: NCCL's performance tests (all_reduce_perf, ...), built with MPI.

Seed 000: `make MPI=1 MPI_HOME=/opt/amazon/openmpi CUDA_HOME=/usr/local/cuda NCCL_HOME=<nccl>`.
The binaries are installed under `<prefix>/bin`.

# Parameters
version: tag without the leading v, or a branch name with `ref` set to it.
prefix: install prefix of the binaries (default /opt/nccl-tests).
only_tests: build only these tests, by the names of nccl-tests' own BIN_FILES_LIST (e.g.
  ["all_reduce"] for all_reduce_perf). The match of NCCL's only_funcs: with only AllReduce
  kernels the other tests cannot run anyway. For CI builds, never for production images.

# Examples
```toml
[stages.nccl-tests]
version = "2.13.8"
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from imageforge.stageapi import (
    EXPORT_ROOT,
    Check,
    Context,
    Field,
    Source,
    Stage,
    bind,
    git_fields,
    git_source,
    run,
    sh,
    smoke,
)
from stages.nccl import gencode, reproducible_nvcc


def sources(ctx: Context) -> Sequence[Source]:
    return [git_source("nccl-tests", ctx.of("nccl-tests"))]


def recipe(ctx: Context) -> str:
    bindir = f"{EXPORT_ROOT}{ctx.of('nccl-tests')['prefix']}/bin"
    arches = ctx.image["cuda_arch"]
    # Without NVCC_GENCODE nccl-tests builds 6 archs: 3.5x slower, 263 MB of binaries.
    gencode_var = [f"NVCC_GENCODE={gencode(arches)}"] if arches else []
    only = ctx.of("nccl-tests").get("only_tests")
    # A make variable of nccl-tests' src/Makefile, overridden from the command line.
    only_var = [f"BIN_FILES_LIST={' '.join(only)}"] if only else []
    return run(
        # Both builds of every binary ran all_reduce_perf on an H200 with #wrong 0.
        *reproducible_nvcc(ctx.image.get("cuda"), device_link=False),
        "cd /tmp/nccl-tests",
        'make -j"$(nproc)" ' + sh(
            "MPI=1", "MPI_HOME=/opt/amazon/openmpi", f"CUDA_HOME={ctx.image['cuda_home']}",
            f"NCCL_HOME={ctx.of('nccl')['prefix']}", *gencode_var, *only_var,
        ),
        sh("mkdir", "-p", bindir),
        f"cp build/*_perf {sh(bindir)}/",
        mounts=[bind("src-nccl-tests", "/tmp/nccl-tests", rw=True)],
    )


def env_paths(ctx: Context) -> Mapping[str, Sequence[str]]:
    return {"PATH": [f"{ctx.of('nccl-tests')['prefix']}/bin"]}


def checks(ctx: Context) -> Sequence[Check]:
    bindir = f"{ctx.of('nccl-tests')['prefix']}/bin"
    # AWS's own test of these images: one GPU through the plugin and EFA, at every size.
    all_reduce = (f"set -o pipefail\nNCCL_DEBUG=INFO {sh(f'{bindir}/all_reduce_perf')} "
                  "-b 8 -e 1G -f 2 -g 1 -c 1 -n 100 | tee /tmp/all_reduce_perf.log\n"
                  "grep -q 'Selected Provider is efa' /tmp/all_reduce_perf.log || "
                  "{ echo 'NCCL did not select the EFA provider'; exit 1; }")
    return [
        Check(name="nccl-tests binaries link", script=smoke.links(f"{sh(bindir)}/*_perf")),
        Check(name="all_reduce_perf -g 1 selects the EFA provider", needs="efa",
              script=all_reduce),
    ]


STAGE = Stage(
    name="nccl-tests",
    doc=__doc__ or "",
    deps=("base", "efa", "nccl"),
    # Built FROM efa: Open MPI and libfabric need the rdma-core libraries the installer puts
    # in /usr/lib, which a builder FROM base with a copy of /opt/amazon would lack.
    parent="efa",
    fields={
        **git_fields(repo="https://github.com/NVIDIA/nccl-tests.git", ref="v{version}",
                     what="nccl-tests"),
        "prefix": Field(kind="path", default="/opt/nccl-tests", help="install prefix"),
        "only_tests": Field(
            kind="names",
            help='build only these tests, e.g. ["all_reduce"] (for CI, with NCCL\'s only_funcs)'),
    },
    sources=sources,
    recipe=recipe,
    env_paths=env_paths,
    checks=checks,
)

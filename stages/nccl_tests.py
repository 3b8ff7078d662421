"""nccl-tests: NCCL's performance tests (all_reduce_perf, ...), built with MPI.

Seed 000: `make MPI=1 MPI_HOME=/opt/amazon/openmpi CUDA_HOME=/usr/local/cuda NCCL_HOME=<nccl>`.
The binaries are installed under `<prefix>/bin`.

# Parameters
version: tag without the leading v, or a branch name with `ref` set to it.
prefix: install prefix of the binaries (default /opt/nccl-tests).

# Examples
```toml
[stages.nccl-tests]
version = "2.13.8"
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from imageforge.dockerfile import bind, run, sh
from imageforge.sources import Source
from imageforge.stage import EXPORT_ROOT, Check, Context, Field, Stage, git_fields, git_source


def sources(ctx: Context) -> Sequence[Source]:
    return [git_source("nccl-tests", ctx.of("nccl-tests"))]


def recipe(ctx: Context) -> str:
    bindir = f"{EXPORT_ROOT}{ctx.of('nccl-tests')['prefix']}/bin"
    return run(
        "cd /tmp/nccl-tests",
        'make -j"$(nproc)" ' + sh(
            "MPI=1", "MPI_HOME=/opt/amazon/openmpi", f"CUDA_HOME={ctx.image['cuda_home']}",
            f"NCCL_HOME={ctx.of('nccl')['prefix']}",
        ),
        sh("mkdir", "-p", bindir),
        f"cp build/*_perf {sh(bindir)}/",
        mounts=[bind("src-nccl-tests", "/tmp/nccl-tests", rw=True)],
    )


def env_paths(ctx: Context) -> Mapping[str, Sequence[str]]:
    return {"PATH": [f"{ctx.of('nccl-tests')['prefix']}/bin"]}


def checks(ctx: Context) -> Sequence[Check]:
    binary = f"{ctx.of('nccl-tests')['prefix']}/bin/all_reduce_perf"
    return [Check(name="all_reduce_perf links",
                  script=f"{sh('test', '-x', binary)} && ! ldd {sh(binary)} | grep 'not found'")]


STAGE = Stage(
    name="nccl-tests",
    doc=__doc__ or "",
    deps=("base", "efa", "nccl"),
    fields={
        **git_fields(repo="https://github.com/NVIDIA/nccl-tests.git", ref="v{version}",
                     what="nccl-tests"),
        "prefix": Field(kind="path", default="/opt/nccl-tests", help="install prefix"),
    },
    sources=sources,
    recipe=recipe,
    env_paths=env_paths,
    checks=checks,
)

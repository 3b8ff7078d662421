"""aws-ofi-nccl: the NCCL net plugin that lets NCCL use libfabric (EFA).

Needs libfabric (the efa stage) and NCCL's headers (the nccl stage), not PyTorch.
Seed commands: `./autogen.sh && ./configure --with-libfabric=/opt/amazon/efa
--with-mpi=/opt/amazon/openmpi --with-cuda=/usr/local/cuda --with-nccl=<nccl prefix>
--prefix=<prefix> && make && make install`; installed through DESTDIR so only the plugin is
exported.

# Parameters
version: plugin version (seed 000: 1.1.1, seed 002: 1.1.3-aws); ref defaults to `v{version}`.
prefix: install prefix (seed: /usr/local).
configure_flags: extra configure flags (e.g. "--enable-platform-aws", "--disable-tests").
apt_packages: build tools (seed: autoconf automake libtool).

# Examples
```toml
[stages.aws-ofi-nccl]
version = "1.1.3-aws"
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from imageforge import smoke
from imageforge.dockerfile import apt_install, bind, run, sh
from imageforge.sources import Source
from imageforge.stage import EXPORT_ROOT, Check, Context, Field, Stage, git_fields, git_source


def sources(ctx: Context) -> Sequence[Source]:
    return [git_source("aws-ofi-nccl", ctx.of("aws-ofi-nccl"))]


def recipe(ctx: Context) -> str:
    inputs = ctx.of("aws-ofi-nccl")
    steps = [apt_install(inputs["apt_packages"])] if ctx.image["apt"] else []
    configure = sh(
        "./configure",
        "--with-libfabric=/opt/amazon/efa",
        "--with-mpi=/opt/amazon/openmpi",
        f"--with-cuda={ctx.image['cuda_home']}",
        f"--with-nccl={ctx.of('nccl')['prefix']}",
        f"--prefix={inputs['prefix']}",
        *inputs["configure_flags"],
    )
    steps.append(run(
        "cd /tmp/aws-ofi-nccl",
        "./autogen.sh",
        configure,
        'make -j"$(nproc)"',
        sh("make", "install", f"DESTDIR={EXPORT_ROOT}"),
        mounts=[bind("src-aws-ofi-nccl", "/tmp/aws-ofi-nccl", rw=True)],
    ))
    return "\n".join(steps)


def env_paths(ctx: Context) -> Mapping[str, Sequence[str]]:
    return {"LD_LIBRARY_PATH": [f"{ctx.of('aws-ofi-nccl')['prefix']}/lib"]}


def checks(ctx: Context) -> Sequence[Check]:
    plugin = f"{ctx.of('aws-ofi-nccl')['prefix']}/lib/libnccl-net.so"
    return [
        Check(name="plugin links: ldd resolves every dependency", script=smoke.links(sh(plugin))),
        Check(name="plugin dlopens", script=smoke.dlopens(plugin)),
        # The installer's libfabric has the EFA provider; a system libfabric may not.
        Check(name="plugin links EFA's libfabric",
              script=smoke.links_to(plugin, "/opt/amazon/efa/lib/libfabric.so.1")),
    ]


STAGE = Stage(
    name="aws-ofi-nccl",
    doc=__doc__ or "",
    deps=("base", "efa", "nccl"),
    fields={
        **git_fields(repo="https://github.com/aws/aws-ofi-nccl.git", ref="v{version}",
                     what="aws-ofi-nccl"),
        "prefix": Field(kind="path", default="/usr/local", help="install prefix"),
        "configure_flags": Field(kind="flags", default=[], help="extra ./configure flags"),
        "build_despite_bundled": Field(
            kind="bool", default=False,
            help="build the plugin even when the EFA installer bundles one (EFA >= 1.38)"),
        "apt_packages": Field(kind="packages", default=["autoconf", "automake", "libtool"],
                              help="build tools installed with apt"),
    },
    sources=sources,
    recipe=recipe,
    env_paths=env_paths,
    checks=checks,
)

"""efa: the AWS EFA installer (libfabric in /opt/amazon/efa, Open MPI in /opt/amazon/openmpi).

Seed commands, unchanged: `tar -xf aws-efa-installer-<v>.tar.gz && cd aws-efa-installer &&
./efa_installer.sh -y --skip-kmod -g`. The tarball is fetched and verified on the host.
Image stages are built FROM this stage, because the real installer also installs system
packages (rdma-core) that a copy of /opt/amazon alone would miss.

# Parameters
version: installer version (seed 000: 1.11.2, seed 002: 1.14.1).
url, sha256: the installer tarball.
gpg_fingerprint, gpg_key_url: when the fingerprint is set, `<url>.sig` must be a good signature
by that key (AWS documents its key's fingerprint) before the tarball is used.
flags: installer flags (seed: -y --skip-kmod -g).

# Examples
```toml
[stages.efa]
version = "1.14.1"
url = "https://efa-installer.amazonaws.com/aws-efa-installer-{version}.tar.gz"
```
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from imageforge.stageapi import (
    APT_CLEAN,
    DEFAULT_KEY_URL,
    Check,
    Context,
    Field,
    Signature,
    Source,
    Stage,
    bind,
    run,
    sh,
    smoke,
    url_fields,
    url_source,
)
from stages.efa_rules import RULES, known_efa


def sources(ctx: Context) -> Sequence[Source]:
    inputs = ctx.of("efa")
    source = url_source("efa", inputs)
    if not inputs.get("gpg_fingerprint"):
        return [source]
    # AWS publishes a detached signature beside each installer.
    signature = Signature(url=f"{source.url}.sig", key_url=str(inputs["gpg_key_url"]),
                          fingerprint=str(inputs["gpg_fingerprint"]))
    return [dataclasses.replace(source, signature=signature)]


def recipe(ctx: Context) -> str:
    inputs = ctx.of("efa")
    tarball = url_source("efa", inputs).filename
    # The real installer installs its packages with apt, which needs package lists.
    update = ["env DEBIAN_FRONTEND=noninteractive apt-get update"] if ctx.image["apt"] else []
    return run(
        *update,
        "mkdir /tmp/efa",
        "cd /tmp/efa",
        sh("tar", "-xf", f"/src/{tarball}"),
        "cd aws-efa-installer",
        sh("./efa_installer.sh", *inputs["flags"]),
        "rm -rf /tmp/efa",
        # The installer installs its packages with apt itself, whether or not this recipe
        # fetched the lists, and runs ldconfig: APT_CLEAN removes what they leave that differs
        # from one run to the next (the real stand-in's pkgcache.bin did).
        APT_CLEAN,
        mounts=[bind("src-efa", "/src")],
    )


def env_paths(_ctx: Context) -> Mapping[str, Sequence[str]]:
    return {
        "PATH": ["/opt/amazon/openmpi/bin", "/opt/amazon/efa/bin"],
        "LD_LIBRARY_PATH": ["/opt/amazon/efa/lib", "/opt/amazon/openmpi/lib"],
    }


def env(ctx: Context) -> Mapping[str, str]:
    # Seed 002: lets processes call fork() with RDMA memory registered (libibverbs).
    return {"EFA_VERSION": str(ctx.of("efa")["version"]), "RDMAV_FORK_SAFE": "1"}


def checks(ctx: Context) -> Sequence[Check]:
    known = known_efa(str(ctx.of("efa")["version"]))
    libfabric = ".".join(str(known.libfabric).split(".")[:2]) if known else None
    return [
        Check(name="fi_info runs", script="/opt/amazon/efa/bin/fi_info --version"),
        Check(name="libfabric is the one the installer version bundles (fi_info --version)",
              script=smoke.reports_version(
                  "libfabric", "/opt/amazon/efa/bin/fi_info --version | "
                  "awk '$1 == \"libfabric:\" {print $2}'", libfabric)),
        Check(name="fi_info -l lists providers",
              script="/opt/amazon/efa/bin/fi_info -l | tee /tmp/providers\n"
                     "grep -Eq '^[a-z0-9_;]+:$' /tmp/providers"),
        Check(name="Open MPI's version (mpirun --version)",
              script=smoke.reports_version(
                  "Open MPI", "/opt/amazon/openmpi/bin/mpirun --version | "
                  "sed -n 's/^mpirun (Open MPI) //p'", None)),
        Check(name="mpirun -np 2 runs",
              script="/opt/amazon/openmpi/bin/mpirun --allow-run-as-root --oversubscribe "
                     "-np 2 hostname"),
        Check(name="libfabric and Open MPI link",
              script="! ldd /opt/amazon/efa/bin/fi_info /opt/amazon/openmpi/lib/libmpi.so "
                     "| grep 'not found'"),
        # Lists the provider only where an EFA device is attached.
        Check(name="fi_info -p efa -t FI_EP_RDM lists the EFA provider", needs="efa",
              script="/opt/amazon/efa/bin/fi_info -p efa -t FI_EP_RDM"),
    ]


STAGE = Stage(
    name="efa",
    doc=__doc__ or "",
    deps=("base",),
    fields={
        **url_fields(url="https://efa-installer.amazonaws.com/aws-efa-installer-{version}.tar.gz",
                     what="EFA installer"),
        "flags": Field(kind="flags", default=["-y", "--skip-kmod", "-g"],
                       help="efa_installer.sh flags"),
        "gpg_fingerprint": Field(kind="fingerprint", keyed=False,
                                 help="verify <url>.sig with the key of this fingerprint"),
        "gpg_key_url": Field(kind="url", default=DEFAULT_KEY_URL, keyed=False,
                             help="where the signing key is downloaded (with gpg_fingerprint)"),
    },
    sources=sources,
    recipe=recipe,
    exports=("/opt/amazon",),
    env_paths=env_paths,
    env=env,
    checks=checks,
    rules=RULES,
)

"""aws-ofi-nccl: the NCCL net plugin that lets NCCL use libfabric (EFA).

Needs libfabric (the efa stage) and NCCL's headers (the nccl stage), not PyTorch. Built FROM
the efa stage, which also has the rdma-core libraries libfabric links against. Since 1.5.0 the
plugin uses its own copy of NCCL's net headers (`--with-nccl` is not passed); since 1.19.0 an
exported tree gets a `.release_version` file, which autogen.sh needs without `.git`.
Two source kinds: the git repository (default), or a release tarball (`url`, pinned by
`sha256`): `make dist` output, `releases/download/v<X>/aws-ofi-nccl-<X>.tar.gz`, which carries
`.release_version` and a generated `configure`, so autogen.sh is skipped. A GitHub tag archive
works too: it has neither, and gets both like an exported tree.
Seed commands: `./autogen.sh && ./configure --with-libfabric=/opt/amazon/efa
--with-mpi=/opt/amazon/openmpi --with-cuda=/usr/local/cuda --with-nccl=<nccl prefix>
--prefix=<prefix> && make && make install`; installed through DESTDIR so only the plugin is
exported.

# Parameters
provider: "source" (default, built with configure and make) or "efa": the plugin EFA installer
  1.38 and later ships under /opt/amazon/ofi-nccl, looked up where the installer put it and
  linked at `<prefix>/lib/libnccl-net.so`, with no build (stages/aws_ofi_nccl_efa.py).
version: plugin version (seed 000: 1.1.1, seed 002: 1.1.3-aws); ref defaults to `v{version}`.
  With provider = "efa": the release the installer is expected to ship (the image checks it).
url, sha256: a release tarball to build instead of the git repository (`{version}` is
substituted; the lock pins sha256), e.g. GitHub's
`https://github.com/aws/aws-ofi-nccl/releases/download/v{version}/aws-ofi-nccl-{version}.tar.gz`.
prefix: install prefix (seed: /usr/local).
configure_flags: extra configure flags (e.g. "--enable-platform-aws", "--disable-tests").
apt_packages: build tools (seed: autoconf automake libtool).

# Examples
```toml
[stages.aws-ofi-nccl]
version = "1.1.3-aws"

[stages.aws-ofi-nccl]      # or a release tarball, here from a mirror
version = "1.21.1"
url = "https://mirror.example.com/aws-ofi-nccl/aws-ofi-nccl-{version}.tar.gz"

[stages.aws-ofi-nccl]      # or the plugin the EFA installer (1.38 and later) ships
provider = "efa"
version = "1.9.1"
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from imageforge.stageapi import (
    EXPORT_ROOT,
    Check,
    Context,
    Field,
    Source,
    Stage,
    apt_install,
    bind,
    git_fields,
    git_source,
    run,
    sh,
    smoke,
    url_source,
)
from stages import aws_ofi_nccl_efa
from stages.aws_ofi_nccl_rules import RULES

SOURCE_DIR = "/tmp/aws-ofi-nccl"


def sources(ctx: Context) -> Sequence[Source]:
    inputs = ctx.of("aws-ofi-nccl")
    if aws_ofi_nccl_efa.from_efa(inputs):
        return []   # the EFA installer's plugin, already in the efa stage
    if inputs.get("url"):
        return [url_source("aws-ofi-nccl", inputs)]
    return [git_source("aws-ofi-nccl", inputs)]


# From 1.5.0 the plugin builds against its own copy of NCCL's net headers: --with-nccl is
# ignored (configure.ac no longer reads it).
OWN_NCCL_HEADERS = Version("1.5.0")
# From 1.19.0 autogen.sh takes the version from git or from .release_version (release
# tarballs carry one); an exported tree has neither and stops with "No version found".
RELEASE_VERSION_FILE = Version("1.19.0")


def release(version: str) -> Version | None:
    """The plugin release a version names ("1.13.2-aws" -> 1.13.2), None for a branch."""
    try:
        return Version(version.removesuffix("-aws"))
    except InvalidVersion:
        return None


def prepare(table: Mapping[str, Any], manifest: Path) -> Mapping[str, Any]:
    return aws_ofi_nccl_efa.prepare(
        table, manifest, {key: field.default for key, field in STAGE.fields.items()})


def recipe(ctx: Context) -> str:
    inputs = ctx.of("aws-ofi-nccl")
    if aws_ofi_nccl_efa.from_efa(inputs):
        return aws_ofi_nccl_efa.recipe(ctx)
    version = str(inputs["version"])
    plugin = release(version)
    steps = [apt_install(inputs["apt_packages"])] if ctx.image["apt"] else []
    nccl = ([] if plugin is None or plugin >= OWN_NCCL_HEADERS
            else [f"--with-nccl={ctx.of('nccl')['prefix']}"])
    configure = sh(
        "./configure",
        "--with-libfabric=/opt/amazon/efa",
        "--with-mpi=/opt/amazon/openmpi",
        f"--with-cuda={ctx.image['cuda_home']}",
        *nccl,
        f"--prefix={inputs['prefix']}",
        *inputs["configure_flags"],
    )
    version_file = (
        # Braced: a bare `a || b` inside the && chain would swallow an earlier failure.
        ["{ test -e .release_version || test -e .git || "
         f"echo {sh(version)} > .release_version; }}"]
        if plugin is None or plugin >= RELEASE_VERSION_FILE else [])
    build = [configure, 'make -j"$(nproc)"', sh("make", "install", f"DESTDIR={EXPORT_ROOT}")]
    if inputs.get("url"):
        # A release tarball's one top directory is aws-ofi-nccl-<version>; make dist already
        # generated configure, which a tag archive lacks.
        tarball = url_source("aws-ofi-nccl", inputs).filename
        steps.append(run(
            sh("mkdir", "-p", SOURCE_DIR),
            sh("tar", "-xf", f"/src/{tarball}", "--strip-components=1", "-C", SOURCE_DIR),
            f"cd {SOURCE_DIR}",
            *version_file,
            "{ test -x configure || ./autogen.sh; }",
            *build,
            sh("rm", "-rf", SOURCE_DIR),
            mounts=[bind("src-aws-ofi-nccl", "/src")],
        ))
    else:
        steps.append(run(
            f"cd {SOURCE_DIR}",
            *version_file,
            "./autogen.sh",
            *build,
            mounts=[bind("src-aws-ofi-nccl", SOURCE_DIR, rw=True)],
        ))
    return "\n".join(steps)


def env_paths(ctx: Context) -> Mapping[str, Sequence[str]]:
    return {"LD_LIBRARY_PATH": [f"{ctx.of('aws-ofi-nccl')['prefix']}/lib"]}


def checks(ctx: Context) -> Sequence[Check]:
    plugin = f"{ctx.of('aws-ofi-nccl')['prefix']}/lib/libnccl-net.so"
    return [
        Check(name="plugin links: ldd resolves every dependency", script=smoke.links(sh(plugin))),
        Check(name="plugin dlopens", script=smoke.dlopens(plugin)),
        # PACKAGE_STRING ("aws-ofi-nccl <version>") is compiled into the plugin's init log line.
        Check(name="plugin's own version string is the pin",
              script=smoke.reports_version(
                  "aws-ofi-nccl",
                  f"grep -a -o -m 1 'aws-ofi-nccl [0-9][0-9A-Za-z.-]*' {sh(plugin)} "
                  "| head -n 1 | cut -d' ' -f2",
                  str(ctx.of("aws-ofi-nccl")["version"]))),
        # The installer's libfabric has the EFA provider; a system libfabric may not.
        Check(name="plugin links EFA's libfabric",
              script=smoke.links_to(plugin, "/opt/amazon/efa/lib/libfabric.so.1")),
        *(aws_ofi_nccl_efa.checks(ctx) if aws_ofi_nccl_efa.from_efa(ctx.of("aws-ofi-nccl"))
          else []),
    ]


STAGE = Stage(
    name="aws-ofi-nccl",
    doc=__doc__ or "",
    deps=("base", "efa", "nccl"),
    # Built FROM efa: libfabric links against rdma-core (libibverbs, librdmacm, libefa), which
    # the installer puts in /usr/lib, outside the /opt/amazon a builder FROM base would copy.
    parent="efa",
    fields={
        **git_fields(repo="https://github.com/aws/aws-ofi-nccl.git", ref="v{version}",
                     what="aws-ofi-nccl"),
        "url": Field(kind="url", locates="sha256",
                     help="release tarball to build instead of the git repository; "
                          "`{version}` is substituted"),
        "sha256": Field(kind="sha256", locked=True, help="sha256 of the tarball (lock)"),
        "prefix": Field(kind="path", default="/usr/local", help="install prefix"),
        "configure_flags": Field(kind="flags", default=[], help="extra ./configure flags"),
        "build_despite_bundled": Field(
            kind="bool", default=False,
            help="build the plugin even when the EFA installer bundles one (EFA >= 1.38)"),
        "apt_packages": Field(kind="packages", default=["autoconf", "automake", "libtool"],
                              help="build tools installed with apt"),
        **aws_ofi_nccl_efa.FIELDS,
    },
    sources=sources,
    prepare=prepare,
    recipe=recipe,
    env_paths=env_paths,
    checks=checks,
    rules=RULES,
)

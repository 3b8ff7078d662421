"""boost: Boost from the release tarball (SMDDP uses it for asynchronous network IO).

Seed 002 ends the b2 line with `|| true`, so a failed boost build passes silently; here a
failing b2 fails the stage. Installed under `<prefix>` (seed: the conda prefix).

# Parameters
version: e.g. "1.73.0"; the URL may use `{version}` and `{version_underscored}` (1_73_0).
url, sha256: the tarball.
prefix: install prefix (seed: /opt/conda).
b2_args: b2 arguments (seed: threading=multi cxxflags=-fPIC cflags=-fPIC).

# Examples
```toml
[stages.boost]
version = "1.73.0"
```
"""

from __future__ import annotations

from collections.abc import Sequence

from imageforge.stageapi import (
    EXPORT_ROOT,
    Check,
    Context,
    Field,
    Source,
    Stage,
    bind,
    run,
    sh,
    smoke,
    url_fields,
    url_source,
)


def sources(ctx: Context) -> Sequence[Source]:
    return [url_source("boost", ctx.of("boost"))]


def recipe(ctx: Context) -> str:
    inputs = ctx.of("boost")
    tarball = url_source("boost", inputs).filename
    topdir = "boost_" + str(inputs["version"]).replace(".", "_")
    return run(
        "mkdir -p /tmp/boost",
        sh("tar", "-xzf", f"/src/{tarball}", "-C", "/tmp/boost"),
        sh("cd", f"/tmp/boost/{topdir}"),
        "./bootstrap.sh",
        './b2 -j"$(nproc)" ' + sh(f"--prefix={EXPORT_ROOT}{inputs['prefix']}",
                                  *inputs["b2_args"], "install"),
        "rm -rf /tmp/boost",
        mounts=[bind("src-boost", "/src")],
    )


def checks(ctx: Context) -> Sequence[Check]:
    inputs = ctx.of("boost")
    major, minor, patch = (int(x) for x in str(inputs["version"]).split(".")[:3])
    header = f"{inputs['prefix']}/include/boost/version.hpp"
    wanted = f"#define BOOST_VERSION {major * 100000 + minor * 100 + patch}"
    # A b2 that fails half-way installs the headers but not every library.
    libs = [f"{inputs['prefix']}/lib/libboost_{name}.so.{inputs['version']}"
            for name in ("system", "filesystem", "thread", "chrono")]
    return [
        Check(name=f"boost {inputs['version']} headers",
              script=sh("grep", "-qx", wanted, header)),
        Check(name=f"boost {inputs['version']} libraries (system, filesystem, thread, chrono)",
              script=smoke.links(*(sh(lib) for lib in libs))),
    ]


STAGE = Stage(
    name="boost",
    doc=__doc__ or "",
    deps=("base",),
    fields={
        **url_fields(
            url="https://sourceforge.net/projects/boost/files/boost/{version}/"
                "boost_{version_underscored}.tar.gz/download",
            what="Boost"),
        "prefix": Field(kind="path", default="/opt/conda", help="install prefix"),
        "b2_args": Field(kind="args", default=["threading=multi", "cxxflags=-fPIC", "cflags=-fPIC"],
                         help="b2 arguments"),
    },
    sources=sources,
    recipe=recipe,
    checks=checks,
)

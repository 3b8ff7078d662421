"""Small builders for Dockerfile text, so stage modules never hand-format quoting."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping


def sh(*words: str) -> str:
    """A shell command line with every word quoted where needed."""
    return shlex.join(words)


def run(*commands: str, mounts: Iterable[str] = ()) -> str:
    """One RUN instruction chaining `commands` with && (each on its own line)."""
    prefix = "".join(f"--mount={m} " for m in mounts)
    body = " \\\n    && ".join(commands)
    return f"RUN {prefix}\\\n    {body}" if prefix else f"RUN {body}"


def bind(context: str, target: str, *, rw: bool = False) -> str:
    """A bind mount of a named build context (a fetched source)."""
    return f"type=bind,from={context},target={target}" + (",rw" if rw else "")


CCACHE_DIR = "/root/.ccache"
# Compiler results kept by BuildKit between builds of a stage, on the build host only:
# cache mounts are never exported into images or artifacts, so they cannot change a key.
CCACHE_MOUNT = f"type=cache,id=imageforge-ccache,target={CCACHE_DIR}"
# Routes gcc/g++ through ccache when the image has it (Debian/Ubuntu's symlink farm).
USE_CCACHE = f'export CCACHE_DIR={CCACHE_DIR} PATH="/usr/lib/ccache:$PATH"'


CA_BUNDLE_SECRET = "ca-bundle"
# The CA bundle of a TLS-intercepting proxy (`invoke build --ca-bundle`), for steps that
# download: a BuildKit secret is mounted for one RUN only and never stored in a layer, and a
# build without one renders the same text (so the same key).
CA_BUNDLE_MOUNT = f"type=secret,id={CA_BUNDLE_SECRET},required=false"
USE_CA_BUNDLE = (f"if [ -s /run/secrets/{CA_BUNDLE_SECRET} ]; then export "
                 f"PIP_CERT=/run/secrets/{CA_BUNDLE_SECRET} "
                 f"SSL_CERT_FILE=/run/secrets/{CA_BUNDLE_SECRET}; fi")
# pip's downloads, kept on the build host between builds like ccache's results.
PIP_CACHE_MOUNT = "type=cache,id=imageforge-pip,target=/root/.cache/pip,sharing=locked"
# pip builds an sdist in a directory of a random name, which the compiler writes into the
# debug information of every extension module: no debug information, the same bytes.
REPRODUCIBLE_C = 'export CFLAGS="${CFLAGS:+$CFLAGS }-g0"'
# ldconfig keeps inode numbers and file times in this cache of its own: nothing reads it but
# ldconfig, which rebuilds it, and it differs in every build.
LDCONFIG = "ldconfig && rm -f /var/cache/ldconfig/aux-cache"


def env_line(variables: Mapping[str, str]) -> str:
    """ENV with double-quoted values; values are validated upstream to hold no quotes,
    backslashes or newlines, and '$' only where the engine itself writes a reference."""
    pairs = " \\\n    ".join(f'{k}="{v}"' for k, v in variables.items())
    return f"ENV {pairs}"


# What apt and dpkg leave behind that differs from one run to the next: the package lists
# (fetched again by every update), apt's binary caches of them (pkgcache.bin differed between
# two builds of the real efa stand-in), and logs stamped with the time of the run. Nothing in
# the image reads them; dpkg's own database (/var/lib/dpkg) stays.
APT_CLEAN = ("rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log "
             "/var/log/alternatives.log /var/cache/ldconfig/aux-cache")


def apt_commands(packages: Iterable[str]) -> list[str]:
    return [
        "apt-get update",
        sh("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y",
           "--no-install-recommends", *sorted(set(packages))),
        APT_CLEAN,
    ]


def apt_install(packages: Iterable[str]) -> str:
    return run(*apt_commands(packages))

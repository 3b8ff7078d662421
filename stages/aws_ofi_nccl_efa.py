"""aws-ofi-nccl with `provider = "efa"`: the plugin the EFA installer ships (1.38 and later), in
place of a build from source.

The installer lays the plugin out under /opt/amazon/ofi-nccl in a directory that differs
between its releases and operating systems (lib/x86_64-linux-gnu, lib, lib64), so the stage
assumes none: it looks for the one NCCL net plugin the installer put under /opt/amazon, proves
that it loads (ldd resolves every dependency, libfabric among them), and exports only a link
to it at `<prefix>/lib/libnccl-net.so`, the name and place NCCL and a source build use. One
plugin on disk, the installer's bytes; no compiler runs. `version` is the plugin release the
installer is expected to ship: the image check compares it with the plugin's own version
string.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from imageforge.stageapi import EXPORT_ROOT, Check, Context, Field, ManifestError, run, sh, smoke

# Where the installer puts everything it installs; the plugin is looked for under it.
INSTALL_ROOT = "/opt/amazon"
# Keys of the source build: with the installer's plugin there is nothing for them to steer.
SOURCE_ONLY = ("repo", "ref", "commit", "url", "sha256", "configure_flags", "apt_packages",
               "build_despite_bundled")

# Added after aws-ofi-nccl artifacts were stored: at its default it stays out of the stage
# key, so every source-built plugin keeps the key it had.
FIELDS = {
    "provider": Field(kind="name", default="source", choices=("source", "efa"),
                      omit_default=True,
                      help="source (built with configure and make) or efa (the plugin the EFA "
                           "installer ships, from 1.38)"),
}


def from_efa(inputs: Mapping[str, Any]) -> bool:
    return str(inputs.get("provider") or "source") == "efa"


def prepare(table: Mapping[str, Any], manifest: Path, defaults: Mapping[str, Any]
            ) -> Mapping[str, Any]:
    """Refuse what the installer's plugin cannot honour, rather than ignore it."""
    if not from_efa(table):
        return table
    version = str(table.get("version"))
    for key in SOURCE_ONLY:
        value, default = table.get(key), defaults.get(key)
        # The defaults were filled in (ref with the version substituted) before this runs.
        if value is None or value is False or value == default or (
                isinstance(default, str) and value == default.replace("{version}", version)):
            continue
        raise ManifestError(f"{manifest}: stages.aws-ofi-nccl.{key} applies only to provider = "
                            "\"source\", and this table has provider = \"efa\" (the EFA "
                            "installer's own plugin); remove the key or change the provider.")
    return table


def recipe(ctx: Context) -> str:
    inputs = ctx.of("aws-ofi-nccl")
    link = f"{EXPORT_ROOT}{inputs['prefix']}/lib/libnccl-net.so"
    efa = str(ctx.of("efa")["version"])
    missing = (f"stages.aws-ofi-nccl.provider = efa: EFA installer {efa} put no single NCCL "
               f"net plugin under {INSTALL_ROOT} (found: $found); use an installer that ships "
               "one (1.38 or later), or provider = source.")
    unresolved = ("stages.aws-ofi-nccl.provider = efa: the EFA installer's plugin $found does "
                  "not load:")
    return run(
        # Every libnccl-net*.so under the install root, links resolved: the installer ships
        # the plugin under one name and links the other to it.
        f"found=$(find {INSTALL_ROOT} -name 'libnccl-net*.so' \\( -type f -o -type l \\) "
        "-exec readlink -f {} + | sort -u)",
        'if [ "$(printf "%s" "$found" | grep -c .)" -ne 1 ]; then '
        f'echo "{missing}" >&2; exit 1; fi',
        f'if ldd "$found" | grep "not found"; then echo "{unresolved}" >&2; exit 1; fi',
        sh("mkdir", "-p", link.rsplit("/", 1)[0]),
        f'ln -s "$found" {sh(link)}',
        'echo "aws-ofi-nccl: the EFA installer\'s plugin is $found"',
    )


# The file a process maps after dlopen("libnccl-net.so") by the loader's own search, as NCCL
# loads its net plugin when NCCL_NET_PLUGIN is unset.
LOADED_PLUGIN = """\
import ctypes, os
ctypes.CDLL("libnccl-net.so")
maps = {l.split(None, 5)[5].strip() for l in open("/proc/self/maps") if len(l.split(None, 5)) == 6}
print(*sorted(p for p in maps if os.path.basename(p).startswith("libnccl-net")))
"""


def checks(ctx: Context) -> list[Check]:
    plugin = f"{ctx.of('aws-ofi-nccl')['prefix']}/lib/libnccl-net.so"
    return [Check(
        name="the plugin NCCL loads is the EFA installer's",
        script="\n".join([
            f"real=$(readlink -f {sh(plugin)})",
            'echo "libnccl-net.so is $real"',
            f'case "$real" in {INSTALL_ROOT}/*) ;; *) echo "not the EFA installer\'s plugin '
            f'(under {INSTALL_ROOT})"; exit 1;; esac',
            # The loader's own answer where the image has a Python to ask it with.
            smoke.FIND_PYTHON,
            'if [ -n "$py" ]; then',
            f'  mapped=$("$py" -c {sh(LOADED_PLUGIN)})',
            '  echo "dlopen(libnccl-net.so) maps $mapped"',
            '  [ "$mapped" = "$real" ] || { echo "the loader finds another plugin"; exit 1; }',
            "fi",
        ]),
    )]

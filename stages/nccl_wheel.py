"""nccl with `provider = "wheel"`: the libnccl of the `nvidia-nccl-cuXX` wheel that the torch
wheel pins, compiled by NVIDIA, in place of a build from source.

`version = "auto"` is required: the lock reads the torch wheel's `Requires-Dist:
nvidia-nccl-cuXX==V` (stages/ncclwheelpin.py) and locks that NCCL wheel of the image's platform
by the sha256 its index publishes (`wheel_url`, `sha256`). The stage unpacks the wheel's
`nvidia/nccl/include` and `lib/libnccl.so.2` into `prefix` laid out as NCCL's own `make install`
does (libnccl.so.V, with libnccl.so.2 and libnccl.so linking to it), so nccl-tests and
aws-ofi-nccl build against it exactly as against a source build, and the pytorch stage links
the wheel's site-packages copy to it: one libnccl on disk, the wheel's bytes, no compiler run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from imageforge.stageapi import (
    EXPORT_ROOT,
    Context,
    Field,
    ManifestError,
    Source,
    UrlSource,
    apt_install,
    bind,
    filename_of,
    run,
    sh,
)

# Where the wheel is bound, and unpacked, while the stage builds.
WHEEL_DIR = "/tmp/nccl-wheel"
TREE = "/tmp/nccl-wheel-tree"
# Keys of the source build: with the wheel's library there is nothing for them to steer.
SOURCE_ONLY = ("repo", "ref", "commit", "static", "only_funcs")

# Keys added after NCCL artifacts were stored: at their defaults they stay out of the stage key,
# so every source-built NCCL keeps the key it had.
FIELDS = {
    "provider": Field(kind="name", default="source", choices=("source", "wheel"),
                      omit_default=True,
                      help='source (built with nvcc) or wheel (the torch wheel\'s NCCL; '
                           'version = "auto")'),
    "wheel_url": Field(kind="url", locked=True, locates="sha256", omit_default=True,
                       help="the nvidia-nccl-cuXX wheel (provider = wheel; lock)"),
    "sha256": Field(kind="sha256", locked=True, omit_default=True,
                    help="sha256 of that wheel (provider = wheel; lock)"),
}


def from_wheel(inputs: Mapping[str, Any]) -> bool:
    return str(inputs.get("provider") or "source") == "wheel"


def prepare(table: Mapping[str, Any], manifest: Path, defaults: Mapping[str, Any]
            ) -> Mapping[str, Any]:
    """Refuse what the wheel provider cannot honour, rather than ignore it."""
    if not from_wheel(table):
        for key in ("wheel_url", "sha256"):
            if table.get(key) is not None:
                raise ManifestError(f"{manifest}: stages.nccl.{key} applies only to provider = "
                                    "\"wheel\", and this table builds NCCL from source; remove "
                                    "the key or set provider = \"wheel\".")
        return table
    for key in SOURCE_ONLY:
        default = defaults[key]
        # The default ref was filled in while the version was still "auto".
        allowed = ({default.replace("{version}", v) for v in ("auto", str(table.get("version")))}
                   if isinstance(default, str) else {default})
        if table.get(key) not in {None, False, *allowed}:
            raise ManifestError(f"{manifest}: stages.nccl.{key} applies only to provider = "
                                "\"source\", and this table has provider = \"wheel\"; remove "
                                "the key or change the provider.")
    if table.get("version") != "auto" and not table.get("sha256"):
        raise ManifestError(f"{manifest}: stages.nccl.provider = \"wheel\" installs the NCCL the "
                            "torch wheel pins, so stages.nccl.version must be \"auto\" (it is "
                            f"{table.get('version')!r}); set version = \"auto\", or provider = "
                            "\"source\" to build another NCCL.")
    return table


def sources(inputs: Mapping[str, Any]) -> Sequence[Source]:
    url = inputs.get("wheel_url")
    if not url:
        return []   # not locked yet: `invoke lock` resolves it with version "auto"
    return [UrlSource(name="src-nccl", url=str(url), sha256=inputs.get("sha256"),
                      filename=filename_of(str(url)))]


def recipe(ctx: Context) -> str:
    inputs = ctx.of("nccl")
    prefix = f"{EXPORT_ROOT}{inputs['prefix']}"
    wheel = f"{WHEEL_DIR}/{filename_of(str(inputs['wheel_url']))}"
    version = str(inputs["version"])
    steps = [apt_install(["python3"])] if ctx.image["apt"] else []
    steps.append(run(
        'if ! command -v python3 >/dev/null; then echo "stages.nccl.provider = wheel unpacks the '
        'wheel with python3: add it to the base image or set [image] apt = true" >&2; exit 1; fi',
        # The source cache checked it already; here the sha256 also enters the stage key.
        f"echo {sh(str(inputs['sha256']) + '  ' + wheel)} | sha256sum -c --quiet",
        sh("python3", "-m", "zipfile", "-e", wheel, TREE),
        sh("mkdir", "-p", f"{prefix}/lib", f"{prefix}/include"),
        sh("cp", "-r", f"{TREE}/nvidia/nccl/include/.", f"{prefix}/include/"),
        sh("mv", f"{TREE}/nvidia/nccl/lib/libnccl.so.2", f"{prefix}/lib/libnccl.so.{version}"),
        sh("ln", "-s", f"libnccl.so.{version}", f"{prefix}/lib/libnccl.so.2"),
        sh("ln", "-s", "libnccl.so.2", f"{prefix}/lib/libnccl.so"),
        f"cp {sh(TREE)}/*.dist-info/licenses/License.txt {sh(prefix + '/LICENSE.txt')}",
        sh("rm", "-rf", TREE),
        mounts=[bind("src-nccl", WHEEL_DIR)],
    ))
    return "\n".join(steps)

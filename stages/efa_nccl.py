"""efa-nccl: the image of seed 000: EFA + NCCL + aws-ofi-nccl + nccl-tests.

Built FROM the efa stage; gathers the other stages' exports and sets the environment
(Open MPI on PATH, libfabric and NCCL on LD_LIBRARY_PATH).

# Examples
`invoke build --target efa-nccl --manifest manifests/efa-nccl.toml`
"""

from __future__ import annotations

from imageforge.stageapi import Context, Stage
from stages.nccl import remove_other_libnccl


def recipe(ctx: Context) -> str:
    # The base's own distro NCCL goes, so the NCCL every process loads is the one the plugin
    # and nccl-tests were built against; ldconfig (run there) refreshes the loader cache so
    # /usr/local/lib entries resolve without LD_LIBRARY_PATH too.
    return remove_other_libnccl(ctx)


STAGE = Stage(
    name="efa-nccl",
    doc=__doc__ or "",
    deps=("efa", "nccl", "aws-ofi-nccl", "nccl-tests"),
    parent="efa",
    image=True,
    tag_template="{name}:efa{efa}-nccl{nccl}-{date}",
    fields={},
    recipe=recipe,
)

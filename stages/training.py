"""training: a PyTorch 2.x training image without SMDDP, as teams build it today.

PyTorch from its wheels (`[stages.pytorch] provider = "wheel"`) on the EFA stage, with the NCCL
the wheel pins, aws-ofi-nccl, nccl-tests and the SageMaker training toolkit: SMDDP's last
release is for PyTorch 2.5.1, so from PyTorch 2.6 on the way to train on EFA is torchrun with
NCCL and aws-ofi-nccl. Built FROM the efa stage; gathers the other stages' exports.

# Examples
`invoke build --target training --manifest manifests/real-pytorch.toml`
"""

from __future__ import annotations

from imageforge.model.stage import Context, Stage
from imageforge.planning.dockerfile import run
from imageforge.sources import piplock
from stages.nccl import remove_other_libnccl
from stages.pytorch_wheel import PYTHON, site_packages


def recipe(ctx: Context) -> str:
    # One NCCL in the image: the base's distro copy goes (the wheel's own file is already a
    # link to the nccl stage's library, stages/pytorch_wheel.py). One dist-info per package,
    # the locked one, so `pip check` reads what is installed. SageMaker's tooling looks for the
    # CA bundle at the RHEL path, as in the seed.
    locked = [p for stage in ("pytorch", "sagemaker-training")
              for p in ctx.of(stage).get(piplock.INPUT) or ()]
    return "\n".join([
        remove_other_libnccl(ctx),
        piplock.drop_stale_dist_info(PYTHON, site_packages(ctx), locked),
        run("mkdir -p /etc/pki/tls/certs",
            "ln -sf /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt"),
    ])


STAGE = Stage(
    name="training",
    doc=__doc__ or "",
    deps=("efa", "python", "nccl", "aws-ofi-nccl", "nccl-tests", "pytorch",
          "sagemaker-training"),
    parent="efa",
    image=True,
    tag_template="{name}:pt{pytorch}-cu{cuda_nodot}-py{python_nodot}-efa{efa}-{date}",
    fields={},
    recipe=recipe,
)

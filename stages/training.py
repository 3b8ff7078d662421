"""training: a PyTorch 2.x training image without SMDDP, as teams build it today.

PyTorch from its wheels (`[stages.pytorch] provider = "wheel"`) on the EFA stage, with the NCCL
the wheel pins, aws-ofi-nccl, nccl-tests and the SageMaker training toolkit: SMDDP's last
release is for PyTorch 2.5.1, so from PyTorch 2.6 on the way to train on EFA is torchrun with
NCCL and aws-ofi-nccl. Built FROM the efa stage; gathers the other stages' exports.

# Examples
`invoke build --target training --manifest manifests/real-pytorch.toml`
"""

from __future__ import annotations

from collections.abc import Sequence

from imageforge.stageapi import Check, Context, Stage, pipinstall, piplock, run, sh, smoke
from stages.nccl import remove_other_libnccl
from stages.pytorch_wheel import PYTHON, loaded_nccl, site_packages


def recipe(ctx: Context) -> str:
    # One NCCL in the image: the base's distro copy goes (the wheel's own file is already a
    # link to the nccl stage's library, stages/pytorch_wheel.py). One dist-info per package,
    # the locked one, so `pip check` reads what is installed. SageMaker's tooling looks for the
    # CA bundle at the RHEL path, as in the seed.
    locked = [p for stage in ("pytorch", "sagemaker-training")
              for p in ctx.of(stage).get(piplock.INPUT) or ()]
    return "\n".join([
        remove_other_libnccl(ctx),
        pipinstall.drop_stale_dist_info(PYTHON, site_packages(ctx), locked),
        run("mkdir -p /etc/pki/tls/certs",
            "ln -sf /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt"),
    ])


def checks(ctx: Context) -> Sequence[Check]:
    """torch, nccl-tests and the plugin meet in one libnccl: the one torch's own check
    (stages/pytorch_wheel.py) requires."""
    library = loaded_nccl(ctx)
    perf = f"{ctx.of('nccl-tests')['prefix']}/bin/all_reduce_perf"
    plugin = f"{ctx.of('aws-ofi-nccl')['prefix']}/lib/libnccl-net.so"
    major, minor, patch = (int(x) for x in str(ctx.of("nccl")["version"]).split("."))
    code = major * 10000 + minor * 100 + patch
    beside_torch = ("import sys, ctypes, torch; ctypes.CDLL(sys.argv[1]); "
                    "print('dlopen ok beside torch:', sys.argv[1])")
    return [
        Check(name="nccl-tests load the libnccl torch loads",
              script=smoke.links_to(perf, library)),
        Check(name="the plugin dlopens in a process that imported torch",
              script=sh(PYTHON, "-c", beside_torch, plugin)),
        # nccl-tests print the library's ncclGetVersion only once a GPU is initialised.
        Check(name="nccl-tests' nccl-library is the pin", needs="gpu",
              script=(f"set -o pipefail\n{sh(perf)} -b 8 -e 8 -g 1 | tee /tmp/perf.log\n"
                      f"grep -q 'nccl-library={code}' /tmp/perf.log || "
                      f"{{ echo 'nccl-tests report another NCCL than {code}'; exit 1; }}")),
    ]


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
    checks=checks,
)

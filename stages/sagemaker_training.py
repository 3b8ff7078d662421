"""sagemaker-training: the SageMaker training toolkit, what `docker run IMAGE train` starts.

SageMaker runs a training image with the single argument `train`. The toolkit's `train`
entry point reads /opt/ml/input/config/{hyperparameters,resourceconfig,inputdataconfig}.json
and hands over to the framework package SAGEMAKER_TRAINING_MODULE names (seed 002:
sagemaker-pytorch-training), which runs the user's program (SAGEMAKER_PROGRAM) with the
hyperparameters as arguments; what the program writes to /opt/ml/model is the model.

Both packages come from PyPI at build time: `invoke lock` resolves them with every dependency
to exact versions and sha256 hashes, and pip installs that set with --require-hashes. A build
behind a TLS-intercepting proxy needs that proxy's CA: `invoke build --ca-bundle FILE` hands
one to this step as a BuildKit secret, so it reaches neither a layer nor the stage key.
Downloads are kept in a BuildKit cache mount on the build host, so a rebuild does not fetch
them again.

# Parameters
version: sagemaker-training version.
policy: versions `invoke lock --upgrade` (and the nightly) may move it to, read from PyPI.
packages: pip requirements installed with it (seed: the PyTorch container package).
module: the framework entry point `train` runs (SAGEMAKER_TRAINING_MODULE).

# Examples
```toml
[stages.sagemaker-training]
version = "5.1.4"
packages = ["sagemaker-pytorch-training==3.0.0"]
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from imageforge.stageapi import EXPORT_ROOT, POLICY, Check, Context, Field, Stage, pipinstall, sh

PREFIX = "/opt/conda"


def requirements(ctx: Context) -> list[str]:
    inputs = ctx.of("sagemaker-training")
    return [f"sagemaker-training=={inputs['version']}", *inputs["packages"]]


def recipe(ctx: Context) -> str:
    # --prefix installs into /out only what the Python stage does not already have, so the
    # image copies the toolkit onto it without a second copy of numpy & co.
    return "\n".join(pipinstall.install(
        "sagemaker-training", ctx.of("sagemaker-training"), requirements(ctx),
        f"{PREFIX}/bin/pip", f"--prefix={EXPORT_ROOT}{PREFIX}",
        then=[sh("test", "-x", f"{EXPORT_ROOT}{PREFIX}/bin/train")]))


def env(ctx: Context) -> Mapping[str, str]:
    return {"SAGEMAKER_TRAINING_MODULE": str(ctx.of("sagemaker-training")["module"])}


def checks(ctx: Context) -> Sequence[Check]:
    inputs = ctx.of("sagemaker-training")
    version = str(inputs["version"])
    module = str(inputs["module"]).split(":", 1)[0]
    return [
        Check(name=f"sagemaker-training {version} provides `train`",
              script=f"{PREFIX}/bin/pip show sagemaker-training | grep -qx "
                     f"{sh('Version: ' + version)} && [ \"$(command -v train)\" = "
                     f"{PREFIX}/bin/train ]"),
        Check(name=f"SAGEMAKER_TRAINING_MODULE ({module}) imports",
              script=f"[ \"${{SAGEMAKER_TRAINING_MODULE%%:*}}\" = {sh(module)} ] && "
                     f"{PREFIX}/bin/python -c {sh('import ' + module)}"),
    ]


STAGE = Stage(
    name="sagemaker-training",
    doc=__doc__ or "",
    deps=("python",),
    parent="python",
    fields={
        "version": Field(kind="version", default="5.1.4", help="sagemaker-training version"),
        "policy": POLICY,
        "packages": Field(kind="packages", default=["sagemaker-pytorch-training==3.0.0"],
                          help="pip requirements installed with the toolkit"),
        "module": Field(kind="entry_point", default="sagemaker_pytorch_container.training:main",
                        help="SAGEMAKER_TRAINING_MODULE: the framework entry point `train` runs"),
    },
    recipe=recipe,
    env=env,
    checks=checks,
    pypi_project="sagemaker-training",
    pip_requirements=requirements,
)

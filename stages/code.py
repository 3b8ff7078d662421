"""code: the user's training code on top of the SMDDP image, the last and cheapest stage.

Like the seed's `COPY cifar10.py /opt/ml/code/`: the directory is copied to /opt/ml/code and
SAGEMAKER_PROGRAM names the script, so `docker run IMAGE train` runs it with the job's
hyperparameters. The stage key is the content of the directory, so editing the code rebuilds
this stage only. `invoke build --code DIR --program train.py` sets both keys from the
command line.

# Parameters
dir: the directory holding the training code (relative to the manifest file).
program: the script SageMaker runs, relative to `dir`.

# Examples
```toml
[stages.code]
dir = "../examples/train"
program = "train.py"
```
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from imageforge.stageapi import Check, Context, Field, ManifestError, Stage, sh, tree_digest

CODE_DIR = "/opt/ml/code"
CONTEXT = "src-code"


def prepare(table: Mapping[str, Any], manifest: Path) -> Mapping[str, Any]:
    """stages.code.dir made absolute (relative to the manifest file) and the digest of the
    code added: what the plan keys."""
    where = f"{manifest}: stages.code"
    root = Path(os.path.expanduser(str(table["dir"])))
    if not root.is_absolute():
        root = manifest.parent / root
    root = root.resolve()
    if not root.is_dir():
        raise ManifestError(f"{where}.dir: {root} is not a directory; point it (or --code) at "
                            "the directory holding the training code.")
    program = str(table["program"])
    if not (root / program).is_file():
        raise ManifestError(f"{where}.program: {program} is not a file in {root}; name the "
                            "script SageMaker should run, relative to the code directory.")
    return {**table, "dir": str(root), "digest": tree_digest(root)}


def recipe(_ctx: Context) -> str:
    return f"COPY --from={CONTEXT} . {CODE_DIR}/"


def env(ctx: Context) -> Mapping[str, str]:
    return {"SAGEMAKER_PROGRAM": str(ctx.of("code")["program"]),
            "SAGEMAKER_SUBMIT_DIRECTORY": CODE_DIR}


def local_dirs(ctx: Context) -> Mapping[str, tuple[str, str]]:
    inputs = ctx.of("code")
    return {CONTEXT: (str(inputs["dir"]), str(inputs["digest"]))}


def checks(ctx: Context) -> Sequence[Check]:
    program = str(ctx.of("code")["program"])
    return [Check(name=f"the training program {program} is in {CODE_DIR}",
                  script=f'[ "$SAGEMAKER_PROGRAM" = {sh(program)} ] && '
                         f"test -f {sh(f'{CODE_DIR}/{program}')}")]


STAGE = Stage(
    name="code",
    doc=__doc__ or "",
    deps=("smddp",),
    parent="smddp",
    image=True,
    fields={
        "version": Field(kind="version", help="a name for this revision of the code (labels)"),
        # Where the code is does not matter to the image; what it holds does (digest).
        "dir": Field(kind="host_path", required=True, keyed=False,
                     help="directory of the training code (relative to the manifest)"),
        "program": Field(kind="file_name", required=True,
                         help="the script SageMaker runs, relative to dir"),
        "digest": Field(kind="digest", locked=True,
                        help="sha256 of the code (computed when the manifest is read)"),
    },
    prepare=prepare,
    recipe=recipe,
    env=env,
    local_dirs=local_dirs,
    takes_code=True,
    checks=checks,
    locked=False,
)

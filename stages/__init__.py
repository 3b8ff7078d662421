"""The stage registry: one module per stage, each exporting `STAGE`.

The engine only iterates this mapping; adding a stage means adding a module and a line here.
"""

from __future__ import annotations

from typing import Final

from imageforge.stage import Stage
from stages import (
    aws_ofi_nccl,
    base,
    boost,
    code,
    efa,
    efa_nccl,
    nccl,
    nccl_tests,
    python,
    pytorch,
    sagemaker_training,
    smddp,
    torchvision,
)

STAGES: Final[dict[str, Stage]] = {
    module.STAGE.name: module.STAGE
    for module in (base, python, efa, nccl, aws_ofi_nccl, nccl_tests, pytorch, torchvision,
                   boost, sagemaker_training, smddp, code, efa_nccl)
}

"""The stage registry: one module per stage, each exporting `STAGE`.

The engine only iterates this mapping. imageforge's own stages are listed here; a team adds
its own without editing imageforge by putting stage modules in a directory named in
invoke.yaml (`imageforge.stage_dirs`): `discover` loads every `*.py` there that exports a
`STAGE`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from imageforge.stageapi import Stage, UsageError, escaped
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
    training,
)

STAGES: Final[dict[str, Stage]] = {
    module.STAGE.name: module.STAGE
    for module in (base, python, efa, nccl, aws_ofi_nccl, nccl_tests, pytorch, torchvision,
                   boost, sagemaker_training, smddp, code, efa_nccl, training)
}


def discover(directories: Sequence[Path]) -> Mapping[str, Stage]:
    """imageforge's stages plus every stage module in `directories` (resolved once per
    process and set of directories)."""
    return _discover(tuple(Path(d).resolve() for d in directories))


@functools.cache
def _discover(directories: tuple[Path, ...]) -> Mapping[str, Stage]:
    registry = dict(STAGES)
    where = {name: "imageforge's stages/" for name in registry}
    for directory in directories:
        if not directory.is_dir():
            raise UsageError(f"imageforge.stage_dirs: {escaped(str(directory), None)} is not a "
                             "directory; create it or remove it from invoke.yaml.")
        for path in sorted(directory.glob("*.py")):
            if path.name.startswith("_"):
                continue
            stage = _load(path)
            if stage.name in where:
                raise UsageError(f"{escaped(str(path), None)}: stage {stage.name!r} is already "
                                 f"defined in {where[stage.name]}; give yours another name.")
            registry[stage.name] = stage
            where[stage.name] = str(path)
    for name, stage in registry.items():
        if not stage.reproducible and not stage.reproducible_reason.strip():
            raise UsageError(f"{where[name]}: stage {name!r} says reproducible=False without "
                             "a reason; set reproducible_reason to what differs between "
                             "builds and why it cannot be helped.")
        unknown = [d for d in (*stage.deps, *([stage.parent] if stage.parent else []))
                   if d not in registry]
        if unknown:
            raise UsageError(f"{where[name]}: stage {name!r} needs {', '.join(unknown)}, "
                             "which no stage module defines.")
    return registry


def _load(path: Path) -> Stage:
    # A name of its own per file, so two teams' gdrcopy.py never share a module.
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    name = f"imageforge_team_stages.{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{path}: cannot be loaded as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # a team's module: any error is theirs to fix
        del sys.modules[name]
        raise UsageError(f"{path}: loading the stage module failed: "
                         f"{type(error).__name__}: {error}") from None
    stage = getattr(module, "STAGE", None)
    if not isinstance(stage, Stage):
        raise UsageError(f"{path}: a stage module must define STAGE = Stage(...); "
                         "this one does not.")
    return stage

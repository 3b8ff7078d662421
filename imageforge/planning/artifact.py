"""What a stage's artifact is: the whole image of a stage others are built FROM (and of an
image), the exports of every other stage. The exports-only artifact is made by Dockerfile text
of its own, which the stage's key covers (plan.py): how an artifact is made is part of what a
key stands for, same key, same bytes."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping

from imageforge.model.stage import Stage

ARTIFACT_PREFIX = "imageforge-artifact-"
# An exports-only artifact clamps its file times in a build step, not with BuildKit's
# rewrite-timestamp, which re-tars every layer at 14-20 MB/s here: 21 s of a 28 s bake for the
# sample's sagemaker-training (300 MB, 10,869 files), where a copy and a touch take 6 s.
CLAMP_PREFIX = "imageforge-clamp-"
EXPORT_DIR = "/imageforge-export"


def full_artifact_stages(registry: Mapping[str, Stage]) -> set[str]:
    """Stages whose artifact must be the whole image: those others are built FROM, and
    images. Every other stage's artifact holds only its exports (a FROM scratch image)."""
    return {s.parent for s in registry.values() if s.parent} | {
        name for name, s in registry.items() if s.image}


def exports_block(name: str, exports: Iterable[str]) -> str:
    """The Dockerfile of `name`'s exports-only artifact: its exports on scratch, every file
    time newer than SOURCE_DATE_EPOCH clamped to it. They are copied with their parent
    directories (`cp --parents`) and the tree is copied whole, because a directory that COPY
    creates for a destination path gets the build's time."""
    paths = " ".join(shlex.quote(path.rstrip("/") or "/") for path in exports)
    if not paths:
        return f"FROM scratch AS {ARTIFACT_PREFIX}{name}\n"
    epoch = '"@${SOURCE_DATE_EPOCH}"'
    return (f"FROM {name} AS {CLAMP_PREFIX}{name}\n"
            "ARG SOURCE_DATE_EPOCH\n"
            "USER root\n"
            f"RUN --network=none mkdir {EXPORT_DIR} && cp -a --parents {paths} {EXPORT_DIR}/ \\\n"
            f"    && find {EXPORT_DIR} -newermt {epoch} -exec touch -h -d {epoch} {{}} +\n"
            f"FROM scratch AS {ARTIFACT_PREFIX}{name}\n"
            f"COPY --from={CLAMP_PREFIX}{name} {EXPORT_DIR}/ /\n")

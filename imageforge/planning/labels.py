"""The labels and tag of a built image: what it is made of, its revision and its lock."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

from imageforge.cmd import run
from imageforge.docker import LABEL_PREFIX
from imageforge.errors import FatalError
from imageforge.planning import rules
from imageforge.planning.plan import Plan
from imageforge.sources.lockfile import Lock


def default_tag(planned: Plan) -> str:
    name = planned.manifest.image.get("name") or planned.target
    return f"imageforge/{name}:{planned.target}-{planned.key[7:19]}"


def project_revision() -> str:
    """The git revision of the imageforge checkout that renders the recipes."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = run(["git", "-C", str(root), "rev-parse", "HEAD"], text=True, timeout=10)
    except (FatalError, subprocess.TimeoutExpired):     # no git, or a hung file system
        return "unknown"
    return head.stdout.strip() if head.returncode == 0 else "unknown"


def image_metadata(planned: Plan, current: tuple[Lock, str] | None,
                   revision: str | None = None) -> dict[str, str]:
    """The labels of the final image, given the current lock and its file's sha256 (None when
    the lock is not current); its creation date is the lock's (the config's own is
    buildkit's fixed SOURCE_DATE_EPOCH, planning/execute.py)."""
    values = labels(planned)
    values[f"{LABEL_PREFIX}.revision"] = revision or project_revision()
    values["org.opencontainers.image.revision"] = values[f"{LABEL_PREFIX}.revision"]
    epoch = None
    if current is not None:
        found, digest = current
        values[f"{LABEL_PREFIX}.lock-digest"] = digest
        epoch = found.source_date_epoch
    if epoch is not None:
        values["org.opencontainers.image.created"] = datetime.fromtimestamp(
            epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return values


def labels(planned: Plan) -> dict[str, str]:
    """OCI labels: what the image is made of. Never secrets: labels are public."""
    values = {
        "org.opencontainers.image.title": planned.target,
        f"{LABEL_PREFIX}.target": planned.target,
        f"{LABEL_PREFIX}.manifest": planned.manifest.path.name,
        f"{LABEL_PREFIX}.manifest-digest": planned.manifest.digest(),
        f"{LABEL_PREFIX}.base": str(planned.manifest.image["base"]),
    }
    for stage in planned.stages:
        values[f"{LABEL_PREFIX}.key.{stage.name}"] = stage.key
        if stage.inputs.get("version"):
            values[f"{LABEL_PREFIX}.version.{stage.name}"] = str(stage.inputs["version"])
    return values | rules.labels(planned.manifest, registry=planned.registry)

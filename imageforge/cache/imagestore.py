"""Full-image artifacts kept in a Docker engine's own image store, by key.

A stage that others are built FROM, or an image, is the whole image: exporting it again as an
OCI layout copies every layer of its base a second time (seconds per stage). On an engine
with an image store BuildKit names it `imageforge-artifact/<store>/<stage>:<keyhex>` instead,
where
the layers already are, and the artifact store records that name and the image's digest.

Verifiable: the engine's ID of an image is the digest of its manifest (containerd checks
every blob against its digest on ingest), so an entry whose name is gone or points at other
content is rebuilt, never used.
"""

from __future__ import annotations

import contextlib
import dataclasses

from imageforge import engineapi
from imageforge.cmd import docker

REPOSITORY = "imageforge-artifact"


def artifact_ref(namespace: str, stage: str, key: str) -> str:
    """The name of an artifact of one store: each cache directory has its own `namespace`,
    so two of them on one engine never take each other's names."""
    return f"{REPOSITORY}/{namespace}/{stage}:{key.removeprefix('sha256:')}"


@dataclasses.dataclass(frozen=True)
class ImageStore:
    """One Docker engine's image store: `context` is a docker context (None: the engine the
    docker CLI talks to, DOCKER_CONTEXT included)."""

    context: str | None = None

    def _docker(self, *args: str) -> list[str]:
        return ["--context", self.context, *args] if self.context else list(args)

    def ids(self, namespace: str) -> dict[str, str]:
        """Every artifact image of one store the engine holds: name -> image ID (one
        question for all, through the engine's API when it is the local one)."""
        reference = f"{REPOSITORY}/{namespace}/*:*"
        if self.context is None:
            with contextlib.suppress(engineapi.Unreachable), engineapi.Engine() as engine:
                return engine.images(reference)
        found = docker(*self._docker("image", "ls", "--no-trunc", "--filter",
                                     f"reference={reference}", "--format",
                                     "{{.Repository}}:{{.Tag}} {{.ID}}"), timeout=60)
        if found.returncode != 0:
            return {}
        pairs = (line.split() for line in found.stdout.decode().splitlines())
        return {p[0]: p[1] for p in pairs if len(p) == 2}

    def sizes(self, refs: list[str]) -> dict[str, tuple[str, int]]:
        """ID and size of each of `refs` (all just built, so all present)."""
        if not refs:
            return {}
        if self.context is None:
            with contextlib.suppress(engineapi.Unreachable), engineapi.Engine() as engine:
                inspected = {ref: engine.image(ref) for ref in refs}
                return {ref: (str(data["Id"]), int(data["Size"]))
                        for ref, data in inspected.items() if data}
        found = docker(*self._docker("image", "inspect", "--format", "{{.Id}} {{.Size}}",
                                     *refs), timeout=60)
        if found.returncode != 0:
            return {}   # one is missing: the lines would not line up with `refs`
        lines = found.stdout.decode().split("\n")
        result: dict[str, tuple[str, int]] = {}
        for ref, line in zip(refs, lines, strict=False):
            image_id, _, size = line.partition(" ")
            if image_id.startswith("sha256:") and size.isdigit():
                result[ref] = (image_id, int(size))
        return result

    def remove(self, ref: str) -> None:
        """Untag `ref` (its layers stay while anything else uses them); a name already gone
        is fine."""
        docker(*self._docker("image", "rm", ref), timeout=60)

"""Which steps a BuildKit build ran and which it took from its cache, from the status
stream of `docker buildx build --progress rawjson`."""

from __future__ import annotations

import dataclasses
import io
import re
from collections.abc import Iterable
from typing import Any

from imageforge.buildkit.progress import read_statuses

# "[stage-0  3/11] RUN ...", "[ 3/11] RUN ...", "[nccl 2/3] COPY ...": BuildKit pads the step
# number to the width of the total.
_STEP = re.compile(r"^\[(?:[^\]]*\s)?(?P<step>\d+)/(?P<total>\d+)\]\s+(?P<kind>[A-Z]+)\b")

# Steps that make a layer; FROM only resolves the base, which BuildKit never marks cached.
LAYER_KINDS = ("RUN", "COPY", "ADD")


@dataclasses.dataclass
class Step:
    digest: str
    name: str
    step: int
    total: int
    kind: str
    cached: bool = False
    completed: bool = False
    error: str | None = None

    @property
    def rebuilt(self) -> bool:
        """The step ran: completed, not from the cache."""
        return self.completed and not self.cached and self.error is None


def parse_stream(data: bytes) -> list[dict[str, Any]]:
    """The status objects of a rawjson stream (other lines are dropped)."""
    other: list[str] = []
    return list(read_statuses(io.BytesIO(data), other))


def steps(statuses: Iterable[dict[str, Any]]) -> list[Step]:
    """Every numbered step, merged over the repeated reports of one vertex, in step order.

    A vertex is reported several times (started, progress, completed); "cached" and
    "completed" appear on some reports only, so they are or-ed together."""
    found: dict[str, Step] = {}
    for status in statuses:
        for vertex in status.get("vertexes") or []:
            match = _STEP.match(str(vertex.get("name", "")))
            if match is None:
                continue
            digest = str(vertex.get("digest", ""))
            step = found.get(digest)
            if step is None:
                step = Step(digest=digest, name=str(vertex["name"]), step=int(match["step"]),
                            total=int(match["total"]), kind=match["kind"])
                found[digest] = step
            step.cached = step.cached or bool(vertex.get("cached"))
            step.completed = step.completed or bool(vertex.get("completed"))
            step.error = vertex.get("error") or step.error
    return sorted(found.values(), key=lambda s: (s.step, s.name))


def layer_steps(statuses: Iterable[dict[str, Any]]) -> list[Step]:
    """The RUN/COPY/ADD steps of a build."""
    return [s for s in steps(statuses) if s.kind in LAYER_KINDS]


def count_rebuilt(statuses: Iterable[dict[str, Any]]) -> tuple[int, int]:
    """(layer steps BuildKit ran, layer steps in the build)."""
    layers = layer_steps(statuses)
    return sum(1 for s in layers if s.rebuilt), len(layers)

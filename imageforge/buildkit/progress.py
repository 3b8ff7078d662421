"""Per-stage progress of a BuildKit build, read from `docker buildx build --progress rawjson`.

BuildKit reports vertices named like "[nccl 2/3] RUN ..."; we fold them into one state per
stage. Three views: a live rich table on a terminal, plain lines (CI, pipes, --progress
plain) and JSON lines (--progress json).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import json
import re
import sys
import time
from collections.abc import Collection, Iterable
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from rich.live import Live
    from rich.table import Table

State = Literal["waiting", "building", "cached", "remote", "built", "failed"]
Mode = Literal["auto", "plain", "json", "tty"]

# "[nccl 2/3] RUN ..." from build; "[image nccl 2/3] RUN ..." from bake (target first).
# BuildKit pads the step number once a stage has ten or more steps: "[smddp  4/10]".
_VERTEX = re.compile(
    r"^\[(?:[a-z0-9._-]+ )?(?P<stage>[a-z0-9][a-z0-9._-]*) +(?P<step>\d+)/\d+\]")
_FRACTION = re.compile(r"(\.\d{6})\d+")


def _time(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.fromisoformat(_FRACTION.sub(r"\1", stamp.replace("Z", "+00:00"))).timestamp()


@dataclasses.dataclass
class _Vertex:
    stage: str
    name: str
    step: int
    started: float | None = None
    completed: float | None = None
    cached: bool = False
    error: str | None = None

    @property
    def is_from(self) -> bool:
        return "] FROM " in self.name


@dataclasses.dataclass
class StageProgress:
    name: str
    vertices: dict[str, _Vertex] = dataclasses.field(default_factory=dict)
    # Set when the build succeeded: a stage BuildKit never reported had nothing to do.
    succeeded: bool = False
    # Stages that come from the artifact cache: BuildKit only reads them.
    reused: State | None = None
    log: collections.deque[str] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=40))

    @property
    def state(self) -> State:
        if self.reused is not None:
            return self.reused
        vs = list(self.vertices.values())
        # Bake runs a step shared by several targets once and cancels the other copies:
        # "context canceled" is not the step failing.
        if any(v.error and not _cancelled(v.error) for v in vs):
            return "failed"
        if not vs or all(v.started is None for v in vs):
            return "cached" if self.succeeded else "waiting"
        if any(v.completed is None for v in vs):
            return "building"
        # BuildKit never marks a FROM as cached; it builds nothing, so it does not count.
        work = [v for v in vs if not v.is_from]
        return "cached" if all(v.cached for v in work) else "built"

    @property
    def steps(self) -> tuple[int, int]:
        """(steps run, steps) of the stage's own work in this build: a step BuildKit served
        from its layer cache did not run. Bake reports a step once per target that reaches
        it, so steps count by number. FROM lines build nothing and are not counted."""
        work = [v for v in self.vertices.values() if not v.is_from]
        ran = {v.step for v in work if v.started is not None and not v.cached}
        return len(ran), len({v.step for v in work})

    @property
    def seconds(self) -> float:
        """Time the stage's own steps ran (not time spent waiting for its dependencies)."""
        now = time.time()
        return sum((v.completed or now) - v.started for v in self.vertices.values()
                   if v.started is not None)

    @property
    def error(self) -> str | None:
        errors = [v.error for v in self.vertices.values() if v.error]
        return next((e for e in errors if not _cancelled(e)), errors[0] if errors else None)


class BuildProgress:
    """Consumes rawjson status objects; shows and remembers per-stage state."""

    def __init__(self, stages: Iterable[str], mode: Mode = "auto",
                 out: IO[str] | None = None) -> None:
        self.out = out or sys.stderr
        self.stages = {name: StageProgress(name) for name in stages}
        self._by_digest: dict[str, _Vertex] = {}
        self._shown: dict[str, State] = {}
        self.mode: Mode = _pick_mode(mode, self.out)
        self._live: Live | None = None
        self._started = time.time()
        # BuildKit's export steps (layers, images, OCI layouts): (started, completed).
        self._exports: dict[str, tuple[float | None, float | None]] = {}

    def __enter__(self) -> BuildProgress:
        if self.mode == "tty":
            # rich only on a terminal: CI and pipes never pay for its import.
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._table(), console=Console(file=self.out), refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.__exit__(None, None, None)

    def feed(self, status: dict[str, Any]) -> None:
        for raw in status.get("vertexes") or []:
            self._vertex(raw)
        for raw in status.get("logs") or []:
            vertex = self._by_digest.get(raw.get("vertex", ""))
            if vertex is not None:
                text = base64.b64decode(raw.get("data") or b"").decode(errors="replace")
                self.stages[vertex.stage].log.extend(text.splitlines())
        self._show()

    def preset(self, name: str, state: State) -> None:
        """Mark a stage that comes from the artifact cache."""
        self.stages[name].reused = state

    def forget_errors(self) -> None:
        """A bake runs again: the errors of its earlier attempt no longer hold."""
        for vertex in self._by_digest.values():
            vertex.error = None

    def succeeded(self, names: Collection[str] | None = None) -> None:
        """A bake finished without error: settle its stages (`names`, or every stage) and
        show their final states. Bake reports a step shared by several targets once per
        target but completes it once; the copies that never completed did no work of their
        own."""
        for stage in self.stages.values():
            if names is not None and stage.name not in names:
                continue
            stage.succeeded = True
            for vertex in stage.vertices.values():
                if vertex.completed is None:
                    vertex.completed = vertex.started or time.time()
                    vertex.cached = True
        self._show()

    @property
    def export_seconds(self) -> float:
        """Wall time during which BuildKit was exporting (overlapping exports once)."""
        spans = sorted((a, b) for a, b in self._exports.values() if a is not None and b)
        total, reached = 0.0, float("-inf")
        for started, completed in spans:
            if completed > reached:
                total += completed - max(started, reached)
                reached = completed
        return total

    def _vertex(self, raw: dict[str, Any]) -> None:
        name = raw.get("name", "")
        if "exporting " in name:
            old = self._exports.get(raw["digest"], (None, None))
            self._exports[raw["digest"]] = (_time(raw.get("started")) or old[0],
                                            _time(raw.get("completed")) or old[1])
            return
        match = _VERTEX.match(name)
        if match is None or match.group("stage") not in self.stages:
            return
        digest = raw["digest"]
        vertex = self._by_digest.get(digest)
        if vertex is None:
            vertex = _Vertex(stage=match.group("stage"), name=raw["name"],
                             step=int(match.group("step")))
            self._by_digest[digest] = vertex
            self.stages[vertex.stage].vertices[digest] = vertex
        vertex.started = _time(raw.get("started")) or vertex.started
        vertex.completed = _time(raw.get("completed")) or vertex.completed
        vertex.cached = bool(raw.get("cached")) or vertex.cached
        vertex.error = raw.get("error") or vertex.error

    def _show(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
            return
        for stage in self.stages.values():
            state = stage.state
            if self._shown.get(stage.name, "waiting") == state:
                continue
            self._shown[stage.name] = state
            self._emit(stage, state)

    def _emit(self, stage: StageProgress, state: State) -> None:
        if self.mode == "json":
            event = {"event": "stage", "stage": stage.name, "state": state,
                     "seconds": round(stage.seconds, 2)}
            print(json.dumps(event), file=self.out, flush=True)
        else:
            elapsed = time.time() - self._started
            print(f"[{elapsed:7.1f}s] {stage.name:<18} {state}"
                  + (f" ({stage.seconds:.1f}s)" if state in ("built", "failed") else ""),
                  file=self.out, flush=True)

    def _table(self) -> Table:
        from rich.table import Table

        table = Table(title="imageforge build", expand=False)
        for column in ("stage", "state", "seconds"):
            table.add_column(column)
        colours = {"waiting": "dim", "building": "yellow", "cached": "green", "remote": "green",
                   "built": "cyan", "failed": "red"}
        for stage in self.stages.values():
            state = stage.state
            table.add_row(stage.name, f"[{colours[state]}]{state}[/]", f"{stage.seconds:.1f}")
        return table


def _cancelled(error: str) -> bool:
    return "context canceled" in error


def _pick_mode(mode: Mode, out: IO[str]) -> Mode:
    if mode != "auto":
        return mode
    import os

    if os.environ.get("CI") or not out.isatty():
        return "plain"
    return "tty"


def read_statuses(stream: IO[bytes], other: list[str]) -> Iterable[dict[str, Any]]:
    """JSON objects from a rawjson stream; other lines (warnings, the final error) go to
    `other`."""
    decoder = json.JSONDecoder()
    buffer = ""
    for chunk in iter(stream.readline, b""):
        buffer += chunk.decode(errors="replace")
        while buffer:
            stripped = buffer.lstrip()
            if not stripped:
                buffer = ""
                break
            if not stripped.startswith("{"):
                newline = stripped.find("\n")
                if newline < 0:
                    buffer = stripped
                    break
                other.append(stripped[:newline])
                buffer = stripped[newline + 1:]
                continue
            try:
                obj, end = decoder.raw_decode(stripped)
            except json.JSONDecodeError:
                buffer = stripped
                break
            buffer = stripped[end:]
            if isinstance(obj, dict):
                yield obj
    if buffer.strip():
        other.append(buffer.strip())

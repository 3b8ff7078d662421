"""What a build was asked to do and what it did: options, per-stage results."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from imageforge.buildkit.progress import Mode


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildOptions:
    target: str
    tag: str | None = None
    push: bool = False
    builder: str | None = None
    progress: Mode = "auto"
    dry_run: bool = False
    # The CA bundle of a TLS-intercepting proxy, for build steps that download (a secret).
    ca_bundle: Path | None = None
    # The target's key a generated CI job was made for: any other key is refused unbuilt.
    expect_key: str | None = None
    # Build from nothing (verify --image): BuildKit's layer cache off, cache mounts of its own.
    no_cache: bool = False
    # The imageforge revision the image's labels name (verify --image: the one being checked).
    revision: str | None = None
    # build --output: every exported stage must be in the artifact cache when the build ends
    # (export reads each one's files), so one whose artifact is gone is built again here, not
    # named as missing afterwards.
    exports: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageResult:
    name: str
    key: str
    state: str
    seconds: float
    # Of the stage's own BuildKit steps in this build, how many ran (the rest came from
    # BuildKit's layer cache); 0 of 0 for a stage that came from the artifact cache.
    steps_run: int = 0
    steps: int = 0


class Clock:
    """Where a build's time goes: each lap adds the time since the previous one to a phase
    (plan, fetch, render, bake, store, push, report; export is BuildKit's share of bake)."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = round(self.phases.get(phase, 0.0) + now - self._last, 3)
        self._last = now


@dataclasses.dataclass(frozen=True, kw_only=True)
class UpToDate:
    """What the same build asks next time, when this one left everything up to date
    (imageforge/uptodate.py): the images whose IDs must not change, the artifact entries
    that must still be there, and files of the cache that must not change (the target's
    blobs); the report and summary it writes then."""

    images: tuple[str, ...]
    entries: tuple[Path, ...]
    files: tuple[Path, ...]
    report: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildResult:
    target: str
    tag: str
    stages: tuple[StageResult, ...]
    seconds: float
    report: Path | None
    image_digest: str | None = None
    uptodate: UpToDate | None = None
    # Seconds per phase of imageforge's own work (Clock), for the report and the benchmark.
    phases: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @property
    def rebuilt(self) -> list[str]:
        return [s.name for s in self.stages if s.state == "built"]


def as_noop(result: BuildResult) -> BuildResult:
    """The result the same build gives next time, when nothing changed."""
    stages = tuple(dataclasses.replace(s, state="cached", seconds=0.0) for s in result.stages)
    return dataclasses.replace(result, stages=stages, seconds=0.0, report=None, phases={})

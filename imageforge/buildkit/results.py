"""What a build was asked to do and what it did: options, per-stage results."""

from __future__ import annotations

import dataclasses
from pathlib import Path

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageResult:
    name: str
    key: str
    state: str
    seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildResult:
    target: str
    tag: str
    stages: tuple[StageResult, ...]
    seconds: float
    report: Path | None
    image_digest: str | None = None

    @property
    def rebuilt(self) -> list[str]:
        return [s.name for s in self.stages if s.state == "built"]

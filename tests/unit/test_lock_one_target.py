"""A command for one target resolves only that target's stale entries: `fetch --target efa`
after an override of efa's pins asked NCCL's upstream for its pin too, so a one-stage fetch
from a mirror failed when the other upstreams were unreachable.

The resolver here records what settle asks of it and answers from fixed pins: what is under
test is which entries settle hands to a resolver, not how a real one reaches upstream (the
integration tests resolve against the real sample upstream)."""

# ruff: noqa: ARG002  (the recorder implements locksettle.Resolver; it ignores what it need not read)
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from imageforge.model.dag import closure
from imageforge.model.lockpin import LockPin
from imageforge.model.manifest import Manifest, load
from imageforge.model.sourcetypes import Source, UrlSource
from imageforge.model.stage import Stage
from imageforge.sources import lockfile, locksettle, upstream
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]


class Recording:
    """A locksettle.Resolver that records each question and answers with a well-formed pin."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    @property
    def revisit(self) -> bool:
        return False

    def renewed(self, manifest: Manifest, names: Sequence[str]) -> list[str]:
        return []

    def upgrades(self, manifest: Manifest, registry: Mapping[str, Stage],
                 names: Sequence[str]) -> list[upstream.Upgrade]:
        return []

    def source(self, source: Source, old: lockfile.Entry | None) -> dict[str, Any]:
        self.asked.append(source.name)
        return {"sha256": "a" * 64} if isinstance(source, UrlSource) else {"commit": "b" * 40}

    def base(self, ref: str, old: lockfile.Entry | None) -> dict[str, Any]:
        self.asked.append("base")
        return {"digest": None}

    def extended(self, manifest: Manifest, old: lockfile.Entry | None) -> dict[str, Any]:
        raise AssertionError("the sample extends no image")

    def lock_pin(self, pin: LockPin, manifest: Manifest, registry: Mapping[str, Stage],
                 old: lockfile.Entry | None) -> Mapping[str, Any]:
        self.asked.append(pin.entry)
        return {"version": "2.10.3", "commit": "c" * 40}

    def pip(self, stage: str, origin: Mapping[str, Any], old: lockfile.Entry | None
            ) -> dict[str, Any]:
        self.asked.append(f"pip.{stage}")
        return {"packages": []}


def test_only_the_targets_stale_entries_reach_the_resolver() -> None:
    # No lock: every entry is stale. The sample pins efa's sha256 in the file, so the only
    # questions for efa's closure are the base image's.
    manifest = load(ROOT / "manifests" / "sample.toml", registry=STAGES)
    resolver = Recording()
    settled = locksettle.settle(manifest, None, STAGES, resolver, only=set(closure("efa", STAGES)))
    assert resolver.asked == ["base"]
    assert ("nccl_pytorch_pin",) in settled.unresolved   # left for a command that needs it

    everything = Recording()
    locksettle.settle(manifest, None, STAGES, everything)
    assert "nccl_pytorch_pin" in everything.asked
    assert "pip.sagemaker-training" in everything.asked


def test_a_lock_pin_is_resolved_for_the_stage_that_declares_it() -> None:
    manifest = load(ROOT / "manifests" / "sample.toml", registry=STAGES)
    resolver = Recording()
    locksettle.settle(manifest, None, STAGES, resolver, only=set(closure("nccl", STAGES)))
    assert "nccl_pytorch_pin" in resolver.asked
    assert not any(asked.startswith("pip.") for asked in resolver.asked)

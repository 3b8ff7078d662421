"""Lock-time pins: facts a stage resolves from other stages' pins when the lock is written.

A stage module may declare `lock_pins`. Each is one lock entry (a section of its own at the
top of the lock file) whose "from" is read off the manifest once the stages it reads have
their sources pinned; when that "from" changes the entry is stale and resolved upstream again,
and its pin is applied back to the manifest. The nccl stage's is the NCCL that PyTorch's commit
pins: with `version = "auto"` it becomes the version and commit the nccl stage builds.

The lock knows only this contract (lock.settle walks every stage's pins); what a pin means is
its stage's business.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from imageforge.model.manifest import Manifest
    from imageforge.model.stage import Stage

Pin = Mapping[str, Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Upstream:
    """Where a pin may look while it is resolved: `locate` rewrites a URL to this machine's
    mirror (or leaves it), `mirrors` is the directory of bare git mirrors."""

    locate: Callable[[str], str]
    mirrors: Path


@dataclasses.dataclass(frozen=True, kw_only=True)
class LockPin:
    # The lock section the entry is kept under, e.g. "nccl_pytorch_pin".
    entry: str
    # Stages the pin is read from: when one of them is not in the image the pin is not needed.
    reads: tuple[str, ...]
    # The entry's "from", given the manifest (the read stages' sources pinned) and the
    # registry; None while a pin it needs is still unknown (the entry is stale, unresolved).
    origin: Callable[[Manifest, Mapping[str, Stage]], Mapping[str, Any] | None]
    # Find the pin upstream (only when the lock's entry is missing or stale).
    resolve: Callable[[Manifest, Mapping[str, Stage], Upstream], Pin]
    # The manifest with the pin applied (e.g. "auto" replaced by what it resolved to).
    apply: Callable[[Manifest, Pin], Manifest]
    # How `invoke lock` reports the entry moving from one pin to another (None: absent).
    describe: Callable[[Pin | None, Pin | None], str]
    # True while the stage's own sources depend on this pin (nccl "auto"): they are pinned
    # only after it.
    waits: Callable[[Manifest], bool] = lambda _manifest: False


def declared(registry: Mapping[str, Stage]) -> dict[str, LockPin]:
    """Every stage's lock pins, by entry name."""
    return {pin.entry: pin for stage in registry.values() for pin in stage.lock_pins}

"""Which compatibility findings stop a command, and which ones a manifest accepts.

Every command that locks, plans a build, builds or runs the nightly calls `enforce` before any
download or BuildKit call: it evaluates every rule of imageforge/compat.py and refuses (exit 3)
with every violation that no waiver accepts, all at once. A manifest accepts a known violation
only by naming the rule's id (the one in brackets in the report) and saying why:

    [waive]
    torchvision-pytorch = "seed 002 ships torchvision 0.9.1 with PyTorch 1.10.2"

`stages.nccl.differs_from_pytorch = "..."` is the older spelling of `[waive] nccl-pytorch-pin`.
`invoke check` and `invoke plan` print what each waiver accepted, and the image carries every
waiver in force as a label `io.imageforge.waiver.<rule id>`.

# Adding a rule
Put its facts and `[rules.<id>]` (description, source, fix) in manifests/compat.toml and a
function `(Manifest, Data) -> list[Violation]` in compat.RULES; enforcing, waiving, reporting
and labelling go by the id and need nothing else.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from imageforge import compat
from imageforge.compat import RULES_PATH, Violation
from imageforge.docker import LABEL_PREFIX
from imageforge.errors import CompatibilityError, ManifestError
from imageforge.manifest import Manifest
from imageforge.ncclpin import NcclPin

NCCL_PIN: Final = "nccl-pytorch-pin"
# rule id -> (stage, key) of a waiver spelled the old way, inside the stage's table.
ALIASES: Final[Mapping[str, tuple[str, str]]] = {NCCL_PIN: ("nccl", "differs_from_pytorch")}
HINT: Final = ('To accept a violation on purpose, name its rule id with the reason under '
               '[waive] in the manifest, e.g. [waive] torchvision-pytorch = "why".')


@dataclasses.dataclass(frozen=True)
class Accepted:
    """A violation that a waiver accepts, and the waiver's reason."""

    violation: Violation
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"rule": self.violation.rule, "key": self.violation.key,
                "message": self.violation.message, "reason": self.reason}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    accepted: tuple[Accepted, ...] = ()
    # Waived rules that found nothing to accept: the combination they excused is gone.
    unused: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """What `invoke check` and `invoke plan` print about waivers."""
        lines = [f"waived [{a.violation.rule}] {a.violation.key}: {a.violation.message} "
                 f"Accepted because: {a.reason}" for a in self.accepted]
        lines += [f"waiver {rule} accepts nothing now: no violation of it is left; remove it "
                  "from [waive]" for rule in self.unused]
        return lines


def waivers(manifest: Manifest) -> dict[str, str]:
    """rule id -> reason, for every waiver the manifest declares (either spelling)."""
    declared = dict(manifest.waivers)
    for rule, (stage, key) in ALIASES.items():
        reason = (manifest.stages.get(stage) or {}).get(key)
        if reason:
            declared.setdefault(rule, str(reason))
    return declared


def evaluate(manifest: Manifest, pin: NcclPin | None, *,
             rules_path: Path = RULES_PATH) -> tuple[list[Violation], Verdict]:
    """The violations no waiver accepts, and the verdict on the waivers. `pin` is the NCCL the
    manifest's PyTorch pins, when a lock has resolved it (None: that rule cannot be judged)."""
    waived = waivers(manifest)
    _require_known(manifest, waived, rules_path)
    found = (compat.check(manifest, rules_path=rules_path)
             + compat.nccl_pin_rule(manifest, pin, rules_path=rules_path))
    refused = [v for v in found if v.rule not in waived]
    accepted = tuple(Accepted(v, waived[v.rule]) for v in found if v.rule in waived)
    judged = {rule for rule in waived if rule != NCCL_PIN or pin is not None}
    unused = tuple(sorted(judged - {v.rule for v in found}))
    return refused, Verdict(accepted=accepted, unused=unused)


def enforce(manifest: Manifest, pin: NcclPin | None, *,
            rules_path: Path = RULES_PATH) -> Verdict:
    """Refuse (exit 3) every violation that no waiver accepts, all in one message."""
    refused, verdict = evaluate(manifest, pin, rules_path=rules_path)
    if refused:
        report = compat.format_violations(refused, manifest=manifest.path)
        raise CompatibilityError(f"{report}\n{HINT}")
    return verdict


def labels(manifest: Manifest) -> dict[str, str]:
    """Image labels for the waivers in force; one whose violation is gone is left out."""
    _, verdict = evaluate(manifest, None)
    return {f"{LABEL_PREFIX}.waiver.{rule}": reason
            for rule, reason in sorted(waivers(manifest).items()) if rule not in verdict.unused}


def _require_known(manifest: Manifest, waived: Mapping[str, str], rules_path: Path) -> None:
    known = compat.rule_ids(rules_path=rules_path)
    for rule in waived:
        if rule not in known:
            close = difflib.get_close_matches(rule, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ManifestError(f"{manifest.path}: waive.{rule}: no compatibility rule has that "
                                f"id; {hint}rule ids are: {', '.join(known)}.")

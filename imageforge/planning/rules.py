"""Which compatibility findings stop a command, and which ones a manifest accepts.

Every command that locks, plans a build, builds or runs the nightly calls `enforce` before any
download or BuildKit call: it evaluates every rule of every stage in the registry (the rules
on the lock's pins too, such as the nccl stage's on the NCCL PyTorch pins) and refuses (exit 3)
with every violation that no waiver accepts, all at once. A manifest accepts a known
violation only by naming the rule's id (the one in brackets in the report) and saying why:

    [waive]
    torchvision-pytorch = "seed 002 ships torchvision 0.9.1 with PyTorch 1.10.2"

A rule's data may name an older spelling of its waiver (`alias`: a key in a stage's table
whose value is the reason; stages/nccl_rules.toml has one).
`invoke check` and `invoke plan` print what each waiver accepted, and the image carries every
waiver in force as a label `io.imageforge.waiver.<rule id>`.

# Adding a rule
The stage it constrains declares it (`Stage.rules`, see docs/adding-a-stage.md): a function
`(Manifest, Rule, registry) -> list[Violation]` and `[rules.<id>]` (description, source, fix)
with its facts in the data file beside the stage module; enforcing, waiving, reporting and
labelling go by the id and need nothing else.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any, Final

from imageforge.docker import LABEL_PREFIX
from imageforge.errors import CompatibilityError, ManifestError
from imageforge.model import compat
from imageforge.model.compat import Registry, Violation
from imageforge.model.manifest import Manifest

Pins = Mapping[str, Mapping[str, Any]]
HINT: Final = ('To accept a violation on purpose, name its rule id with the reason under '
               '[waive] in the manifest, e.g. [waive] {rule} = "why".')


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


def waivers(manifest: Manifest, *, registry: Registry) -> dict[str, str]:
    """rule id -> reason, for every waiver the manifest declares (either spelling)."""
    declared = dict(manifest.waivers)
    for rule, key in compat.aliases(registry=registry).items():
        reason = _stage_value(manifest, key)
        if reason:
            declared.setdefault(rule, str(reason))
    return declared


def evaluate(manifest: Manifest, pins: Pins | None, *, registry: Registry
             ) -> tuple[list[Violation], Verdict]:
    """The violations no waiver accepts, and the verdict on the waivers. `pins` are the
    lock's pins for this manifest (entry -> pin; a rule on a pin it lacks is not judged)."""
    waived = waivers(manifest, registry=registry)
    _require_known(manifest, waived, registry)
    found = compat.check(manifest, registry=registry, pins=pins)
    refused = [v for v in found if v.rule not in waived]
    accepted = tuple(Accepted(v, waived[v.rule]) for v in found if v.rule in waived)
    judged = set(waived) - compat.unjudged(registry, pins)
    unused = tuple(sorted(judged - {v.rule for v in found}))
    return refused, Verdict(accepted=accepted, unused=unused)


def enforce(manifest: Manifest, pins: Pins | None, *, registry: Registry) -> Verdict:
    """Refuse (exit 3) every violation that no waiver accepts, all in one message."""
    refused, verdict = evaluate(manifest, pins, registry=registry)
    if refused:
        report = compat.format_violations(refused, manifest=manifest.path)
        # The example names a rule that was broken, not one from elsewhere.
        raise CompatibilityError(f"{report}\n{HINT.format(rule=refused[0].rule)}")
    return verdict


def labels(manifest: Manifest, *, registry: Registry) -> dict[str, str]:
    """Image labels for the waivers in force; one whose violation is gone is left out."""
    _, verdict = evaluate(manifest, None, registry=registry)
    return {f"{LABEL_PREFIX}.waiver.{rule}": reason
            for rule, reason in sorted(waivers(manifest, registry=registry).items())
            if rule not in verdict.unused}


def _stage_value(manifest: Manifest, key: str) -> Any:
    """The value of "stages.<stage>.<key>" in `manifest`; None when it is not there."""
    _, stage, name = key.split(".", 2)
    return (manifest.stages.get(stage) or {}).get(name)


def _require_known(manifest: Manifest, waived: Mapping[str, str], registry: Registry) -> None:
    known = compat.rule_ids(registry=registry)
    for rule in waived:
        if rule not in known:
            close = difflib.get_close_matches(rule, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ManifestError(f"{manifest.path}: waive.{rule}: no compatibility rule has that "
                                f"id; {hint}rule ids are: {', '.join(known)}.")

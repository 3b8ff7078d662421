"""The summary lines `test-image` prints (also from `build` and `matrix.build`), parsed."""

from __future__ import annotations

import dataclasses
import re

# One line per image, as imageforge/image/checkreport.py's table() and summary() print it:
#   IMAGE (sha256:...): 12 ok, 0 failed[, 2 skipped: needs hardware (...)] in 3.4s
# Matched as a whole line, so "10 failed" is never read as "0 failed".
SUMMARY = re.compile(r"^(?P<image>\S+) \((?P<digest>sha256:[0-9a-f]{64})\): "
                     r"(?P<ok>\d+) ok, (?P<failed>\d+) failed"
                     r"(?:, (?P<skipped>\d+) skipped: needs hardware \(.*\))?"
                     r" in \d+\.\d+s$", re.M)


@dataclasses.dataclass(frozen=True)
class CheckSummary:
    """The counts of one image's check run."""

    image: str
    digest: str
    ok: int
    failed: int
    skipped: int


def check_summaries(output: str) -> list[CheckSummary]:
    """Every check summary line in `output`, in the order printed."""
    return [CheckSummary(image=m["image"], digest=m["digest"], ok=int(m["ok"]),
                         failed=int(m["failed"]), skipped=int(m["skipped"] or 0))
            for m in SUMMARY.finditer(output)]


def checks_passed(output: str) -> bool:
    """True when `output` has a check summary and every one ran checks and failed none."""
    found = check_summaries(output)
    return bool(found) and all(s.failed == 0 and s.ok > 0 for s in found)

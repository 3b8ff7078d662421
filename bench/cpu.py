"""System-wide busy CPU time from /proc/stat.

BuildKit runs inside the Docker daemon and its RUN steps in containers the daemon starts, so
the CPU a build costs is not charged to our process or its children: the only measure that
sees it is the whole machine's busy time, which is honest only while nothing else runs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

STAT = Path("/proc/stat")
# user nice system idle iowait irq softirq steal (guest time is already counted in user).
_IDLE_FIELDS = (3, 4)
_COUNTED = 8


def read_ticks(stat: Path = STAT) -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot."""
    for line in stat.read_text().splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:_COUNTED + 1]]
            idle = sum(values[i] for i in _IDLE_FIELDS)
            return sum(values) - idle, sum(values)
    raise RuntimeError(f"{stat}: no aggregate cpu line")


def ticks_per_second() -> int:
    return os.sysconf("SC_CLK_TCK")


def busy_seconds(before: tuple[int, int], after: tuple[int, int]) -> float:
    """CPU seconds (all cores together) the machine was busy between two readings."""
    return (after[0] - before[0]) / ticks_per_second()


def background_load(seconds: float = 3.0) -> float:
    """Fraction of all cores busy over `seconds` of doing nothing ourselves: the noise
    every CPU figure of the run carries."""
    before = read_ticks()
    time.sleep(seconds)
    after = read_ticks()
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total else 0.0

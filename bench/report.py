"""What the benchmark measured, its pass/fail targets, and the Markdown tables it prints."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

IMAGEFORGE = "imageforge"
BASELINE = "baseline"
# A plain `docker buildx build` of imageforge's rendered Dockerfile: BuildKit alone.
BUILDKIT = "buildkit"


@dataclasses.dataclass(kw_only=True)
class Measurement:
    """One scenario built by one tool, possibly several times."""

    tool: str
    scenario: str          # "cold", "no-op", or the stage whose pin changed
    label: str             # what the table shows, e.g. "efa 1.14.1 → 1.15.1"
    seconds: list[float] = dataclasses.field(default_factory=list)
    cpu_seconds: list[float] = dataclasses.field(default_factory=list)
    # Stages (imageforge) or Dockerfile sections (baseline) that BuildKit rebuilt.
    rebuilt: list[str] = dataclasses.field(default_factory=list)
    rebuilt_units: int = 0  # stages or layer steps rebuilt
    total_units: int = 0    # stages or layer steps in the image
    unit: str = "stages"
    # What the dependency graph (imageforge) or the chain (baseline) says must rebuild.
    expected: list[str] = dataclasses.field(default_factory=list)
    # imageforge only: each stage's state in its own build report (cache/reports).
    report_states: dict[str, str] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    # imageforge only: its build report's seconds per phase of its own work (last run).
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    # imageforge only: where its keys or its build report disagree with what it rebuilt
    # (each is also a note); any fails the scenario's target.
    faults: list[str] = dataclasses.field(default_factory=list)

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu_seconds) if self.cpu_seconds else float("nan")

    @property
    def as_expected(self) -> bool:
        return sorted(self.rebuilt) == sorted(self.expected)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(median_seconds=round(self.median_seconds, 3),
                    median_cpu_seconds=round(self.median_cpu, 3), as_expected=self.as_expected)
        return data


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    name: str
    measured: str
    limit: str
    passed: bool
    # A speed target: reported with pass or fail, never failing the run (the machine decides);
    # what was rebuilt is a promise and fails it.
    timing: bool = False

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                   *, right: Sequence[int] = ()) -> str:
    """A GitHub Markdown table; columns in `right` are right-aligned (numbers)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rule = ["---:" if i in right else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join(rule) + "|"]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {row!r} has {len(row)} cells, the table {len(headers)}")
        lines.append("| " + " | ".join(cell(c) for c in row) + " |")
    return "\n".join(lines)


def seconds(value: float) -> str:
    if math.isnan(value):  # not measured
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def rebuilt_cell(m: Measurement, chain: Sequence[str] = ()) -> str:
    """"3/9 stages: efa, aws-ofi-nccl, smddp"; for the chain, a run of sections to its end
    is shortened to "efa … smddp"."""
    head = f"{m.rebuilt_units}/{m.total_units} {m.unit}"
    if not m.rebuilt:
        return head
    if m.rebuilt_units == m.total_units:
        return f"{head} (all)"
    names = list(m.rebuilt)
    if chain and len(names) > 3 and names == list(chain[chain.index(names[0]):]):
        return f"{head}: {names[0]} … {names[-1]} ({len(names)} sections)"
    return f"{head}: {', '.join(names)}"


def ratio(slow: float, fast: float) -> str:
    if math.isnan(fast) or math.isnan(slow) or fast <= 0:
        return "-"
    return f"{slow / fast:.1f}x"


def scenario_table(measurements: Sequence[Measurement], chain: Sequence[str]) -> str:
    """imageforge and the baseline side by side, one row per scenario."""
    by_key = {(m.tool, m.scenario): m for m in measurements}
    scenarios = [m.scenario for m in measurements if m.tool == IMAGEFORGE]
    rows = []
    for scenario in scenarios:
        mine = by_key[(IMAGEFORGE, scenario)]
        theirs = by_key.get((BASELINE, scenario))
        runs = f" (median of {len(mine.seconds)})" if len(mine.seconds) > 1 else ""
        rows.append([
            mine.label + runs,
            seconds(mine.median_seconds),
            seconds(theirs.median_seconds) if theirs else "-",
            ratio(theirs.median_seconds, mine.median_seconds) if theirs else "-",
            seconds(mine.median_cpu),
            seconds(theirs.median_cpu) if theirs else "-",
            rebuilt_cell(mine) + ("" if mine.as_expected else " (graph: "
                                  + (", ".join(mine.expected) or "none") + ")"),
            rebuilt_cell(theirs, chain) if theirs else "-",
        ])
    return markdown_table(
        ["scenario", "imageforge s", "baseline s", "baseline/imageforge", "imageforge CPU s",
         "baseline CPU s", "imageforge rebuilt", "baseline rebuilt"],
        rows, right=(1, 2, 3, 4, 5))


# The phases of an imageforge build (imageforge/buildkit/results.Clock), in order.
PHASES = ("plan", "check", "fetch", "render", "bake", "store", "push", "report")


def phases_table(measurements: Sequence[Measurement]) -> str:
    """Where each imageforge build's wall time went: its own phases, BuildKit's (bake, of
    which export), and the rest of the process (start-up, imports, printing). A build
    answered from its up-to-date record has no phases: all of it is start-up."""
    rows = []
    for m in measurements:
        if m.tool != IMAGEFORGE:
            continue
        wall = m.seconds[-1] if m.seconds else float("nan")
        own = sum(v for k, v in m.phases.items() if k in PHASES)
        cells = [f"{m.phases[p]:.2f}" if p in m.phases else "-" for p in PHASES]
        export = f"{m.phases['export']:.2f}" if "export" in m.phases else "-"
        rows.append([m.label, seconds(wall), *cells, export,
                     f"{wall - own:.2f}" if not math.isnan(wall) else "-"])
    return markdown_table(["scenario", "wall s", *(f"{p} s" for p in PHASES),
                           "of bake: export s", "start-up and rest s"],
                          rows, right=tuple(range(1, len(PHASES) + 4)))


def targets_table(targets: Sequence[Target]) -> str:
    """Speed targets missed read "missed (speed)": reported, not failing the run."""
    return markdown_table(["target", "measured", "limit", "result"],
                          [[t.name, t.measured, t.limit,
                            "pass" if t.passed else "missed (speed)" if t.timing else "FAIL"]
                           for t in targets])


def plan_table(rows: Sequence[Mapping[str, Any]]) -> str:
    return markdown_table(
        ["stages", "deps", "mean closure", "plan + render s", "Dockerfile MB", "peak RSS MB",
         "traced peak MB"],
        [[str(r["size"]), str(r["shape"]), f"{r['mean_closure']:.0f}",
          f"{r['total_seconds']:.3f}", f"{r['dockerfile_bytes'] / 2**20:.1f}",
          f"{r['rss_peak_mb']:.0f}", f"{r['traced_peak_mb']:.1f}"] for r in rows],
        right=(0, 2, 3, 4, 5, 6))


# docs/bench.md holds the latest tables between these markers; the rest of that page is prose.
TABLES_START = "<!-- bench:start (written by `invoke bench`) -->"
TABLES_END = "<!-- bench:end -->"


def update_tables(path: Path, tables: str, seconds_in_all: float) -> bool:
    """Replace the generated block of the benchmark page (docs/bench.md) with this run's
    tables; False (and nothing written) when the page has no such block."""
    text = path.read_text()
    if TABLES_START not in text or TABLES_END not in text:
        return False
    head, rest = text.split(TABLES_START, 1)
    _, tail = rest.split(TABLES_END, 1)
    block = (f"{TABLES_START}\nLatest run (`invoke bench` took {seconds_in_all:.0f} s; its "
             f"host is in bench/results.json):\n\n{tables.rstrip()}\n{TABLES_END}")
    path.write_text(head + block + tail)
    return True

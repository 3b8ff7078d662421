"""The report of a build: JSON in the cache directory, a table and a Markdown summary."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from imageforge.buildkit.results import BuildResult
from imageforge.model.manifest import manifest_label
from imageforge.planning.plan import Plan
from imageforge.uptodate import save_report


def write_report(cache_dir: Path, planned: Plan, result: BuildResult) -> Path:
    """cache/reports/<timestamp>-<target>.json: what was built, how, and how long it took."""
    return save_report(cache_dir, report_data(planned, result))


def report_data(planned: Plan, result: BuildResult) -> dict[str, Any]:
    return {
        "target": result.target,
        "manifest": manifest_label(planned.manifest.path),
        "manifest_digest": planned.manifest.digest(),
        "tag": result.tag,
        "image_digest": result.image_digest,
        "seconds": result.seconds,
        "stages": [dataclasses.asdict(s) for s in result.stages],
        **({"not_reproducible": planned.not_reproducible} if planned.not_reproducible else {}),
        "phases": dict(result.phases),
    }


def markdown_summary(result: BuildResult) -> str:
    """The build as a Markdown table, e.g. for a CI job summary ($GITHUB_STEP_SUMMARY)."""
    rebuilt = ", ".join(result.rebuilt) or "nothing (every stage came from the cache)"
    lines = [f"### imageforge build: {result.target}", "",
             f"Image `{result.tag}`" + (f" `{result.image_digest}`" if result.image_digest else ""),
             f"in {result.seconds:.1f} s; rebuilt: {rebuilt}.", "",
             "| stage | result | seconds | steps run | key |", "|---|---|---:|---:|---|"]
    lines += [f"| {s.name} | {s.state} | {s.seconds:.1f} | "
              f"{f'{s.steps_run} of {s.steps}' if s.steps else '-'} | `{s.key[7:19]}` |"
              for s in result.stages]
    return "\n".join(lines) + "\n"


def summary(result: BuildResult) -> str:
    lines = [f"{'stage':<18} {'result':<8} {'seconds':>8}  steps run"]
    lines += [f"{s.name:<18} {s.state:<8} {s.seconds:>8.1f}  "
              + (f"{s.steps_run} of {s.steps}" if s.steps else "-") for s in result.stages]
    lines.append(f"image {result.tag}  ({result.seconds:.1f}s)")
    rebuilt = result.rebuilt
    lines.append(f"rebuilt: {', '.join(rebuilt)}" if rebuilt
                 else "nothing rebuilt: every stage came from the artifact cache")
    return "\n".join(lines)

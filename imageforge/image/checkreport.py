"""What a `test-image` run leaves behind: the table, JSON, JUnit XML, and the record of
passing runs by image digest (cache/tests/<digest>.json) that promotion relies on."""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from imageforge import cachedir, jsonfile, log
from imageforge.image.checks import NEEDS_HARDWARE, CheckResult, CheckRun
from imageforge.image.smoke import VERSION_MARK

LABELS = {"ok": "ok", "fail": "FAIL", "skipped": NEEDS_HARDWARE}
# Characters XML 1.0 cannot carry (terminal escapes in check output, for one).
NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def table(run: CheckRun) -> str:
    """stage, check, result, seconds; then the output of every failed check and a summary."""
    rows = [(r.stage, r.name, LABELS[r.result],
             "-" if r.result == "skipped" else f"{r.seconds:.2f}") for r in run.results]
    head = ("stage", "check", "result", "seconds")
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(3)]
    lines = [f"{s:<{widths[0]}}  {c:<{widths[1]}}  {r:<{widths[2]}}  {t:>7}"
             for s, c, r, t in [head, *rows]]
    found = versions(run)
    if found:
        lines.append("\n" + versions_table(found))
    for failed in run.failed:
        lines.append(f"\n--- FAIL {failed.stage}: {failed.name}")
        lines += [f"    {line}" for line in (failed.output or "(no output)").splitlines()]
    lines.append(f"\n{run.image} ({run.digest}): {summary(run)} in {run.seconds:.1f}s")
    return "\n".join(lines)


def versions(run: CheckRun) -> list[dict[str, str]]:
    """The versions report: what each version check read from inside the image."""
    rows = []
    for result in run.results:
        for line in result.output.splitlines():
            if line.startswith(VERSION_MARK + "|"):
                _, component, pinned, found = [*line.split("|", 3), "", "", ""][:4]
                match = "-" if pinned == "-" else ("yes" if result.result == "ok" else "NO")
                rows.append({"stage": result.stage, "component": component, "pinned": pinned,
                             "found": found, "match": match})
    return rows


def versions_table(rows: list[dict[str, str]]) -> str:
    head = {"component": "component", "pinned": "pinned", "found": "in the image",
            "match": "match"}
    keys = list(head)
    widths = {k: max(len(r[k]) for r in [head, *rows]) for k in keys}
    return "\n".join("  ".join(f"{r[k]:<{widths[k]}}" for k in keys).rstrip()
                     for r in [head, *rows])


def summary(run: CheckRun) -> str:
    counts = {key: sum(r.result == key for r in run.results) for key in LABELS}
    text = f"{counts['ok']} ok, {counts['fail']} failed"
    if counts["skipped"]:
        text += (f", {counts['skipped']} skipped: {NEEDS_HARDWARE} (`--hardware` runs them on "
                 "an instance with a GPU and EFA)")
    return text


def to_json(run: CheckRun) -> dict[str, Any]:
    data = dataclasses.asdict(run)
    data["passed"] = not run.failed
    data["results"] = [_result_json(r) for r in run.results]
    data["versions"] = versions(run)
    return data


def _result_json(result: CheckResult) -> dict[str, Any]:
    data = dataclasses.asdict(result)
    data["reason"] = NEEDS_HARDWARE if result.result == "skipped" else None
    if result.result == "skipped":
        data["output"] = ""
    return data


def junit_xml(run: CheckRun) -> str:
    """One testsuite per image, one testcase per check (classname <target>.<stage>)."""
    skipped = sum(r.result == "skipped" for r in run.results)
    suite = ET.Element("testsuite", name=f"test-image {run.target}", tests=str(len(run.results)),
                       failures=str(len(run.failed)), errors="0", skipped=str(skipped),
                       time=f"{run.seconds:.3f}", timestamp=run.started)
    properties = ET.SubElement(suite, "properties")
    for key in ("image", "digest", "manifest", "hardware"):
        ET.SubElement(properties, "property", name=key, value=str(getattr(run, key)))
    for result in run.results:
        case = ET.SubElement(suite, "testcase", classname=f"{run.target}.{result.stage}",
                             name=result.name, time=f"{result.seconds:.3f}")
        if result.result == "skipped":
            ET.SubElement(case, "skipped", message=NEEDS_HARDWARE)
        elif result.result == "fail":
            failure = ET.SubElement(case, "failure",
                                    message=_xml_text(_failure_message(result)))
            failure.text = _xml_text(result.output)
        elif result.output:
            ET.SubElement(case, "system-out").text = _xml_text(result.output)
    root = ET.Element("testsuites", name="imageforge", tests=suite.get("tests", ""),
                      failures=suite.get("failures", ""), errors="0",
                      skipped=suite.get("skipped", ""), time=suite.get("time", ""))
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _failure_message(result: CheckResult) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    code = "did not finish" if result.exit_code is None else f"exit {result.exit_code}"
    return f"{code}: {lines[-1].strip()}" if lines else code


def _xml_text(text: str) -> str:
    return NOT_XML.sub("", text)


def write_reports(run: CheckRun, *, json_path: Path | None = None,
                  junit_path: Path | None = None) -> list[Path]:
    """Write the requested report files; returns their paths."""
    written = []
    if json_path is not None:
        _write(json_path, json.dumps(to_json(run), indent=2) + "\n")
        written.append(json_path)
    if junit_path is not None:
        _write(junit_path, junit_xml(run))
        written.append(junit_path)
    return written


def publish(cache_dir: Path, run: CheckRun, *, json_path: Path | None = None,
            junit_path: Path | None = None) -> list[Path]:
    """Write the requested reports and update the digest's record; returns what was written."""
    written = write_reports(run, json_path=json_path, junit_path=junit_path)
    record = update_record(cache_dir, run)
    return [*written, record] if record.exists() else written


def record_path(cache_dir: Path, digest: str) -> Path:
    return cachedir.test_record(cache_dir, digest)


def update_record(cache_dir: Path, run: CheckRun) -> Path:
    """Keep the record of a digest's latest run only while it passes: a failing run of the
    same digest (new checks, or --hardware on an instance) withdraws an earlier pass."""
    path = record_path(cache_dir, run.digest)
    if run.failed:
        path.unlink(missing_ok=True)
    else:
        _write(path, json.dumps(to_json(run), indent=2) + "\n")
    return path


def passed_record(cache_dir: Path, digest: str) -> dict[str, Any] | None:
    """The passing test-image run recorded for `digest`, or None."""
    path = record_path(cache_dir, digest)
    if not path.exists():
        return None
    try:
        record = jsonfile.load(path)
    except (OSError, ValueError) as exc:
        # Corrupt or unreadable: no proof the image passed, which `promote` then says.
        log.warning(f"{path}: not a test record imageforge wrote ({exc}); ignoring it.")
        return None
    if not isinstance(record, dict):
        log.warning(f"{path}: not a test record imageforge wrote; ignoring it.")
        return None
    return record if record.get("passed") is True and record.get("digest") == digest else None


def _write(path: Path, text: str) -> None:
    jsonfile.write_text(path, text)

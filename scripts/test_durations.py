"""Where `make test`'s time goes, per module: the table docs/testing.md shows.

Usage: .venv/bin/python scripts/test_durations.py [JUNIT_XML] [--top N]

Reads the JUnit XML that `make test` writes (cache/reports/make-test.xml by default; each
test case's time is its setup, call and teardown) and prints one Markdown row per module:
its tests, its summed time and its slowest test. Under pytest-xdist each module runs on one
worker (tests/conftest.py), so a module's sum is the time it held that worker.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

DEFAULT = Path("cache/reports/make-test.xml")


def module_of(classname: str) -> str:
    """tests.unit.test_x (a test class's name, when there is one, cut off)."""
    parts = classname.split(".")
    ends = [i for i, part in enumerate(parts) if part.startswith("test_")]
    return ".".join(parts[:ends[0] + 1]) if ends else classname


def per_module(cases: list[ET.Element]) -> dict[str, tuple[int, float, str, float]]:
    """module -> (tests, seconds, slowest test, its seconds)."""
    found: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for case in cases:
        found[module_of(case.get("classname") or "?")].append(
            (case.get("name") or "?", float(case.get("time") or 0)))
    table = {}
    for module, tests in found.items():
        name, slowest = max(tests, key=lambda t: t[1])
        table[module] = (len(tests), sum(t for _, t in tests), name, slowest)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--top", type=int, default=20, help="modules to show (default 20)")
    args = parser.parse_args(argv)
    try:
        root = ET.parse(args.junit).getroot()
    except (OSError, ET.ParseError) as exc:
        print(f"test_durations: {args.junit}: cannot read it ({exc}); run `make test` first.",
              file=sys.stderr)
        return 1
    cases = list(root.iter("testcase"))
    table = per_module(cases)
    total = sum(seconds for _, seconds, _, _ in table.values())
    print(f"{len(cases)} tests, {total / 60:.1f} min of test time in all\n")
    print("| module | tests | time | slowest test |")
    print("|---|---:|---:|---|")
    ranked = sorted(table.items(), key=lambda item: -item[1][1])
    for module, (count, seconds, name, slowest) in ranked[:args.top]:
        print(f"| `{module}` | {count} | {seconds / 60:.1f} min | `{name}` {slowest:.0f} s |")
    rest = ranked[args.top:]
    if rest:
        print(f"| {len(rest)} other modules | {sum(c for _, (c, _, _, _) in rest)} | "
              f"{sum(s for _, (_, s, _, _) in rest) / 60:.1f} min | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

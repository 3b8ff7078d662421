"""Test modules are imported by their base name (tests/unit and tests/integration are not
packages), so two modules of one name make the whole suite's collection fail with "import file
mismatch": a run once lost a module that way."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_name() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []

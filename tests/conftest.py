"""How the suite is spread over pytest-xdist's workers (`make test` runs `-n auto --dist
loadfile --no-loadscope-reorder`).

Each module is one unit of work, run whole on one worker: its module-scoped fixtures (a
build, a served upstream) are made once. Session fixtures are per worker: a worker that runs
a module needing the second Docker engine starts one of its own, so tests that stop it or
prune its build cache never run beside another worker's. Modules are handed out longest
first, so the longest starts at once and the small unit modules fill the gaps at the end.

(loadfile, not loadgroup with marks: xdist 3.8 groups by rewriting a test's `_nodeid`,
which pytest 9 no longer reads, so every test became a unit of its own.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Modules measured longest (docs/testing.md), handed out in this order; the rest
# follow in collection order. test_real_torch takes 8 minutes where its kept image is
# missing (a machine that never ran it) and under one where it is there.
LONGEST_FIRST = ("test_real_parts", "test_verify_rebuild", "test_real_torch", "test_cache",
                 "test_ci_pipeline",
                 "test_faults", "test_build", "test_runlocal_job", "test_training_contract",
                 "test_checks", "test_nightly_push", "test_sample_builds")


def rank(item: pytest.Item) -> int:
    name = item.path.stem
    if name in LONGEST_FIRST:
        return LONGEST_FIRST.index(name)
    # The other Docker modules before the unit modules: those are short, and fill the
    # workers' last minutes evenly.
    return len(LONGEST_FIRST) + ("unit" in item.path.parts)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest modules first, then the other integration modules, then the unit modules; a
    stable sort keeps each module's tests together and in their own order."""
    items.sort(key=rank)

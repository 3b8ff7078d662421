"""How the suite is spread over pytest-xdist's workers (`make test` runs `-n 2 --dist
loadgroup --no-loadscope-reorder`).

Each module is one unit of work: its module-scoped fixtures (a build, a served upstream) are
made once, on one worker. The modules that use the second Docker engine are one unit, so one
worker starts that engine (about 1 GB of base image loaded into it) and its tests, which prune
its build cache, never run beside each other. Units are handed out longest first, so the
longest module starts at once and the small unit modules fill the gaps at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Modules that start and stop the second engine, prune its build cache or compare its state.
SECOND_ENGINE = frozenset({"test_cache", "test_ci_pipeline", "test_faults",
                           "test_registry_faults", "test_verify_rebuild"})
SECOND_ENGINE_GROUP = "second-engine"
# Units measured longest (README, "Where the time goes"), handed out in this order; the
# rest follow in collection order.
LONGEST_FIRST = ("test_real_parts", SECOND_ENGINE_GROUP, "test_runlocal_job",
                 "test_training_contract", "test_nightly_push", "test_checks",
                 "test_sample_builds", "test_uptodate_build", "test_build")


def group_of(item: pytest.Item) -> str:
    module = item.path.stem
    if module in SECOND_ENGINE and "integration" in item.path.parts:
        return SECOND_ENGINE_GROUP
    return str(item.path.relative_to(ROOT))


def rank(group: str) -> int:
    for place, name in enumerate(LONGEST_FIRST):
        if group == name or Path(group).stem == name:
            return place
    return len(LONGEST_FIRST)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its unit (xdist's loadgroup reads the mark after this hook) and
    put the units longest first; without xdist the order is all this changes, and a stable
    sort keeps each module's own order."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item)))
    items.sort(key=lambda item: rank(group_of(item)))

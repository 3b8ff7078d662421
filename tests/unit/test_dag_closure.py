"""Closures are remembered per registry; their order must stay exactly the depth-first
post-order the rendered Dockerfiles (and so every key) were made with."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imageforge.errors import ManifestError
from imageforge.model.dag import closure, direct_deps
from imageforge.model.stage import Stage


def stage(name: str, deps: tuple[str, ...], parent: str | None = None) -> Stage:
    return Stage(name=name, doc="", deps=deps, parent=parent, fields={},
                 recipe=lambda _ctx: "")


def reference(target: str, registry: Mapping[str, Stage]) -> list[str]:
    """The depth-first search closure() was before it remembered anything."""
    order: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        for dep in direct_deps(registry[name]):
            if dep not in done:
                visit(dep)
        done.add(name)
        order.append(name)

    visit(target)
    return order


@st.composite
def graphs(draw: st.DrawFn) -> dict[str, Stage]:
    size = draw(st.integers(min_value=1, max_value=30))
    registry: dict[str, Stage] = {}
    names: list[str] = []
    for index in range(size):
        # Names out of creation order, so sorting the deps matters.
        name = f"s{draw(st.integers(0, 999)):03d}-{index}"
        deps = tuple(draw(st.lists(st.sampled_from(names), max_size=4, unique=True))) \
            if names else ()
        parent = draw(st.sampled_from(names)) if bool(names) and draw(st.booleans()) else None
        registry[name] = stage(name, deps, parent)
        names.append(name)
    return registry


@settings(max_examples=200, deadline=None)
@given(graphs())
def test_every_closure_is_the_depth_first_post_order(registry: dict[str, Stage]) -> None:
    # Asked in any order, each closure equals the plain search's.
    for name in reversed(list(registry)):
        assert closure(name, registry) == reference(name, registry)


def test_a_new_registry_is_not_answered_from_the_last_one() -> None:
    first = {"a": stage("a", ()), "b": stage("b", ("a",))}
    assert closure("b", first) == ["a", "b"]
    second = {"a": stage("a", ("c",)), "b": stage("b", ("a",)), "c": stage("c", ())}
    assert closure("b", second) == ["c", "a", "b"]
    # A caller may change the list it got without changing the next answer.
    got = closure("b", second)
    got.append("x")
    assert closure("b", second) == ["c", "a", "b"]


def test_a_cycle_is_refused_and_a_deep_chain_needs_no_recursion() -> None:
    cyclic = {"a": stage("a", ("b",)), "b": stage("b", ("c",)), "c": stage("c", ("a",))}
    with pytest.raises(ManifestError, match="depends on itself"):
        closure("a", cyclic)
    chain = {"s0": stage("s0", ())} | {f"s{i}": stage(f"s{i}", (f"s{i - 1}",))
                                       for i in range(1, 5000)}
    assert closure("s4999", chain) == [f"s{i}" for i in range(5000)]

"""The stage graph: closures and orders over the registry."""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from imageforge.errors import ManifestError
from imageforge.stage import Stage


def direct_deps(stage: Stage) -> tuple[str, ...]:
    """What a stage builds on: its declared deps and the stage it is built FROM."""
    return tuple(sorted({*stage.deps, *([stage.parent] if stage.parent else [])}))


def closure(target: str, registry: Mapping[str, Stage]) -> list[str]:
    """`target` and everything it needs, dependencies first, in a deterministic order."""
    if target not in registry:
        close = difflib.get_close_matches(target, list(registry), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ManifestError(f"--target {target}: unknown stage; {hint}"
                            f"targets are: {', '.join(registry)}.")
    # Iterative depth-first search: graphs may be deeper than Python's recursion limit.
    order: list[str] = []
    done: set[str] = set()
    visiting: set[str] = set()
    stack: list[tuple[str, list[str]]] = [(target, list(direct_deps(registry[target])))]
    visiting.add(target)
    while stack:
        name, pending = stack[-1]
        if not pending:
            stack.pop()
            visiting.discard(name)
            done.add(name)
            order.append(name)
            continue
        dep = pending.pop(0)
        if dep in done:
            continue
        if dep in visiting:
            raise ManifestError(f"stage {dep!r} depends on itself through its dependencies.")
        visiting.add(dep)
        stack.append((dep, list(direct_deps(registry[dep]))))
    return order


def parent_chain(name: str, registry: Mapping[str, Stage]) -> list[str]:
    """`name`, the stage it is FROM, that stage's parent, ... down to the base image."""
    chain = []
    current: str | None = name
    while current is not None:
        chain.append(current)
        current = registry[current].parent
    return chain

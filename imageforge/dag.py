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
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise ManifestError(f"stage {name!r} depends on itself through its dependencies.")
        visiting.add(name)
        for dep in direct_deps(registry[name]):
            visit(dep)
        visiting.discard(name)
        order.append(name)

    visit(target)
    return order


def parent_chain(name: str, registry: Mapping[str, Stage]) -> list[str]:
    """`name`, the stage it is FROM, that stage's parent, ... down to the base image."""
    chain = []
    current: str | None = name
    while current is not None:
        chain.append(current)
        current = registry[current].parent
    return chain

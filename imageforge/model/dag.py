"""The stage graph: closures and orders over the registry."""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from imageforge.errors import ManifestError, UsageError
from imageforge.model.stage import Stage


def direct_deps(stage: Stage) -> tuple[str, ...]:
    """What a stage builds on: its declared deps and the stage it is built FROM."""
    return tuple(sorted({*stage.deps, *([stage.parent] if stage.parent else [])}))


def closure(target: str, registry: Mapping[str, Stage]) -> list[str]:
    """`target` and everything it needs, dependencies first, in a deterministic order: each
    direct dependency's closure in turn (sorted by name), without repeats, then `target`
    (the post-order of a depth-first search). Closures are remembered per registry, so a
    plan that asks for every stage's closure costs the graph once, not once per stage."""
    if target not in registry:
        close = difflib.get_close_matches(target, list(registry), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        # A flag value that is not allowed (exit 1), in every command alike.
        raise UsageError(f"--target {target}: unknown stage; {hint}"
                            f"targets are: {', '.join(registry)}.")
    memo = _memo(registry)
    found = memo.get(target)
    if found is None:
        found = _closures(target, registry, memo)
    return list(found)


# The last registry's closures. Registries are built per command and never changed once
# planning starts; a different registry object starts afresh.
_last: list[tuple[Mapping[str, Stage], dict[str, tuple[str, ...]]]] = []


def _memo(registry: Mapping[str, Stage]) -> dict[str, tuple[str, ...]]:
    if not _last or _last[0][0] is not registry:
        _last[:] = [(registry, {})]
    return _last[0][1]


def _closures(target: str, registry: Mapping[str, Stage],
              memo: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    # Iterative: graphs may be deeper than Python's recursion limit.
    visiting = {target}
    stack = [(target, iter(direct_deps(registry[target])))]
    while stack:
        name, pending = stack[-1]
        for dep in pending:
            if dep in memo:
                continue
            if dep in visiting:
                raise ManifestError(f"stage {dep!r} depends on itself through its "
                                    "dependencies.")
            visiting.add(dep)
            stack.append((dep, iter(direct_deps(registry[dep]))))
            break
        else:
            stack.pop()
            visiting.discard(name)
            order: dict[str, None] = {}
            for dep in direct_deps(registry[name]):
                order.update(dict.fromkeys(memo[dep]))
            order[name] = None
            memo[name] = tuple(order)
    return memo[target]

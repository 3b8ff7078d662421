"""A stage's Dockerfile block (imageforge/planning/render.py) when the caller passes no memo of the
stages' COPY lines and search paths: render_stage asks each stage for them with the plan's
context, and the block is the same as with a memo make_plan shares between stages."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from imageforge.model.stage import Context, Stage
from imageforge.planning.render import Memo, render_stage

BASE = Stage(name="base", doc="the base image", deps=(), fields={}, recipe=lambda _ctx: "",
             parent=None)
LIB = Stage(name="lib", doc="a library", deps=(), fields={}, recipe=lambda _ctx: "RUN make",
            env_paths=lambda ctx: {"PATH": [f"/opt/lib-{ctx.of('lib')['version']}/bin"],
                                   "LD_LIBRARY_PATH": ["/opt/lib/lib"]})
APP = Stage(name="app", doc="an image", deps=("lib",), fields={}, recipe=lambda _ctx: "RUN app",
            image=True)
REGISTRY = {"base": BASE, "lib": LIB, "app": APP}
CONTEXT = Context(image={"base": "ubuntu:22.04"}, stages={"lib": {"version": "2.1"}})


def test_without_a_memo_each_stage_gives_its_paths_for_the_context() -> None:
    block = render_stage(APP, CONTEXT, REGISTRY)
    assert block == (
        "FROM base AS app\n"
        "ARG SOURCE_DATE_EPOCH\n"
        "COPY --from=lib /out/ /\n"
        'ENV LD_LIBRARY_PATH="/opt/lib/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" \\\n'
        '    PATH="/opt/lib-2.1/bin${PATH:+:${PATH}}"\n'
        "RUN app\n")


def test_a_memo_gives_the_same_block_and_asks_each_stage_once() -> None:
    asked: list[str] = []

    def lib_paths(ctx: Context) -> Mapping[str, Sequence[str]]:
        asked.append("lib")
        return LIB.env_paths(ctx)

    registry = {**REGISTRY, "lib": dataclasses.replace(LIB, env_paths=lib_paths)}
    memo = Memo(CONTEXT, registry)
    first = render_stage(APP, CONTEXT, registry, memo)
    assert first == render_stage(APP, CONTEXT, registry, memo) == render_stage(APP, CONTEXT,
                                                                              REGISTRY)
    assert asked == ["lib"]

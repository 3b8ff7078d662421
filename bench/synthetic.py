"""Planning at scale: synthetic stage graphs of any size, planned and rendered.

`python -m bench.synthetic SIZE` plans and renders one graph and prints one JSON object
(seconds, peak memory); the benchmark runs it in a fresh process per size so that memory
figures do not carry what an earlier size allocated.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import hashlib
import json
import pstats
import random
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from imageforge.model.dag import closure
from imageforge.model.manifest import Manifest
from imageforge.model.sourcetypes import Source
from imageforge.model.stage import EXPORT_ROOT, Context, Field, Stage, url_source
from imageforge.planning.dockerfile import bind, run, sh
from imageforge.planning.plan import Plan, make_plan
from imageforge.planning.render import render_dockerfile

ROOT_STAGE = "s0000"
SLOW_SECONDS = 1.0
TARGET = "image"
FIELDS: Mapping[str, Field] = {
    "version": Field(kind="version", required=True, help="version"),
    "url": Field(kind="url", help="source tarball"),
    "sha256": Field(kind="sha256", locked=True, help="sha256 of the tarball"),
}


def _recipe(name: str) -> Any:
    def recipe(ctx: Context) -> str:
        inputs = ctx.of(name)
        tarball = url_source(name, inputs).filename
        return run("mkdir -p /tmp/build", sh("tar", "-xzf", f"/src/{tarball}", "-C", "/tmp/build"),
                   sh("make", "-C", "/tmp/build", "install", f"DESTDIR={EXPORT_ROOT}"),
                   mounts=[bind(f"src-{name}", "/src")])
    return recipe


def _sources(name: str) -> Any:
    def sources(ctx: Context) -> Sequence[Source]:
        return [url_source(name, ctx.of(name))]
    return sources


def _env_paths(name: str) -> Any:
    def env_paths(_ctx: Context) -> Mapping[str, Sequence[str]]:
        return {"LD_LIBRARY_PATH": [f"/opt/{name}/lib"]}
    return env_paths


# How far back a stage's dependencies are drawn from: any earlier stage ("wide": short
# closures, about 44 stages at 1000) or the 10 stages before it ("deep": long chains like
# layered toolchains, closures of about 420 stages at 1000).
SHAPES: Mapping[str, int | None] = {"wide": None, "deep": 10}


def synthetic_registry(size: int, seed: int, *, shape: str = "wide",
                       max_deps: int = 3) -> dict[str, Stage]:
    """`size` stages: a root (FROM the base image), builders with 1..max_deps random earlier
    dependencies (a quarter of them built FROM one of those), and an image stage that
    depends on every stage nothing else depends on, so its plan holds all `size` stages."""
    if size < 3:
        raise ValueError("a synthetic graph needs at least 3 stages (root, one builder, image)")
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}: use one of {', '.join(SHAPES)}")
    window = SHAPES[shape]
    rng = random.Random(seed)
    registry: dict[str, Stage] = {
        ROOT_STAGE: Stage(name=ROOT_STAGE, doc="", deps=(), parent=None, fields={},
                          recipe=lambda _ctx: "", exports=()),
    }
    names = [ROOT_STAGE]
    used: set[str] = set()
    for index in range(1, size - 1):
        name = f"s{index:04d}"
        pool = names[-window:] if window else names
        deps = tuple(sorted(rng.sample(pool, rng.randint(1, min(max_deps, len(pool))))))
        parent = deps[0] if rng.random() < 0.25 else ROOT_STAGE
        registry[name] = Stage(
            name=name, doc="", deps=deps, parent=parent, fields=FIELDS,
            recipe=_recipe(name), sources=_sources(name),
            # Every fourth stage adds to a search path, as nccl or aws-ofi-nccl do.
            env_paths=_env_paths(name) if index % 4 == 0 else (lambda _ctx: {}),
        )
        used.update(deps)
        used.add(parent)
        names.append(name)
    sinks = tuple(n for n in names if n not in used)
    registry[TARGET] = Stage(name=TARGET, doc="", deps=sinks, parent=ROOT_STAGE, image=True,
                             fields={}, recipe=lambda _ctx: "RUN ldconfig")
    return registry


def synthetic_manifest(registry: Mapping[str, Stage]) -> Manifest:
    """A manifest pinning every synthetic stage, as `load` + the lock would leave it."""
    stages: dict[str, dict[str, Any]] = {}
    for number, name in enumerate(registry):
        if not registry[name].fields:
            continue
        version = f"1.{number}.0"
        stages[name] = {
            "version": version,
            "url": f"https://example.invalid/{name}/{name}-{version}.tar.gz",
            "sha256": hashlib.sha256(name.encode()).hexdigest(),
        }
    image = {"name": "synthetic", "base": "imageforge/base:bookworm", "base_digest": None,
             "platform": "linux/amd64", "cuda": "11.3", "cuda_home": "/usr/local/cuda",
             "cuda_arch": ["7.0", "8.0"], "python": "3.11", "apt": False}
    document = {"image": dict(image), "stages": {n: {"version": v["version"]}
                                                 for n, v in stages.items()}}
    return Manifest(path=Path("synthetic.toml"), image=image, stages=stages, document=document)


def plan_and_render(manifest: Manifest, registry: Mapping[str, Stage]) -> tuple[Plan, str]:
    """What `invoke render` does after loading: plan the target, join its blocks."""
    planned = make_plan(manifest, TARGET, registry)
    text = render_dockerfile(((s.name, s.recipe) for s in planned.stages),
                             manifest=str(manifest.path), target=TARGET)
    return planned, text


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaleResult:
    size: int
    shape: str
    seed: int
    edges: int
    mean_closure: float          # stages a stage needs, itself included, on average
    plan_seconds: float          # median of `runs`
    render_seconds: float        # median of `runs`
    total_seconds: float         # median of `runs`, plan + render
    runs: int
    dockerfile_bytes: int
    rss_before_mb: float         # the process after imports, before planning
    rss_peak_mb: float           # ru_maxrss at the end
    traced_peak_mb: float        # tracemalloc peak of one plan + render
    profile: tuple[dict[str, Any], ...] = ()


def measure(size: int, seed: int, *, shape: str = "wide", runs: int = 3,
            profile: int = 0) -> ScaleResult:
    registry = synthetic_registry(size, seed, shape=shape)
    manifest = synthetic_manifest(registry)
    rss_before = _maxrss_mb()
    plans: list[float] = []
    renders: list[float] = []
    text = ""
    for _ in range(runs):
        started = time.perf_counter()
        planned = make_plan(manifest, TARGET, registry)
        planned_at = time.perf_counter()
        text = render_dockerfile(((s.name, s.recipe) for s in planned.stages),
                                 manifest=str(manifest.path), target=TARGET)
        plans.append(planned_at - started)
        renders.append(time.perf_counter() - planned_at)
        # A run of seconds is measured well enough once; repeats only steady short runs.
        if plans[-1] + renders[-1] > SLOW_SECONDS:
            break
    rss_peak = _maxrss_mb()
    tracemalloc.start()
    plan_and_render(manifest, registry)
    traced_peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return ScaleResult(
        size=size, shape=shape, seed=seed, edges=sum(len(s.deps) for s in registry.values()),
        mean_closure=statistics.mean(len(closure(n, registry)) for n in registry),
        plan_seconds=statistics.median(plans), render_seconds=statistics.median(renders),
        total_seconds=statistics.median(p + r for p, r in zip(plans, renders, strict=True)),
        runs=len(plans), dockerfile_bytes=len(text.encode()), rss_before_mb=rss_before,
        rss_peak_mb=rss_peak, traced_peak_mb=traced_peak,
        profile=tuple(hotspots(manifest, registry, profile)) if profile else (),
    )


def hotspots(manifest: Manifest, registry: Mapping[str, Stage], top: int) -> list[dict[str, Any]]:
    """The functions one plan + render spends most of its own time in (cProfile)."""
    profiler = cProfile.Profile()
    profiler.runcall(plan_and_render, manifest, registry)
    stats = pstats.Stats(profiler)
    rows: list[dict[str, Any]] = []
    # pstats keeps (file, line, function) -> (primitive calls, calls, own time, cumulative, ...)
    for (path, line, function), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(path).name}:{line}({function})", "calls": calls,
                     "own_seconds": round(own, 4), "cumulative_seconds": round(cumulative, 4)})
    rows.sort(key=lambda r: r["own_seconds"], reverse=True)
    return rows[:top]


def _maxrss_mb() -> float:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.synthetic",
                                     description="plan + render one synthetic stage graph")
    parser.add_argument("size", type=int, help="number of stages, root and image included")
    parser.add_argument("--shape", choices=list(SHAPES), default="wide",
                        help="wide: dependencies drawn from all earlier stages; deep: from the "
                             "10 before")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--runs", type=int, default=3, help="timed runs (median reported)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also report the N functions with the most own time")
    args = parser.parse_args(argv)
    result = measure(args.size, args.seed, shape=args.shape, runs=args.runs,
                     profile=args.profile)
    json.dump(dataclasses.asdict(result), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

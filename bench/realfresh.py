"""`make bench-real`'s fresh-runner part: the no-op and the EFA bump on the real efa-nccl image,
imageforge --remote against BuildKit's registry cache, each build on an engine emptied as a CI
runner starts. The setup is bench/fresh.py's: one real registry (htpasswd auth) on the host's
engine on 127.0.0.1, each tool's series on a new engine holding only the CUDA base image,
emptied before every timed build, and the registry's own network counters for the bytes.

BuildKit builds imageforge's rendered Dockerfile of the target (`invoke render`) with
`--cache-from type=registry,ref=.../buildkit-cache:base` and `--cache-to ...,mode=max`, as in
the sample's fresh scenarios.

Each tool's series starts from an empty registry with its cold build at the first EFA version
(a real NCCL compile, about 10 minutes on 2 cores), which fills the registry as a first CI run
would. The registry is not filled from this host's warm engine: after such a fill, BuildKit's
EFA bump on a fresh engine recompiled NCCL (all 8 steps, 355 s), a cause not pinned down, and
no first CI run starts from a warm cache. Every engine here runs on a containerd of its own,
so no blob reaches a build without crossing the network.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import fresh
from bench.fresh import FRESH_BUILDKIT, FRESH_IMAGEFORGE, FreshMeasurement, Registry
from bench.rawjson import layer_steps, parse_stream
from bench.report import seconds

if TYPE_CHECKING:
    from bench.real import RealBench

IMAGEFORGE_REPOSITORY = "imageforge-cache"
# What a runner's set-up (`make setup`) leaves on its engine besides the manifest's base: the
# local base image imageforge's SBOM generator is built from for `build --push`
# (sbom/Dockerfile). Without it the first push fails to build the generator.
SETUP_IMAGES = ("imageforge/base:bookworm",)
BUILDKIT_CACHE = "buildkit-cache"


def _traffic(reg: Registry, build: Callable[[], Any]) -> tuple[Any, int, int]:
    """(what `build` returned, bytes pushed to the registry, bytes pulled from it)."""
    before = reg.traffic()
    found = build()
    after = reg.traffic()
    return found, after[0] - before[0], after[1] - before[1]


def _imageforge_env(reg: Registry) -> dict[str, str]:
    return {"IMAGEFORGE_REGISTRY_USER": fresh.REGISTRY_USER,
            "IMAGEFORGE_REGISTRY_PASSWORD": reg.password}


def _rendered(bench: RealBench, efa: str) -> tuple[Path, dict[str, str]]:
    """The rendered Dockerfile of the target at EFA `efa`, and its sources as named contexts."""
    overrides = ("--set", f"stages.efa.version={efa}")
    _, _, out = bench.invoke("render", "--manifest", str(bench.manifest), "--target",
                             bench.target, *overrides, stdout=True)
    dockerfile = bench.work / "fresh" / f"rendered-{efa}.Dockerfile"
    dockerfile.parent.mkdir(parents=True, exist_ok=True)
    dockerfile.write_bytes(out)
    return dockerfile, bench.sources(efa)


def _buildkit(bench: RealBench, reg: Registry, efa: str, writes: str, push: bool
              ) -> tuple[float, float, list[Any]]:
    """(wall seconds, busy CPU seconds, layer steps) of BuildKit's build at EFA `efa`;
    `push`: pushed to the registry instead of loaded."""
    dockerfile, contexts = _rendered(bench, efa)
    cache = f"{reg.address}/{BUILDKIT_CACHE}"
    tag = f"{reg.address}/real-buildkit:fresh" if push else f"imageforge-bench/real-fresh:{efa}"
    argv = ["docker", "buildx", "build", "--push" if push else "--load", "--progress",
            "rawjson", "-f", str(dockerfile), "--target", bench.target, "-t", tag,
            "--cache-from", f"type=registry,ref={cache}:base",
            "--cache-to", f"type=registry,ref={cache}:{writes},mode=max",
            *bench.secret_args(),
            *[f"--build-context={name}={path}" for name, path in sorted(contexts.items())]]
    empty = bench.work / "empty"
    empty.mkdir(exist_ok=True)
    wall, busy, stream = bench.timed([*argv, str(empty)],
                                     {**os.environ, "DOCKER_CONFIG": str(reg.config)})
    return wall, busy, layer_steps(parse_stream(stream))


def measure_imageforge(bench: RealBench, reg: Registry, keep: Sequence[str], scenario: str,
                       label: str, efa: str, expected: list[str], repeats: int,
                       push: bool = False) -> FreshMeasurement:
    """`push`: each build pushes the image instead of loading it, after one unmeasured build
    that pushes it first (bench/fresh.py's no-op-push)."""
    m = FreshMeasurement(tool=FRESH_IMAGEFORGE, scenario=scenario, label=label,
                         expected=expected)
    pushing = ["--push", "--tag", f"{reg.address}/real-imageforge:fresh"] if push else []
    for run_number in range(repeats + push):
        fresh.empty_engine(bench.cache, keep, [bench.work / "xdg-cache"])
        (wall, busy, _), pushed, pulled = _traffic(reg, lambda: bench.invoke(
            "build", "--manifest", str(bench.manifest), "--target", bench.target, "--no-test",
            "--progress", "plain", "--remote", f"{reg.address}/{IMAGEFORGE_REPOSITORY}",
            "--set", f"stages.efa.version={efa}", *pushing, env=_imageforge_env(reg)))
        if push and run_number == 0:
            continue
        report: dict[str, Any] = json.loads(max(
            (bench.cache / "reports").glob("*.json"), key=lambda p: p.stat().st_mtime
        ).read_text())
        m.seconds.append(round(wall, 3))
        m.cpu_seconds.append(round(busy, 3))
        m.pushed_bytes.append(pushed)
        m.pulled_bytes.append(pulled)
        m.report_states = {s["name"]: s["state"] for s in report["stages"]}
        m.phases = {k: float(v) for k, v in report.get("phases", {}).items()}
        m.rebuilt = [name for name, state in m.report_states.items() if state == "built"]
        m.rebuilt_units, m.total_units = len(m.rebuilt), len(m.report_states)
    if not m.as_expected:
        m.faults.append("rebuilt " + (", ".join(m.rebuilt) or "nothing") + ", the graph says "
                        + (", ".join(m.expected) or "nothing"))
        m.notes.append(m.faults[-1])
    bench.say(f"fresh runner, imageforge {label}: {seconds(m.median_seconds)} s, rebuilt "
              f"{', '.join(m.rebuilt) or 'nothing'}, pulled {fresh.mb(m.pulled_bytes)} MB, "
              f"pushed {fresh.mb(m.pushed_bytes)} MB")
    return m


def measure_buildkit(bench: RealBench, reg: Registry, keep: Sequence[str], scenario: str,
                     label: str, efa: str, repeats: int, push: bool = False
                     ) -> FreshMeasurement:
    """`push`: as measure_imageforge's."""
    m = FreshMeasurement(tool=FRESH_BUILDKIT, scenario=scenario, label=label, unit="layers")
    # Only the cold build writes `base`, as in bench/fresh.py (measure_buildkit says why).
    writes = "base" if scenario == "cold" else scenario
    for run_number in range(repeats + push):
        fresh.empty_engine(bench.cache, keep, [bench.work / "xdg-cache"])
        (wall, busy, steps), pushed, pulled = _traffic(
            reg, lambda: _buildkit(bench, reg, efa, writes, push))
        if push and run_number == 0:
            continue
        m.seconds.append(round(wall, 3))
        m.cpu_seconds.append(round(busy, 3))
        m.pushed_bytes.append(pushed)
        m.pulled_bytes.append(pulled)
        m.rebuilt_units = sum(1 for s in steps if s.rebuilt)
        m.total_units = len(steps)
    bench.say(f"fresh runner, BuildKit registry cache {label}: {seconds(m.median_seconds)} s, "
              f"ran {m.rebuilt_units}/{m.total_units} steps, pulled {fresh.mb(m.pulled_bytes)} "
              f"MB, pushed {fresh.mb(m.pushed_bytes)} MB")
    return m


def run(bench: RealBench, reg: Registry, base: str, efa_from: str, efa_to: str,
        expected: list[str], repeats: int = 3) -> list[FreshMeasurement]:
    """Each tool on an engine of its own, from an empty registry: the cold build at
    `efa_from` (what fills the registry), the no-op (median of `repeats`), loading the image
    and pushing it, and the bump to `efa_to`."""
    bump = f"efa {efa_from} → {efa_to}"
    cold = [*expected[:1], "nccl", *expected[1:]]
    found: list[FreshMeasurement] = []
    keep = [base, *SETUP_IMAGES]
    reg.fresh()
    with fresh.new_engine(bench.work, "fresh-imageforge", keep):
        found.append(measure_imageforge(bench, reg, keep, "cold", "cold build", efa_from,
                                        cold, 1))
        found.append(measure_imageforge(bench, reg, keep, "no-op", "no-op rebuild", efa_from,
                                        [], repeats))
        found.append(measure_imageforge(bench, reg, keep, "no-op-push", fresh.NOOP_PUSH,
                                        efa_from, [], repeats, push=True))
        found.append(measure_imageforge(bench, reg, keep, "efa", bump, efa_to, expected, 1))
    reg.fresh()
    with fresh.new_engine(bench.work, "fresh-buildkit", keep):
        found.append(measure_buildkit(bench, reg, keep, "cold", "cold build", efa_from, 1))
        found.append(measure_buildkit(bench, reg, keep, "no-op", "no-op rebuild", efa_from,
                                      repeats))
        found.append(measure_buildkit(bench, reg, keep, "no-op-push", fresh.NOOP_PUSH,
                                      efa_from, repeats, push=True))
        found.append(measure_buildkit(bench, reg, keep, "efa", bump, efa_to, 1))
    return found

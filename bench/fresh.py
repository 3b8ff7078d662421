"""The fresh-runner scenarios: imageforge with its remote cache against BuildKit's own registry
cache, each build on an engine emptied as a CI runner starts.

What a team would pick instead of imageforge on an ephemeral runner is not a warm local cache
but `docker buildx build` with `--cache-from/--cache-to type=registry,mode=max`. Both tools
here build imageforge's rendered Dockerfile's image from the same sources, on the benchmark's
own engine, against one real registry (distribution with htpasswd auth, the integration tests'
image, on the host's engine, published on 127.0.0.1):

- each tool's series runs on a Docker engine of its own, started for it (see new_engine), and
  before every timed build that engine is emptied: BuildKit's cache pruned, every image but
  the run's base image removed (imageforge's artifact images included), imageforge's artifact
  store and up-to-date record deleted. The fetched sources stay, for both: BuildKit needs them
  as build contexts even when every step is cached.
- imageforge: `imageforge build --remote REGISTRY/imageforge-cache`: it pulls the artifacts of
  the stages it reuses, builds the rest and pushes them.
- BuildKit: `docker buildx build --load` of the rendered Dockerfile with
  `--cache-from type=registry,ref=REGISTRY/buildkit-cache:base` and `--cache-to ...,mode=max`
  (the cold build exports to `base`; every other build to a ref of its own, as CI runs of a
  branch read main's cache and write their own: a no-op that exported into `base` again
  degraded it, see `measure_buildkit`).
- the no-op is measured twice: loading the image into the engine (as the builds above do), and
  pushing it to the registry instead (`--push`; `buildx build --push`), a CI run's usual end.
  For the latter one unmeasured build first pushes the image, as the run before would have.
- bytes pulled and pushed are the registry container's own network counters around each build.

The registry is emptied (a new container) before each tool's cold build only: the no-op and
the one-pin changes find what that tool's cold build pushed.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import requests

from bench.engine import serving
from bench.report import Measurement, Target, markdown_table, seconds

if TYPE_CHECKING:
    from bench.run import Bench, PinChange

ROOT = Path(__file__).resolve().parents[1]
# The integration tests' registry image (Debian's docker-registry on the local base image):
# nothing can be pulled here, so it is built locally, as they build it.
REGISTRY_CONTEXT = ROOT / "tests" / "integration" / "registry"
REGISTRY_IMAGE = "imageforge-bench/registry:1"
REGISTRY_USER = "imageforge"
FRESH_IMAGEFORGE = "imageforge --remote"
FRESH_BUILDKIT = "buildkit registry cache"
NOOP_LIMIT = 0.3
# A CI run's usual end: the image pushed to a registry, not loaded on the runner.
NOOP_PUSH = "no-op rebuild, pushing the image"
ONE_PIN_LIMIT = 0.5
COLD_LIMIT = 1.0


class Registry:
    """A registry container on the host's engine (never the benchmark's, which is emptied),
    its port published on 127.0.0.1; `fresh()` replaces it with an empty one."""

    def __init__(self, work: Path) -> None:
        # The host's engine as it is before the benchmark points DOCKER_HOST at its own.
        self.env = dict(os.environ)
        self.password = "pw-" + secrets.token_hex(12)
        self.name = f"imageforge-bench-registry-{uuid.uuid4().hex[:8]}"
        self.address = ""
        self.config = work / "docker-config"

    def docker(self, *args: str, timeout: float = 600) -> str:
        proc = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True,
                              check=False, timeout=timeout)
        if proc.returncode != 0:
            # bench.run imports this module: its error is imported where it is raised.
            from bench.run import BenchError

            raise BenchError(f"docker {args[0]} for the benchmark's registry failed: "
                             f"{proc.stderr.strip()[-400:]}")
        return proc.stdout

    def start(self) -> None:
        self.docker("build", "--quiet", "-t", REGISTRY_IMAGE, str(REGISTRY_CONTEXT))
        self.fresh()

    def fresh(self) -> None:
        """An empty registry (a new container) on a new port."""
        self.stop()
        self.docker("run", "-d", "--name", self.name, "-p", "127.0.0.1::5000",
                    "-e", f"REGISTRY_USER={REGISTRY_USER}",
                    "-e", f"REGISTRY_PASSWORD={self.password}", REGISTRY_IMAGE)
        port = self.docker("port", self.name, "5000/tcp").split(":")[-1].strip()
        self.address = f"127.0.0.1:{port}"
        self.config.mkdir(parents=True, exist_ok=True)
        auth = base64.b64encode(f"{REGISTRY_USER}:{self.password}".encode()).decode()
        (self.config / "config.json").write_text(
            json.dumps({"auths": {self.address: {"auth": auth}}}))
        deadline = time.monotonic() + 60
        while not self._answers():
            if time.monotonic() > deadline:
                from bench.run import BenchError

                raise BenchError(f"the benchmark's registry on {self.address} did not answer")
            time.sleep(0.3)

    def _answers(self) -> bool:
        try:
            return requests.get(f"http://{self.address}/v2/", timeout=2).status_code == 401
        except requests.RequestException:
            return False

    def traffic(self) -> tuple[int, int]:
        """(bytes the registry received, bytes it sent) since it started: what clients
        pushed and pulled, HTTP and TCP overhead included."""
        out = self.docker("exec", self.name, "cat", "/sys/class/net/eth0/statistics/rx_bytes",
                          "/sys/class/net/eth0/statistics/tx_bytes")
        received, sent = (int(v) for v in out.split())
        return received, sent

    def stop(self) -> None:
        subprocess.run(["docker", "rm", "--force", "--volumes", self.name], env=self.env,
                       capture_output=True, check=False, timeout=120)


@contextmanager
def registry(work: Path, enabled: bool) -> Iterator[Registry | None]:
    if not enabled:
        yield None
        return
    found = Registry(work)
    try:
        found.start()
        yield found
    finally:
        found.stop()


@dataclasses.dataclass(kw_only=True)
class FreshMeasurement(Measurement):
    """A fresh-runner build: its time, what it rebuilt, and the registry's traffic."""

    pushed_bytes: list[int] = dataclasses.field(default_factory=list)
    pulled_bytes: list[int] = dataclasses.field(default_factory=list)


def empty_engine(cache: Path, keep: Sequence[str], scratch: Sequence[Path] = ()) -> None:
    """The current engine as a fresh runner has it: no BuildKit cache, no image but `keep`
    (the base image), no imageforge cache in `cache` but the fetched sources, and none of
    the `scratch` directories."""
    run = subprocess.run
    pruned = run(["docker", "buildx", "prune", "--all", "--force"], capture_output=True,
                 text=True, check=False, timeout=600)
    if pruned.returncode != 0:
        from bench.run import BenchError

        raise BenchError(f"docker buildx prune failed: {pruned.stderr.strip()[-400:]}")
    kept = set()
    for ref in keep:
        proc = run(["docker", "image", "inspect", "--format", "{{.Id}}", ref],
                   capture_output=True, text=True, check=False)
        kept.add(proc.stdout.strip())
    listed = run(["docker", "image", "ls", "--all", "--no-trunc", "--format",
                  "{{.ID}} {{.Repository}}:{{.Tag}}"], capture_output=True, text=True,
                 check=False).stdout.split("\n")
    doomed = sorted({ref if not ref.endswith("<none>:<none>") else image
                     for image, _, ref in (line.partition(" ") for line in listed if line)
                     if image not in kept})
    if doomed:
        run(["docker", "image", "rm", "--force", *doomed], capture_output=True, check=False,
            timeout=600)
    for entry in cache.iterdir() if cache.exists() else []:
        if entry.name != "sources":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for directory in scratch:
        shutil.rmtree(directory, ignore_errors=True)


def measure_imageforge(bench: Bench, reg: Registry, keep: Sequence[str], scenario: str, label: str,
                       expected: list[str], overrides: Sequence[str] = (),
                       repeats: int = 1, push: bool = False) -> FreshMeasurement:
    """`push`: each build pushes the image to the registry instead of loading it; a first,
    unmeasured build pushes it there, as the CI run before would have."""
    m = FreshMeasurement(tool=FRESH_IMAGEFORGE, scenario=scenario, label=label,
                         expected=expected)
    env = {"IMAGEFORGE_REGISTRY_USER": REGISTRY_USER, "IMAGEFORGE_REGISTRY_PASSWORD":
           reg.password}
    tag = f"{reg.address}/app-imageforge:fresh" if push else None
    for run_number in range(repeats + push):
        empty_engine(bench.cache, keep, [bench.work / "xdg-cache"])
        before = reg.traffic()
        timed, report = bench.imageforge_build(
            f"fresh-{scenario}", overrides, remote=f"{reg.address}/imageforge-cache", env=env,
            push=tag)
        after = reg.traffic()
        if push and run_number == 0:
            continue
        m.seconds.append(round(timed.seconds, 3))
        m.cpu_seconds.append(round(timed.cpu_seconds, 3))
        m.pushed_bytes.append(after[0] - before[0])
        m.pulled_bytes.append(after[1] - before[1])
        m.report_states = {s["name"]: s["state"] for s in report["stages"]}
        m.phases = {k: float(v) for k, v in report.get("phases", {}).items()}
        m.rebuilt = [name for name, state in m.report_states.items() if state == "built"]
        m.rebuilt_units, m.total_units = len(m.rebuilt), len(m.report_states)
    if not m.as_expected:
        m.faults.append("rebuilt " + (", ".join(m.rebuilt) or "nothing") + ", the graph says "
                        + (", ".join(m.expected) or "nothing"))
        m.notes.append(m.faults[-1])
    bench.say(f"fresh runner, imageforge {label}: {seconds(m.median_seconds)} s, rebuilt "
              f"{', '.join(m.rebuilt) or 'nothing'}, pulled {mb(m.pulled_bytes)} MB, "
              f"pushed {mb(m.pushed_bytes)} MB")
    return m


def measure_buildkit(bench: Bench, reg: Registry, keep: Sequence[str], scenario: str, label: str,
                     overrides: Sequence[str] = (), repeats: int = 1,
                     push: bool = False) -> FreshMeasurement:
    """`push`: as measure_imageforge's."""
    rendered = bench.must("invoke render", bench.invoke(
        "render", "--manifest", str(bench.manifest), "--target", "smddp",
        *[arg for o in overrides for arg in ("--set", o)]))
    dockerfile = bench.work / "fresh" / f"{scenario}.Dockerfile"
    dockerfile.parent.mkdir(parents=True, exist_ok=True)
    dockerfile.write_bytes(rendered)
    contexts = bench.fetch(overrides)
    cache = f"{reg.address}/buildkit-cache"
    # Only the cold build writes the cache the others read. Every build that exports a cache
    # it imported, fully cached, into the same ref again loses part of it: after three
    # no-op loads and two no-op pushes had rewritten `base`, the EFA bump reran NCCL, boost
    # and Python (19 of 24 steps) where it runs 13 after the cold build's `base`.
    writes = "base" if scenario == "cold" else scenario
    m = FreshMeasurement(tool=FRESH_BUILDKIT, scenario=scenario, label=label, unit="layers")
    tag = f"{reg.address}/app-buildkit:fresh" if push else \
        bench.tag(FRESH_BUILDKIT.replace(" ", "-"), scenario)
    for run_number in range(repeats + push):
        empty_engine(bench.cache, keep, [bench.work / "xdg-cache"])
        before = reg.traffic()
        timed, steps = bench.buildx(
            f"docker buildx build with the registry cache ({scenario})", dockerfile, contexts,
            tag, target="smddp",
            extra=["--cache-from", f"type=registry,ref={cache}:base",
                   "--cache-to", f"type=registry,ref={cache}:{writes},mode=max"],
            env={**os.environ, "DOCKER_CONFIG": str(reg.config)}, push=push)
        after = reg.traffic()
        if push and run_number == 0:
            continue
        m.seconds.append(round(timed.seconds, 3))
        m.cpu_seconds.append(round(timed.cpu_seconds, 3))
        m.pushed_bytes.append(after[0] - before[0])
        m.pulled_bytes.append(after[1] - before[1])
        m.rebuilt_units = sum(1 for s in steps if s.rebuilt)
        m.total_units = len(steps)
    bench.say(f"fresh runner, BuildKit registry cache {label}: {seconds(m.median_seconds)} s, "
              f"ran {m.rebuilt_units}/{m.total_units} steps, pulled {mb(m.pulled_bytes)} MB, "
              f"pushed {mb(m.pushed_bytes)} MB")
    return m


@contextmanager
def new_engine(work: Path, name: str, images: Sequence[str]) -> Iterator[None]:
    """A Docker engine never used before, on a containerd of its own (bench/engine.py says
    why), with `images` copied in from the current one, for one tool's series. Emptying an
    engine is not enough after another tool used it: once a
    plain `buildx build --load` of the same steps (with buildx's default provenance) had run
    there, imageforge's next builds failed reading their artifacts ("no processor for
    media-type application/vnd.in-toto+json"), which no runner that starts empty meets."""
    with serving(work / name, images, label=f"imageforge-bench-{name}", own_containerd=True):
        yield


def run(bench: Bench, reg: Registry, keep: Sequence[str], changes: Sequence[PinChange],
        stages: Sequence[str], dependents: Mapping[str, list[str]],
        repeats: int) -> list[FreshMeasurement]:
    """Both tools, each on an engine of its own and from an empty registry: cold, no-op
    (`repeats`), every one-pin change."""
    found: list[FreshMeasurement] = []
    reg.fresh()
    with new_engine(bench.work, "fresh-imageforge", keep):
        found.append(measure_imageforge(bench, reg, keep, "cold", "cold build", list(stages)))
        found.append(measure_imageforge(bench, reg, keep, "no-op", "no-op rebuild", [],
                                        repeats=repeats))
        found.append(measure_imageforge(bench, reg, keep, "no-op-push", NOOP_PUSH, [],
                                        repeats=repeats, push=True))
        found += [measure_imageforge(bench, reg, keep, c.stage, c.label, dependents[c.stage],
                                     c.overrides) for c in changes]
    reg.fresh()
    with new_engine(bench.work, "fresh-buildkit", keep):
        found.append(measure_buildkit(bench, reg, keep, "cold", "cold build"))
        found.append(measure_buildkit(bench, reg, keep, "no-op", "no-op rebuild",
                                      repeats=repeats))
        found.append(measure_buildkit(bench, reg, keep, "no-op-push", NOOP_PUSH,
                                      repeats=repeats, push=True))
        found += [measure_buildkit(bench, reg, keep, c.stage, c.label, c.overrides)
                  for c in changes]
    return found


def _pairs(measurements: Sequence[FreshMeasurement]
           ) -> Iterator[tuple[FreshMeasurement, FreshMeasurement]]:
    """(imageforge's, BuildKit's) measurement of each scenario both tools ran."""
    theirs = {m.scenario: m for m in measurements if m.tool == FRESH_BUILDKIT}
    for m in measurements:
        if m.tool == FRESH_IMAGEFORGE and m.scenario in theirs:
            yield m, theirs[m.scenario]


def targets(measurements: Sequence[FreshMeasurement]) -> list[Target]:
    found = []
    for m, theirs in _pairs(measurements):
        limit = NOOP_LIMIT if m.scenario.startswith("no-op") else \
            COLD_LIMIT if m.scenario == "cold" else ONE_PIN_LIMIT
        ratio = m.median_seconds / theirs.median_seconds
        found.append(Target(
            name=f"fresh runner, {m.label}: imageforge --remote vs BuildKit's registry cache",
            measured=f"{ratio:.2f}x ({seconds(m.median_seconds)} s vs "
                     f"{seconds(theirs.median_seconds)} s)",
            limit=f"≤ {limit}x", passed=ratio <= limit, timing=True))
        if not m.scenario.startswith("no-op"):
            found.append(Target(
                name=f"fresh runner, {m.label}, imageforge: rebuilds exactly its dependents",
                measured=", ".join(m.rebuilt) or "nothing", limit=", ".join(m.expected),
                passed=m.as_expected))
    return found


def table(measurements: Sequence[FreshMeasurement]) -> str:
    rows = []
    for m, theirs in _pairs(measurements):
        runs = f" (median of {len(m.seconds)})" if len(m.seconds) > 1 else ""
        rows.append([m.label + runs, seconds(m.median_seconds), seconds(theirs.median_seconds),
                     f"{m.median_seconds / theirs.median_seconds:.2f}x",
                     mb(m.pulled_bytes), mb(theirs.pulled_bytes),
                     mb(m.pushed_bytes), mb(theirs.pushed_bytes),
                     f"{m.rebuilt_units}/{m.total_units} stages"
                     + (f": {', '.join(m.rebuilt)}" if 0 < m.rebuilt_units < m.total_units
                        else ""),
                     f"{theirs.rebuilt_units}/{theirs.total_units} steps"])
    return markdown_table(
        ["fresh runner", "imageforge s", "BuildKit s", "imageforge/BuildKit",
         "imageforge pulled MB", "BuildKit pulled MB", "imageforge pushed MB",
         "BuildKit pushed MB", "imageforge rebuilt", "BuildKit ran"],
        rows, right=(1, 2, 3, 4, 5, 6, 7))


def mb(values: Sequence[int]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[len(ordered) // 2] / 1e6:.1f}"

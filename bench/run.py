"""The benchmark: imageforge against one plain Dockerfile, built from the same sources.

1. Generate the sample upstream, serve it on a free port, write a bench manifest (the sample
   manifest with NCCL pinned explicitly, on a base image salted with this run's id so no other
   build on the daemon shares its steps), lock it, fetch every source once.
   Every build runs on a Docker engine of the benchmark's own (bench/engine.py), started
   with the sample's base image copied in: pruning it empties no other project's cache.
2. imageforge: prune BuildKit's cache and start from an empty artifact cache (cold), build
   again (no-op, repeated), build the rendered Dockerfile with plain `docker buildx build`
   (BuildKit alone, fully cached: the yardstick of imageforge's own overhead), then one
   build per one-pin change (`--set` the alternative version and its pin).
3. The baseline: prune again, then the same scenarios with the linear Dockerfile.
4. Planning at scale: synthetic graphs, one fresh process per size.

Cold and one-pin builds run once: repeating them honestly needs a prune and a cold rebuild
in between. CPU is the whole machine's busy time (see bench/cpu.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from bench import cpu, fresh
from bench.baseline import SEED_ORDER, Baseline, baseline_dockerfile
from bench.engine import serving
from bench.rawjson import layer_steps, parse_stream
from bench.report import (
    BASELINE,
    BUILDKIT,
    IMAGEFORGE,
    Measurement,
    Target,
    phases_table,
    plan_table,
    scenario_table,
    seconds,
    targets_table,
    update_tables,
)
from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.errors import FatalError
from imageforge.model.dag import closure
from imageforge.model.stage import filename_of
from imageforge.planning.dockerfile import CA_BUNDLE_SECRET
from imageforge.planning.execute import is_external
from imageforge.planning.plan import Plan
from imageforge.sources import cabundle
from stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
TARGET = "smddp"
SAMPLE_MANIFEST = ROOT / "manifests" / "sample.toml"
SAMPLE_LOCK = ROOT / "manifests" / "sample.lock.json"
SAMPLE_ADDRESS = "http://127.0.0.1:8741"
TAG = "imageforge-bench"

# The other release of each component the sample upstream ships.
ALTERNATIVES: Mapping[str, str] = {
    "efa": "1.15.1",
    "nccl": "2.11.4",
    "aws-ofi-nccl": "1.2.0-aws",
    "pytorch": "1.11.0",
    "boost": "1.74.0",
    "smddp": "1.4.1",
}

# Rules a one-pin change of the sample breaks on purpose (ids from stages/*_rules.toml).
WAIVED: Mapping[str, tuple[str, ...]] = {"pytorch": ("torchvision-pytorch", "smddp-pytorch")}

# Targets the benchmark reports against.
# Speed targets (reported with pass or fail; only what was rebuilt fails the run, timings
# depend on the machine): imageforge's time over the plain Dockerfile's, side by side.
NOOP_RATIO_LIMIT = 0.5      # over a fully cached plain `docker buildx build`
ONE_PIN_RATIO_LIMIT = 1.0   # over the linear Dockerfile, every one-pin change
COLD_RATIO_LIMIT = 1.05
NOOP_SECONDS_LIMIT = 3.0
# imageforge's own time per build above BuildKit's, on the change where BuildKit does least.
OVERHEAD_SECONDS_LIMIT = 1.0
LAST_STAGE = "smddp"
PLAN_SECONDS_LIMIT = 1.0
PLAN_TARGET_SIZE = 1000
# The large graph: wide only. A deep graph's closures grow with its size, and every stage
# copies its whole closure, so a deep 10,000-stage Dockerfile alone is about a gigabyte.
LARGE_SIZE = 10_000
LARGE_SECONDS_LIMIT = 2.0
LARGE_RSS_MB_LIMIT = 300
EFA_ONLY = ("efa", "aws-ofi-nccl", "smddp")
# Scenarios that are not one-pin changes.
WHOLE = ("cold", "no-op")


class BenchError(FatalError):
    """The benchmark could not run (a build failed, Docker is missing, ...)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    repeats: int = 3                       # no-op builds per tool (the median is reported)
    out: Path = ROOT / "bench" / "results.json"
    sizes: tuple[int, ...] = (10, 100, 1000)
    large: int = LARGE_SIZE                # one more wide graph (0: none)
    shapes: tuple[str, ...] = ("wide", "deep")
    builds: bool = True                    # False: planning at scale only
    keep: bool = False                     # keep the work directory (sources, Dockerfiles)
    # "host": the host's engine, never pruned (for machines that cannot start a second
    # dockerd): cold builds are then not guaranteed cold (their notes say when BuildKit
    # served steps from its cache).
    engine: Literal["own", "host"] = "own"
    # The fresh-runner scenarios (bench/fresh.py): imageforge --remote against BuildKit's
    # registry cache, each build on an emptied engine. Only on the benchmark's own engine.
    fresh: bool = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class PinChange:
    stage: str
    old: str
    new: str
    overrides: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.stage} {self.old} → {self.new}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timed:
    seconds: float
    cpu_seconds: float
    stdout: bytes
    stderr: bytes


# ----------------------------------------------------------------------------- scenarios


def pin_changes(manifest: Path, pins: Mapping[str, Any]) -> list[PinChange]:
    """One change per component: its alternative version plus that version's pin (sha256 of
    the file, or the commit of the tag) read from the sample's pins.json."""
    document = tomllib.loads(manifest.read_text())["stages"]
    changes = []
    for stage, new in ALTERNATIVES.items():
        table = document[stage]
        fields = STAGES[stage].fields
        overrides = [f"stages.{stage}.version={new}"]
        if "url" in table:
            url = (str(table["url"]).replace("{version}", new)
                   .replace("{version_underscored}", new.replace(".", "_")))
            overrides.append(f"stages.{stage}.sha256="
                             f"{pins['files'][filename_of(url)]['sha256']}")
        else:
            repo = str(table["repo"]).rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
            ref = str(table.get("ref") or fields["ref"].default).replace("{version}", new)
            overrides.append(f"stages.{stage}.commit={pins['repos'][repo]['tags'][ref]}")
        if stage == "nccl":
            # Any NCCL but the one PyTorch pins needs a stated reason (`invoke check`).
            overrides.append("stages.nccl.differs_from_pytorch=benchmark: a one-pin NCCL bump")
        # Every command enforces the compatibility rules; the sample ships one torchvision
        # and one SMDDP wheel, both for PyTorch 1.10, so a PyTorch bump alone waives them.
        overrides += [f"waive.{rule}=benchmark: a one-pin {stage} bump"
                      for rule in WAIVED.get(stage, ())]
        changes.append(PinChange(stage=stage, old=str(table["version"]), new=new,
                                 overrides=tuple(overrides)))
    return changes


def bench_manifest(base_url: str, pins: Mapping[str, Any], base: str | None = None) -> str:
    """manifests/sample.toml served from `base_url`, with NCCL pinned explicitly and, when
    given, another base image.

    "auto" is resolved by the lock, and a lock applies only to the exact manifest it was
    written for: under any --set it is stale, so every pin must be in the manifest itself
    for a one-pin change to touch that pin alone."""
    text = SAMPLE_MANIFEST.read_text().replace(SAMPLE_ADDRESS, base_url)
    pytorch_pin = json.loads(SAMPLE_LOCK.read_text())["nccl_pytorch_pin"]["version"]
    commit = pins["repos"]["nccl"]["tags"][f"v{pytorch_pin}-1"]
    edits = {'version = "auto"\n': f'version = "{pytorch_pin}"\ncommit = "{commit}"\n'}
    if base:
        edits[f'base = "{sample_base()}"\n'] = f'base = "{base}"\n'
    for old, new in edits.items():
        if text.count(old) != 1:
            raise BenchError(f"{SAMPLE_MANIFEST}: expected one `{old.strip()}`.")
        text = text.replace(old, new)
    header = ("# Benchmark manifest written by `invoke bench`: manifests/sample.toml served from "
              f"{base_url},\n# NCCL pinned to the release PyTorch pins ({pytorch_pin})"
              + (f", base image {base}" if base else "") + ".\n\n")
    return header + text


def sample_base() -> str:
    return str(tomllib.loads(SAMPLE_MANIFEST.read_text())["image"]["base"])


def graph_dependents(stage: str, target: str = TARGET) -> list[str]:
    """`stage` and every stage of `target` that needs it, in plan order: what a change of
    `stage` must rebuild according to the dependency graph."""
    return [name for name in closure(target, STAGES) if stage in closure(name, STAGES)]


# ----------------------------------------------------------------------------- running


class Bench:
    def __init__(self, options: Options, work: Path) -> None:
        self.options = options
        self.work = work
        self.cache = work / "cache"
        self.manifest = work / "manifests" / "bench.toml"
        self.empty = work / "empty-context"
        self.tags: list[str] = []
        self.started = time.perf_counter()

    # -- helpers

    def say(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.started:7.1f}s] {text}", file=sys.stderr,
              flush=True)

    def invoke(self, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[bytes]:
        env = {**os.environ, "INVOKE_IMAGEFORGE_CACHE_DIR": str(self.cache)}
        argv = [sys.executable, "-m", "invoke", "-r", str(ROOT), *args]
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=timeout,
                              check=False)

    def must(self, what: str, proc: subprocess.CompletedProcess[bytes]) -> bytes:
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.decode(errors="replace").strip().splitlines()[-15:])
            raise BenchError(f"{what} failed (exit {proc.returncode}):\n{tail}")
        return proc.stdout

    def timed(self, what: str, argv: Sequence[str], env: Mapping[str, str] | None = None
              ) -> Timed:
        before = cpu.read_ticks()
        started = time.perf_counter()
        proc = subprocess.run(list(argv), cwd=ROOT, env=dict(env) if env else None,
                              capture_output=True, timeout=3600, check=False)
        elapsed = time.perf_counter() - started
        busy = cpu.busy_seconds(before, cpu.read_ticks())
        self.must(what, proc)
        return Timed(seconds=elapsed, cpu_seconds=busy, stdout=proc.stdout, stderr=proc.stderr)

    def settings(self, overrides: Sequence[str] = ()) -> Workspace:
        return Workspace(registry=STAGES, manifest=self.manifest,
                                overrides=tuple(overrides), cache_dir=self.cache)

    def plan(self, overrides: Sequence[str] = ()) -> Plan:
        return project.plan(self.settings(overrides), TARGET)

    def fetch(self, overrides: Sequence[str] = ()) -> dict[str, str]:
        """`invoke fetch`: every source of the target, verified, as named-context paths."""
        sets = [arg for o in overrides for arg in ("--set", o)]
        out = self.must("invoke fetch", self.invoke("fetch", "--manifest", str(self.manifest),
                                                    "--target", TARGET, *sets))
        contexts = {}
        for line in out.decode().splitlines():
            name, _, path = line.strip().partition(" ")
            if name.startswith("src-") and Path(path.strip()).is_dir():
                contexts[name] = path.strip()
        return contexts

    def check(self, overrides: Sequence[str] = ()) -> str:
        """`invoke check` on the scenario: "ok", or its first complaint."""
        sets = [arg for o in overrides for arg in ("--set", o)]
        proc = self.invoke("check", "--manifest", str(self.manifest), *sets)
        if proc.returncode == 0:
            return "ok"
        lines = [ln.strip() for ln in proc.stderr.decode(errors="replace").splitlines()
                 if ln.strip().startswith("[")]
        return "; ".join(lines) or proc.stderr.decode(errors="replace").strip()[:300]

    def prune(self) -> None:
        """Empty the benchmark engine's BuildKit cache: a cold build finds nothing, whoever
        built it before. The host's engine is never pruned."""
        if self.options.engine == "host":
            self.say("on the host's engine: not pruning; cold builds may find cached steps")
            return
        self.say("docker buildx prune --all --force on the benchmark's own engine (cold start)")
        proc = subprocess.run(["docker", "buildx", "prune", "--all", "--force"],
                              capture_output=True, check=False, timeout=600)
        self.must("docker buildx prune", proc)

    def salted_base(self, run_id: str) -> str:
        """The sample's base image plus one file naming this run. Every step built on it
        has cache keys of this run alone: the sample upstream is deterministic, so another
        build of it on the same daemon (tests, a demo) would otherwise produce the very
        steps this benchmark is about to time, even right after a prune."""
        ref = self.tag("base", run_id)
        dockerfile = self.work / "base.Dockerfile"
        dockerfile.write_text(f"FROM {sample_base()}\n"
                              f"RUN echo {run_id} > /etc/imageforge-bench-run\n")
        self.must("building the benchmark's base image", subprocess.run(
            ["docker", "buildx", "build", "--load", "--progress", "quiet", "-f",
             str(dockerfile), "-t", ref, str(self.empty)],
            capture_output=True, check=False, timeout=600))
        return ref

    def tag(self, tool: str, scenario: str) -> str:
        tag = f"{TAG}/{tool}:{scenario}"
        if tag not in self.tags:
            self.tags.append(tag)
        return tag

    # -- imageforge

    def imageforge_build(self, scenario: str, overrides: Sequence[str] = (), *,
                         remote: str | None = None, env: Mapping[str, str] | None = None,
                         push: str | None = None) -> tuple[Timed, dict[str, Any]]:
        """`push`: a registry tag to build and push the image as (`--push`) instead of
        loading it into the engine under the bench's own tag."""
        reports = self.cache / "reports"
        seen = set(reports.glob("*.json")) if reports.exists() else set()
        sets = [arg for o in overrides for arg in ("--set", o)]
        # The `imageforge` command, as users run it: it answers an up-to-date build from its
        # record (imageforge/uptodate.py), kept in the work directory.
        argv = [str(Path(sys.executable).with_name("imageforge")), "build", "--manifest",
                str(self.manifest), "--target", TARGET, "--no-test", "--progress", "plain",
                "--tag", push or self.tag(IMAGEFORGE, scenario), *sets,
                *(["--remote", remote] if remote else []), *(["--push"] if push else [])]
        timed = self.timed(f"invoke build ({scenario})", argv, {
            **os.environ, "INVOKE_IMAGEFORGE_CACHE_DIR": str(self.cache),
            "XDG_CACHE_HOME": str(self.work / "xdg-cache"), **(env or {})})
        new = sorted(set(reports.glob("*.json")) - seen)
        if not new:
            raise BenchError(f"invoke build ({scenario}) wrote no report in {reports}.")
        report: dict[str, Any] = json.loads(new[-1].read_text())
        return timed, report

    def measure_imageforge(self, scenario: str, label: str, expected: list[str],
                           overrides: Sequence[str] = (), repeats: int = 1) -> Measurement:
        """Stages rebuilt are the artifacts the build added to imageforge's store (a stage
        is stored under its key exactly when this build made it); the report's per-stage
        states are kept beside them and every disagreement is noted."""
        m = Measurement(tool=IMAGEFORGE, scenario=scenario, label=label, expected=expected)
        store = self.settings().store
        for _ in range(repeats):
            before = {e.key for e in store.all_entries()}
            timed, report = self.imageforge_build(scenario, overrides)
            added = {e.stage for e in store.all_entries() if e.key not in before}
            m.seconds.append(round(timed.seconds, 3))
            m.cpu_seconds.append(round(timed.cpu_seconds, 3))
            m.report_states = {s["name"]: s["state"] for s in report["stages"]}
            m.phases = {k: float(v) for k, v in report.get("phases", {}).items()}
            m.rebuilt = [name for name in m.report_states if name in added]
            m.rebuilt_units, m.total_units = len(m.rebuilt), len(m.report_states)
            for note in report_disagreements(m.report_states, m.rebuilt):
                m.faults.append(note)
                if note not in m.notes:
                    m.notes.append(note)
        self.say(f"imageforge {label}: {seconds(m.median_seconds)} s, rebuilt "
                 f"{', '.join(m.rebuilt) or 'nothing'}")
        return m

    # -- plain BuildKit (the baseline, and imageforge's rendered Dockerfile)

    def buildx(self, what: str, dockerfile: Path, contexts: Mapping[str, str], tag: str,
               target: str | None = None, *, extra: Sequence[str] = (),
               env: Mapping[str, str] | None = None, push: bool = False
               ) -> tuple[Timed, list[Any]]:
        """`push`: push the image as `tag` (a registry's) instead of loading it."""
        argv = ["docker", "buildx", "build", "--push" if push else "--load",
                "--progress", "rawjson",
                "-f", str(dockerfile), "-t", tag]
        if target:
            argv += ["--target", target]
        for name, path in sorted(contexts.items()):
            argv += ["--build-context", f"{name}={path}"]
        bundle = cabundle.resolve(None)
        if bundle:
            # The CA bundle `invoke build` hands its pip steps, so both tools reach PyPI alike.
            argv += ["--secret", f"id={CA_BUNDLE_SECRET},src={bundle}"]
        argv += [*extra, str(self.empty)]
        timed = self.timed(what, argv, env)
        return timed, layer_steps(parse_stream(timed.stderr))

    def measure_baseline(self, scenario: str, label: str, overrides: Sequence[str],
                         expected_from: str | None, repeats: int = 1) -> Measurement:
        baseline = baseline_dockerfile(self.plan(overrides), STAGES)
        contexts = self.fetch(overrides)
        dockerfile = self.work / "baseline" / f"{scenario}.Dockerfile"
        dockerfile.parent.mkdir(parents=True, exist_ok=True)
        dockerfile.write_text(baseline.dockerfile)
        expected = (baseline.sections() if expected_from == "*" else
                    baseline.from_section(expected_from) if expected_from else [])
        m = Measurement(tool=BASELINE, scenario=scenario, label=label, unit="layers",
                        expected=expected)
        for _ in range(repeats):
            timed, steps = self.buildx(f"baseline build ({scenario})", dockerfile,
                                       {n: contexts[n] for n in baseline.contexts},
                                       self.tag(BASELINE, scenario))
            m.seconds.append(round(timed.seconds, 3))
            m.cpu_seconds.append(round(timed.cpu_seconds, 3))
            m.rebuilt = _sections(baseline, [s.step for s in steps if s.rebuilt])
            m.rebuilt_units = sum(1 for s in steps if s.rebuilt)
            m.total_units = len(baseline.layers)
        self.say(f"baseline {label}: {seconds(m.median_seconds)} s, rebuilt "
                 f"{m.rebuilt_units}/{m.total_units} layers")
        return m

    def measure_buildkit_noop(self, repeats: int) -> Measurement:
        """A plain `docker buildx build` of imageforge's rendered Dockerfile, after
        imageforge built it: BuildKit's own time for a fully cached build of the image."""
        rendered = self.must("invoke render", self.invoke(
            "render", "--manifest", str(self.manifest), "--target", TARGET))
        dockerfile = self.work / "rendered.Dockerfile"
        dockerfile.write_bytes(rendered)
        contexts = self.fetch()
        m = Measurement(tool=BUILDKIT, scenario="no-op", unit="layers",
                        label="plain docker buildx build of the rendered Dockerfile")
        for attempt in range(repeats + 1):
            timed, steps = self.buildx("docker buildx build (rendered)", dockerfile, contexts,
                                       self.tag(BUILDKIT, "no-op"), target=TARGET)
            ran = [s for s in steps if s.rebuilt]
            if attempt == 0:
                # The first build may still export what imageforge's bake did not; only the
                # fully cached repeats measure BuildKit's no-op.
                if ran:
                    m.notes.append(f"warm-up ran {len(ran)} step(s) BuildKit had not cached")
                continue
            m.seconds.append(round(timed.seconds, 3))
            m.cpu_seconds.append(round(timed.cpu_seconds, 3))
            m.rebuilt_units, m.total_units = len(ran), len(steps)
        self.say(f"buildkit no-op (rendered Dockerfile): {seconds(m.median_seconds)} s")
        return m


def report_disagreements(states: Mapping[str, str], built: Sequence[str]) -> list[str]:
    """Where imageforge's build report states something other than what the artifact store
    shows: a stage it stored is "built", every other stage came from the store ("cached")."""
    wrong = [f"{name} {state}" + (" (stored new)" if name in built else " (from the store)")
             for name, state in states.items()
             if state != ("built" if name in built else "cached")]
    return [f"build report says {', '.join(wrong)} after a successful build"] if wrong else []


def _sections(baseline: Baseline, steps: Sequence[int]) -> list[str]:
    found = {baseline.section_of_step(s) for s in steps}
    return [name for name in baseline.sections() if name in found]


# ----------------------------------------------------------------------------- planning


def plan_at_scale(sizes: Sequence[int], shapes: Sequence[str]) -> list[dict[str, Any]]:
    """One fresh interpreter per graph, so peak memory is that graph's alone; graphs over the
    limit are profiled."""
    rows = []
    for shape in shapes:
        for size in sizes:
            argv = [sys.executable, "-m", "bench.synthetic", str(size), "--shape", shape]
            proc = subprocess.run(argv, cwd=ROOT, capture_output=True, check=False,
                                  timeout=1800)
            if proc.returncode != 0:
                raise BenchError(f"{' '.join(argv[1:])} failed:\n"
                                 f"{proc.stderr.decode(errors='replace')[-2000:]}")
            row: dict[str, Any] = json.loads(proc.stdout)
            if row["total_seconds"] > PLAN_SECONDS_LIMIT:
                profiled = subprocess.run([*argv, "--runs", "1", "--profile", "8"], cwd=ROOT,
                                          capture_output=True, check=True, timeout=1800)
                row["profile"] = json.loads(profiled.stdout)["profile"]
            rows.append(row)
            print(f"plan {size:>5} stages ({shape}): {row['total_seconds']:.3f} s, "
                  f"peak RSS {row['rss_peak_mb']:.0f} MB", file=sys.stderr, flush=True)
    return rows


# ----------------------------------------------------------------------------- targets


def evaluate(measurements: Sequence[Measurement], buildkit: Measurement | None,
             plans: Sequence[Mapping[str, Any]], chain: Sequence[str]) -> list[Target]:
    by_key = {(m.tool, m.scenario): m for m in measurements}
    targets = []
    noop = by_key.get((IMAGEFORGE, "no-op"))
    if noop and buildkit:
        ratio = noop.median_seconds / buildkit.median_seconds
        targets.append(Target(
            name="no-op rebuild vs fully cached plain `docker buildx build` of the same image",
            measured=f"{ratio:.2f}x ({seconds(noop.median_seconds)} s vs "
                     f"{seconds(buildkit.median_seconds)} s)",
            limit=f"≤ {NOOP_RATIO_LIMIT}x", passed=ratio <= NOOP_RATIO_LIMIT, timing=True))
        targets.append(Target(name="no-op rebuild", measured=f"{seconds(noop.median_seconds)} s",
                              limit=f"< {NOOP_SECONDS_LIMIT:.0f} s",
                              passed=noop.median_seconds < NOOP_SECONDS_LIMIT, timing=True))
    for m in measurements:
        plain = by_key.get((BASELINE, m.scenario))
        if m.tool != IMAGEFORGE or m.scenario == "no-op" or plain is None:
            continue
        limit = COLD_RATIO_LIMIT if m.scenario == "cold" else ONE_PIN_RATIO_LIMIT
        ratio = m.median_seconds / plain.median_seconds
        targets.append(Target(
            name=f"{m.label}: imageforge vs the linear Dockerfile",
            measured=f"{ratio:.2f}x ({seconds(m.median_seconds)} s vs "
                     f"{seconds(plain.median_seconds)} s)",
            limit=f"≤ {limit}x", passed=ratio <= limit, timing=True))
    mine, theirs = by_key.get((IMAGEFORGE, LAST_STAGE)), by_key.get((BASELINE, LAST_STAGE))
    if mine and theirs:
        # The last stage's bump: BuildKit runs one short step, so what is left is imageforge's
        # fixed cost per build (start-up, planning, the bake CLI, artifact contexts, export).
        over = mine.median_seconds - theirs.median_seconds
        targets.append(Target(
            name=f"warm machine, {mine.label}: imageforge's fixed overhead above BuildKit's "
                 "own build of the same change",
            measured=f"{over:.2f} s ({seconds(mine.median_seconds)} s vs "
                     f"{seconds(theirs.median_seconds)} s)",
            limit=f"≤ {OVERHEAD_SECONDS_LIMIT:.1f} s", passed=over <= OVERHEAD_SECONDS_LIMIT,
            timing=True))
    efa = by_key.get((IMAGEFORGE, "efa"))
    if efa:
        targets.append(Target(
            name="EFA-only bump, imageforge: rebuilds only efa, the plugin and the image",
            measured=", ".join(efa.rebuilt) or "nothing", limit=", ".join(EFA_ONLY),
            passed=sorted(efa.rebuilt) == sorted(EFA_ONLY) and not efa.faults))
    targets += [rebuild_target(m) for m in measurements
                if m.tool == IMAGEFORGE and m.scenario not in (*WHOLE, "efa")]
    plain = by_key.get((BASELINE, "efa"))
    if plain:
        after = list(chain[chain.index("efa"):]) if "efa" in chain else []
        targets.append(Target(
            name="EFA-only bump, baseline: rebuilds every line from EFA on, PyTorch included",
            measured=f"{plain.rebuilt_units}/{plain.total_units} layers: "
                     + (", ".join(plain.rebuilt) or "nothing"),
            limit=", ".join(after),
            passed=set(after) <= set(plain.rebuilt) and "pytorch" in plain.rebuilt))
    for row in plans:
        if row["size"] == LARGE_SIZE:
            targets.append(Target(
                name=f"plan + render of {LARGE_SIZE:,} stages ({row['shape']} deps)",
                measured=f"{row['total_seconds']:.3f} s, peak RSS {row['rss_peak_mb']:.0f} MB",
                limit=f"< {LARGE_SECONDS_LIMIT:.0f} s, < {LARGE_RSS_MB_LIMIT} MB",
                passed=(row["total_seconds"] < LARGE_SECONDS_LIMIT
                        and row["rss_peak_mb"] < LARGE_RSS_MB_LIMIT), timing=True))
        if row["size"] != PLAN_TARGET_SIZE:
            continue
        targets.append(Target(
            name=f"plan + render of {PLAN_TARGET_SIZE} stages ({row['shape']} deps)",
            measured=f"{row['total_seconds']:.3f} s", limit=f"< {PLAN_SECONDS_LIMIT:.0f} s",
            passed=row["total_seconds"] < PLAN_SECONDS_LIMIT, timing=True))
    return targets


def rebuild_target(m: Measurement) -> Target:
    """A one-pin change rebuilds exactly the stages the graph predicts: no fewer, no more,
    with keys and build report agreeing."""
    return Target(name=f"{m.label}, imageforge: rebuilds exactly its dependents",
                  measured=(", ".join(m.rebuilt) or "nothing")
                  + "".join(f"; {fault}" for fault in m.faults),
                  limit=", ".join(m.expected),
                  passed=m.as_expected and not m.faults)


def correctness_failures(targets: Sequence[Target]) -> list[str]:
    """Failed targets about what was rebuilt; timing targets depend on the machine and are
    only reported."""
    return [t.name for t in targets if not t.passed and not t.timing]


# ----------------------------------------------------------------------------- main


def run_benchmark(options: Options) -> str:
    """Run everything, write options.out, return the Markdown report."""
    started = time.perf_counter()
    result: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": _host(),
        "cpu_note": ("CPU s = busy time of the whole machine (all cores, /proc/stat) during the "
                     "build: BuildKit runs in the Docker daemon, so only a system-wide "
                     "measure sees it; meaningful only on an otherwise idle machine."),
    }
    measurements: list[Measurement] = []
    fresh_found: list[fresh.FreshMeasurement] = []
    buildkit: Measurement | None = None
    chain: list[str] = [section for section, _ in SEED_ORDER]
    if options.builds:
        fresh_runner = options.fresh and options.engine == "own"
        with _workdir(options.keep) as work, fresh.registry(work, fresh_runner) as reg, \
                _engine(options, work):
            bench = Bench(options, work)
            result["background_load"] = round(cpu.background_load(), 3)
            if result["background_load"] > 0.10:
                bench.say(f"warning: the machine is {result['background_load']:.0%} busy "
                          "before the benchmark; wall and CPU figures include that load")
            result["engine"] = options.engine
            measurements, buildkit, chain, extra, fresh_found = _builds(bench, options, reg)
            result.update(extra)
    plans = plan_at_scale(options.sizes, options.shapes)
    if options.large and "wide" in options.shapes:
        plans += plan_at_scale((options.large,), ("wide",))
    targets = evaluate(measurements, buildkit, plans, chain) + fresh.targets(fresh_found)
    result.update(
        fresh_runner=[m.to_json() for m in fresh_found],
        repeats={"no-op": options.repeats, "cold": 1, "one-pin": 1},
        measurements=[m.to_json() for m in measurements],
        buildkit_noop=buildkit.to_json() if buildkit else None,
        plan_at_scale=plans,
        targets=[t.to_json() for t in targets],
        total_seconds=round(time.perf_counter() - started, 1),
    )
    noop = next((m for m in measurements if m.tool == IMAGEFORGE and m.scenario == "no-op"),
                None)
    if noop and buildkit:
        result["imageforge_overhead_seconds"] = round(
            noop.median_seconds - buildkit.median_seconds, 3)
    text = render(result, measurements, buildkit, plans, targets, chain, fresh_found)
    result["markdown"] = text
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    failed = correctness_failures(targets)
    if failed:
        raise BenchError(f"{len(failed)} target(s) failed: {'; '.join(failed)} (see "
                         f"{_shown(options.out)}); a one-pin change must rebuild exactly what "
                         "the stage graph predicts.")
    # Only a run that passed, with its builds, replaces the tables of the benchmark page.
    page = ROOT / "docs" / "bench.md"
    if options.builds and update_tables(page, text, result["total_seconds"]):
        text += f"\n\nupdated the benchmark tables in {_shown(page)}"
    return text + f"\n\nwrote {_shown(options.out)} ({result['total_seconds']:.0f} s in all)"


def _builds(bench: Bench, options: Options, reg: fresh.Registry | None
            ) -> tuple[list[Measurement], Measurement, list[str], dict[str, Any],
                       list[fresh.FreshMeasurement]]:
    work = bench.work
    bench.empty.mkdir(parents=True, exist_ok=True)
    bench.say("generating the sample upstream")
    upstream = work / "upstream"
    bench.must("python -m sample generate", subprocess.run(
        [sys.executable, "-m", "sample", "generate", "--out", str(upstream)], cwd=ROOT,
        capture_output=True, check=False, timeout=600))
    pins: dict[str, Any] = json.loads((upstream / "pins.json").read_text())
    from sample.serve import start_server

    server = start_server(upstream)
    try:
        base_url = server.url.rstrip("/")
        bench.manifest.parent.mkdir(parents=True)
        run_id = datetime.now(UTC).strftime("%Y%m%dt%H%M%S") + f"-{os.getpid()}"
        base = bench.salted_base(run_id)
        bench.manifest.write_text(bench_manifest(base_url, pins, base))
        bench.must("invoke lock", bench.invoke("lock", "--manifest", str(bench.manifest)))
        changes = pin_changes(bench.manifest, pins)
        checks = {"base": bench.check()} | {c.stage: bench.check(c.overrides) for c in changes}
        if checks["base"] != "ok":
            raise BenchError(f"invoke check on the bench manifest: {checks['base']}")
        bench.say(f"serving {base_url}; fetching every scenario's sources")
        bench.fetch()
        for change in changes:
            bench.fetch(change.overrides)
        base_plan = bench.plan()
        base_keys = {s.name: s.key for s in base_plan.stages}
        # The baseline Dockerfiles are written into the work directory (`--keep` keeps
        # them): a run changes no tracked file but its results.
        chain = baseline_dockerfile(base_plan, STAGES).sections()

        measurements: list[Measurement] = []
        key_changes: dict[str, list[str]] = {}
        # imageforge: cold, no-op, BuildKit's own no-op, one-pin changes.
        bench.prune()
        shutil.rmtree(bench.cache / "artifacts", ignore_errors=True)
        measurements.append(bench.measure_imageforge(
            "cold", "cold build", [s.name for s in base_plan.stages]))
        measurements.append(bench.measure_imageforge("no-op", "no-op rebuild", [],
                                                     repeats=options.repeats))
        buildkit = bench.measure_buildkit_noop(options.repeats)
        for change in changes:
            planned = bench.plan(change.overrides)
            key_changes[change.stage] = [s.name for s in planned.stages
                                         if s.key != base_keys[s.name]]
            m = bench.measure_imageforge(change.stage, change.label,
                                         graph_dependents(change.stage), change.overrides)
            if sorted(key_changes[change.stage]) != sorted(m.expected):
                m.faults.append("keys changed for " + ", ".join(key_changes[change.stage]))
                m.notes.append(m.faults[-1])
            if checks[change.stage] != "ok":
                m.notes.append(f"invoke check: {checks[change.stage]}")
            measurements.append(m)

        # The baseline, from a pruned cache too.
        bench.prune()
        measurements.append(bench.measure_baseline("cold", "cold build", (), "*"))
        served_layers = [m for m in measurements if m.tool == BASELINE][-1]
        if served_layers.rebuilt_units < served_layers.total_units:
            served_layers.notes.append("BuildKit served layers from its cache: not cold")
        measurements.append(bench.measure_baseline("no-op", "no-op rebuild", (), None,
                                                   repeats=options.repeats))
        for change in changes:
            section = change.stage
            measurements.append(bench.measure_baseline(change.stage, change.label,
                                                       change.overrides, section))
        # On a fresh runner, last: it empties the engine before every build.
        fresh_found = fresh.run(
            bench, reg, [base, sample_base()], changes,
            [s.name for s in base_plan.stages if not is_external(s)],
            {c.stage: graph_dependents(c.stage) for c in changes},
            options.repeats) if reg else []
        extra = {
            "manifest": bench.manifest.read_text(),
            "scenarios": [dataclasses.asdict(c) for c in changes],
            "invoke_check": checks,
            "key_changes": key_changes,
            "baseline_chain": chain,
        }
        return measurements, buildkit, chain, extra, fresh_found
    finally:
        server.stop()
        for tag in bench.tags:
            subprocess.run(["docker", "image", "rm", tag], capture_output=True, check=False)


def render(result: Mapping[str, Any], measurements: Sequence[Measurement],
           buildkit: Measurement | None, plans: Sequence[Mapping[str, Any]],
           targets: Sequence[Target], chain: Sequence[str],
           fresh_found: Sequence[fresh.FreshMeasurement] = ()) -> str:
    parts = []
    if measurements:
        parts.append(scenario_table(measurements, chain))
        notes = [f"- {m.tool} {m.label}: {note}" for m in measurements for note in m.notes]
        if buildkit:
            notes += [f"- buildkit: {note}" for note in buildkit.notes]
            overhead = result.get("imageforge_overhead_seconds")
            parts.append(f"imageforge's own overhead on a no-op: {overhead:.2f} s (its no-op "
                         f"minus a fully cached plain `docker buildx build` of its rendered "
                         f"Dockerfile, {seconds(buildkit.median_seconds)} s).")
        parts.append("Each one-pin change starts from the cached base manifest. imageforge "
                     "rebuilt = stages its build added to the artifact store; baseline rebuilt "
                     "= RUN/COPY steps BuildKit ran (`--progress rawjson`); \"graph:\" marks "
                     "a stage set other than the dependency graph predicts. "
                     + str(result["cpu_note"]) + f" Background load before the run: "
                     f"{result.get('background_load', 0):.0%}.")
        if notes:
            parts.append("\n".join(notes))
    if fresh_found:
        parts.append("On a fresh runner (every build on an emptied engine; the registry "
                     "holds what the tool's own cold build pushed; MB through the registry, "
                     "medians):\n\n" + fresh.table(fresh_found))
    if measurements:
        parts.append("Where imageforge's time went (last run of each scenario; seconds):\n\n"
                     + phases_table(measurements))
    parts.append(plan_table(plans))
    profiled = [r for r in plans if r.get("profile")]
    for row in profiled:
        top = ", ".join(f"{p['function']} {p['own_seconds']:.2f} s" for p in row["profile"][:4])
        parts.append(f"Plan of {row['size']} stages ({row['shape']}) is over "
                     f"{PLAN_SECONDS_LIMIT:.0f} s; own time (cProfile): {top}.")
    parts.append(targets_table(targets))
    return "\n\n".join(parts)


def _host() -> dict[str, Any]:
    def out(*argv: str) -> str:
        proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    return {"cpus": os.cpu_count(), "kernel": os.uname().release,
            "docker": out("docker", "version", "--format", "{{.Server.Version}}"),
            "buildx": out("docker", "buildx", "version"),
            "python": sys.version.split()[0]}


@contextlib.contextmanager
def _engine(options: Options, work: Path) -> Iterator[None]:
    """Every docker command of the run (imageforge's and the baseline's) on the benchmark's
    own engine, through DOCKER_HOST."""
    if options.engine == "host":
        yield
        return
    with serving(work / "engine", [sample_base()]) as engine:
        print(f"benchmark engine: {engine.socket}", file=sys.stderr, flush=True)
        yield


@contextlib.contextmanager
def _workdir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="imageforge-bench-"))
    try:
        yield path
    finally:
        if keep:
            print(f"kept {path}", file=sys.stderr)
        else:
            shutil.rmtree(path, ignore_errors=True)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


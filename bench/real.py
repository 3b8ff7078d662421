"""`make bench-real`: an EFA bump on the real efa-nccl image, imageforge against seed 000's
linear Dockerfile on a warm machine, and then on a fresh runner against BuildKit's registry
cache (bench/realfresh.py), measured in one run.

Both tools build manifests/real-efa-nccl.toml (real NCCL, nccl-tests, aws-ofi-nccl, CUDA 13.0,
Debian's fabric libraries through the EFA installer stand-in) at EFA 1.22.0, then again at
1.22.1. In seed 000's single chain the installer comes first, so the bump recompiles NCCL;
imageforge rebuilds efa and what needs it (the plugin, nccl-tests, the image) and reuses NCCL.
NCCL is built with ONLY_FUNCS="AllReduce Sum f32 * *" for both tools (`--full` builds the
whole library: about 25 min a compile on 2 cores). `--part warm` or `--part fresh` runs one
part and keeps the other's last results. Results: bench/results-real.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from bench import cpu, fresh, realfresh
from bench.baseline import SEED_000_ORDER, baseline_dockerfile
from bench.rawjson import layer_steps, parse_stream
from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.planning.dockerfile import CA_BUNDLE_SECRET
from imageforge.sources import cabundle
from stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "manifests" / "real-efa-nccl.toml"
RESULTS = ROOT / "bench" / "results-real.json"
ADDRESS = "http://127.0.0.1:8742"
TARGET = "efa-nccl"
EFA_FROM, EFA_TO = "1.22.0", "1.22.1"
ONLY_FUNCS = "AllReduce Sum f32 * *"
# What a bump of the installer must rebuild in imageforge: efa and the stages that need it.
EXPECTED = ["efa", "aws-ofi-nccl", "nccl-tests", "efa-nccl"]


def say(text: str) -> None:
    print(f"bench-real: {text}", file=sys.stderr, flush=True)


def timed(argv: list[str], env: dict[str, str] | None = None, *, stdout: bool = False
          ) -> tuple[float, float, bytes]:
    """(wall seconds, busy CPU seconds, stderr and stdout) of a command that must succeed;
    with `stdout`, its stdout alone."""
    before = cpu.read_ticks()
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=False,
                          timeout=7200)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-15:]
        raise SystemExit(f"bench-real: {' '.join(argv[:4])} failed:\n" + "\n".join(tail))
    return wall, cpu.busy_seconds(before, cpu.read_ticks()), \
        proc.stdout if stdout else proc.stderr + proc.stdout


class RealBench:
    target = TARGET

    def __init__(self, work: Path, full: bool) -> None:
        self.work = work
        self.cache = work / "cache"
        self.manifest = work / "real-efa-nccl.toml"
        self.full = full

    say = staticmethod(say)
    timed = staticmethod(timed)

    def prepare(self, url: str) -> None:
        text = MANIFEST.read_text().replace(ADDRESS, url)
        if not self.full:
            text = text.replace('[stages.nccl]\n', f'[stages.nccl]\nonly_funcs = "{ONLY_FUNCS}"\n')
        self.manifest.write_text(text)
        self.invoke("lock", "--manifest", str(self.manifest))

    def invoke(self, *args: str, env: dict[str, str] | None = None, stdout: bool = False
               ) -> tuple[float, float, bytes]:
        # The environment of the moment: the fresh part points DOCKER_HOST at its engines.
        return timed([sys.executable, "-m", "invoke", "-r", str(ROOT), *args],
                     {**os.environ, "INVOKE_IMAGEFORGE_CACHE_DIR": str(self.cache),
                      **(env or {})}, stdout=stdout)

    def sources(self, efa: str) -> dict[str, str]:
        """`invoke fetch` at EFA `efa`: each source of the target as a named-context path."""
        _, _, fetched = self.invoke("fetch", "--manifest", str(self.manifest), "--target",
                                    TARGET, "--set", f"stages.efa.version={efa}", stdout=True)
        contexts = {}
        for line in fetched.decode(errors="replace").splitlines():
            name, _, path = line.strip().partition(" ")
            if name.startswith("src-") and Path(path.strip()).is_dir():
                contexts[name] = path.strip()
        return contexts

    @staticmethod
    def secret_args() -> list[str]:
        """The CA bundle `invoke build` hands its pip steps, so both tools reach PyPI alike."""
        bundle = cabundle.resolve(None)
        return ["--secret", f"id={CA_BUNDLE_SECRET},src={bundle}"] if bundle else []

    def imageforge(self, efa: str) -> dict[str, Any]:
        wall, busy, _ = self.invoke(
            "build", "--manifest", str(self.manifest), "--target", TARGET, "--no-test",
            "--progress", "plain", "--set", f"stages.efa.version={efa}",
            "--tag", f"imageforge-bench/real:{efa}")
        report = max((self.cache / "reports").glob("*.json"), key=lambda p: p.stat().st_mtime)
        stages = json.loads(report.read_text())["stages"]
        rebuilt = [s["name"] for s in stages if s.get("state") == "built"]
        say(f"imageforge at EFA {efa}: {wall:.1f} s, rebuilt {', '.join(rebuilt) or 'nothing'}")
        return {"seconds": round(wall, 1), "cpu_seconds": round(busy, 1), "rebuilt": rebuilt}

    def baseline(self, efa: str) -> dict[str, Any]:
        overrides = (f"stages.efa.version={efa}",)
        settings = Workspace(registry=STAGES, manifest=self.manifest,
                                    overrides=overrides, cache_dir=self.cache)
        planned = project.plan(settings, TARGET)
        linear = baseline_dockerfile(planned, planned.registry, SEED_000_ORDER)
        dockerfile = self.work / f"baseline-{efa}.Dockerfile"
        dockerfile.write_text(linear.dockerfile)
        contexts = self.sources(efa)
        argv = ["docker", "buildx", "build", "--load", "--progress", "rawjson", "-f",
                str(dockerfile), "-t", f"imageforge-bench/real-baseline:{efa}"]
        argv += [f"--build-context={n}={contexts[n]}" for n in linear.contexts]
        argv += self.secret_args()
        empty = self.work / "empty"
        empty.mkdir(exist_ok=True)
        wall, busy, stream = timed([*argv, str(empty)])
        steps = layer_steps(parse_stream(stream))
        rebuilt = list(dict.fromkeys(
            linear.section_of_step(s.step) or "?" for s in steps if s.rebuilt))
        say(f"baseline at EFA {efa}: {wall:.1f} s, rebuilt sections {', '.join(rebuilt)}")
        return {"seconds": round(wall, 1), "cpu_seconds": round(busy, 1), "rebuilt": rebuilt,
                "layers": f"{sum(1 for s in steps if s.rebuilt)}/{len(linear.layers)}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="build the whole NCCL library")
    parser.add_argument("--part", choices=("warm", "fresh"),
                        help="run one part, keeping the other's last results")
    args = parser.parse_args()
    from sample.serve import start_server

    result: dict[str, Any] = json.loads(RESULTS.read_text()) \
        if args.part and RESULTS.exists() else {}
    result.update({"manifest": str(MANIFEST.relative_to(ROOT)),
                   "nccl": "full" if args.full else f"ONLY_FUNCS={ONLY_FUNCS}",
                   "bump": f"efa {EFA_FROM} -> {EFA_TO}"})
    with tempfile.TemporaryDirectory(prefix="imageforge-bench-real-", dir="/var/tmp") as tmp, \
            fresh.registry(Path(tmp), args.part != "warm") as reg:
        work = Path(tmp)
        upstream = work / "upstream"
        subprocess.run([str(ROOT / "scripts/cuda-base.sh")], check=True)
        subprocess.run([str(ROOT / "scripts/real-upstream.sh"), str(upstream)], check=True)
        for version in (EFA_FROM, EFA_TO):
            subprocess.run([sys.executable, "-m", "realparts", "efa-installer", "--version",
                            version, "--out", str(upstream / "files"), "--deb-cache",
                            str(ROOT / "cache/sources/debs")], check=True, cwd=ROOT)
        server = start_server(upstream)
        try:
            bench = RealBench(work, args.full)
            bench.prepare(server.url.rstrip("/"))
            if args.part != "fresh":
                result.update(_warm(bench))
            if reg is not None:
                # The manifest's base image: all a fresh runner's engine holds.
                base = str(tomllib.loads(MANIFEST.read_text())["image"]["base"])
                found = realfresh.run(bench, reg, base, EFA_FROM, EFA_TO, EXPECTED)
                result["fresh"] = {"measurements": [m.to_json() for m in found],
                                   "table": fresh.table(found),
                                   "targets": [t.to_json() for t in fresh.targets(found)]}
        finally:
            server.stop()
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "fresh"}, indent=2))
    if "fresh" in result:
        print(result["fresh"]["table"])
        for target in result["fresh"]["targets"]:
            print(("pass " if target["passed"] else "MISS ") + target["name"] + ": "
                  + target["measured"] + " (" + target["limit"] + ")")
    faults = [] if result.get("rebuilt_as_predicted", True) else [
        f"warm: imageforge rebuilt {result['imageforge']['rebuilt']}, the graph predicts "
        f"{EXPECTED}"]
    faults += [t["name"] + ": " + t["measured"] for t in result.get("fresh", {}).get("targets", [])
               if not t.get("timing") and not t["passed"]]
    for fault in faults:
        say(fault)
    return 1 if faults else 0


def _warm(bench: RealBench) -> dict[str, Any]:
    """Both tools on this host's engine: EFA_FROM (a warm-up), then the bump to EFA_TO."""
    result: dict[str, Any] = {}
    say(f"warm-up: both tools build EFA {EFA_FROM}")
    result["imageforge_warm"] = bench.imageforge(EFA_FROM)
    result["baseline_warm"] = bench.baseline(EFA_FROM)
    say(f"the bump: EFA {EFA_TO}")
    result["imageforge"] = bench.imageforge(EFA_TO)
    result["baseline"] = bench.baseline(EFA_TO)
    result["ratio"] = round(result["imageforge"]["seconds"] / result["baseline"]["seconds"], 3)
    result["rebuilt_as_predicted"] = sorted(result["imageforge"]["rebuilt"]) == sorted(EXPECTED)
    return result


if __name__ == "__main__":
    sys.exit(main())

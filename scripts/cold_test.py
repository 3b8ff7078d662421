"""`make test` as on a machine that has never built anything, timed: `make test-cold`.

A Docker engine of its own (bench/engine.py: its own data root, so no image, no BuildKit
layer cache, no base image), and a fresh clone of this checkout's HEAD (no `cache/`: the
CUDA wheels and the EFA stand-in's Debian packages are downloaded again). Everything the
suite does in Docker, the base images included (`make docker` debootstraps, cuda-base.sh
lays out NVIDIA's wheels), happens in that engine; the host's engine is not touched. Only
pip's download cache for the `.venv` stays warm, as it would on a CI runner with a cache.

Prints one line, `cold make test: exit N in M min S s`, keeps the run's JUnit report as
cache/reports/make-test-cold.xml, and exits with `make test`'s code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.engine import Engine, EngineError  # noqa: E402 (after the path it needs)


def bundles() -> str:
    """Where the real upstream bundles are, as scripts/real-upstream.sh finds them from this
    checkout (the clone lives elsewhere, so it is told)."""
    given = os.environ.get("IMAGEFORGE_UPSTREAM_BUNDLES")
    for candidate in (given, ROOT / "shared/upstream", ROOT.parent / "shared/upstream"):
        if candidate and (Path(candidate) / "nccl.bundle").is_file():
            return str(Path(candidate).resolve())
    raise SystemExit("cold_test: no nccl.bundle found: set IMAGEFORGE_UPSTREAM_BUNDLES to the "
                     "folder with the real upstream bundles.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None,
                        help="where the clone and the engine go (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the clone afterwards")
    parser.add_argument("make_args", nargs="*", help="extra arguments for make (JOBS=3)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="imageforge-cold-", dir="/var/tmp"))
    clone = work / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    env = {**os.environ, "CI": "true", "IMAGEFORGE_UPSTREAM_BUNDLES": bundles()}
    started = time.monotonic()
    try:
        with Engine(work / "engine", label="imageforge-cold") as engine:
            env.update(engine.env)
            code = subprocess.run(["make", "test", *args.make_args], cwd=clone, env=env,
                                  check=False).returncode
    except EngineError as error:
        print(f"cold_test: {error}", file=sys.stderr)
        return 1
    took = int(time.monotonic() - started)
    report = ROOT / "cache/reports/make-test-cold.xml"
    if (clone / "cache/reports/make-test.xml").is_file():
        report.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(clone / "cache/reports/make-test.xml", report)
    print(f"cold make test: exit {code} in {took // 60} min {took % 60} s (JUnit report: "
          f"{report})")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

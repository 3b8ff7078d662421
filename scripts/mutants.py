"""Known mutants of the engine, each of which a unit test must kill.

Each mutant is a small, meaningful change (a bound moved by one, a check dropped, an order
reversed) that once went unnoticed. The script copies the working tree (tracked and
untracked, not ignored files) to a scratch directory, checks that the tests pass there
unchanged, then applies one mutant at a time to the copy and runs only the tests meant to
catch it: each must fail. The working tree itself is never modified.

    .venv/bin/python scripts/mutants.py                     # every mutant
    .venv/bin/python scripts/mutants.py prune-keep-last     # some, by name
    .venv/bin/python scripts/mutants.py --list

Exit 0 when every mutant is killed; 1 names the survivors.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMITS = "tests/unit/test_compat_limits.py"
STORE = "tests/unit/test_artifact_store.py"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = (
    Mutant(name="compat-arch-until", path="stages/base_rules.py",
           old="support.until is not None and cuda >= support.until",
           new="support.until is not None and cuda > support.until", tests=(LIMITS,)),
    Mutant(name="compat-arch-since", path="stages/base_rules.py",
           old="    if cuda < support.since:", new="    if cuda <= support.since:",
           tests=(LIMITS,)),
    Mutant(name="compat-plugin-libfabric", path="stages/efa_rules.py",
           old="libfabric >= minimum:\n        return []\n    return [rule.violation(",
           new="libfabric > minimum:\n        return []\n    return [rule.violation(",
           tests=(LIMITS,)),
    Mutant(name="compat-platform-aws-libfabric", path="stages/aws_ofi_nccl_rules.py",
           old="libfabric >= minimum:\n        return []\n    general",
           new="libfabric > minimum:\n        return []\n    general", tests=(LIMITS,)),
    Mutant(name="compat-platform-aws-since", path="stages/aws_ofi_nccl_rules.py",
           old="    if plugin < since:", new="    if plugin <= since:", tests=(LIMITS,)),
    Mutant(name="compat-disable-tests", path="stages/aws_ofi_nccl_rules.py",
           old="plugin >= since or DISABLE_TESTS", new="plugin > since or DISABLE_TESTS",
           tests=(LIMITS,)),
    Mutant(name="compat-plugin-nccl", path="stages/aws_ofi_nccl_rules.py",
           old="nccl >= minimum", new="nccl > minimum", tests=(LIMITS,)),
    Mutant(name="compat-efa-bundled-plugin", path="stages/aws_ofi_nccl_rules.py",
           old="efa < installers.bundles_plugin_from",
           new="efa <= installers.bundles_plugin_from", tests=(LIMITS,)),
    Mutant(name="validate-text-line-breaks", path="imageforge/model/validate.py",
           old="and value.isprintable()",
           new="and value.replace(\"\\n\", \"\").replace(\"\\r\", \"\").isprintable()",
           tests=("tests/unit/test_hostile_input.py",)),
    Mutant(name="validate-text-line-breaks-render", path="imageforge/model/validate.py",
           old="and value.isprintable()",
           new="and value.replace(\"\\n\", \"\").replace(\"\\r\", \"\").isprintable()",
           tests=("tests/unit/test_render_adversarial.py::"
                  "test_every_field_keeps_the_shape_with_the_known_hostile_values",)),
    Mutant(name="prune-keep-last", path="imageforge/cache/artifacts.py",
           old="        if keep_last:\n", new="        if keep_last and False:\n",
           tests=(STORE,)),
    Mutant(name="prune-newest-first", path="imageforge/cache/artifacts.py",
           old="for e in reversed(kept):", new="for e in kept:", tests=(STORE,)),
    Mutant(name="prune-takes-no-key-lock", path="imageforge/cache/artifacts.py",
           old="            with locked(self.lock_path(e.key), shared=False, "
               "what=f\"{e.stage} {e.key[:19]}\"):",
           new="            with contextlib.nullcontext():", tests=(STORE,)),
    Mutant(name="keylock-never-taken", path="imageforge/cache/keylock.py",
           old="                fcntl.flock(fd, mode | fcntl.LOCK_NB)\n",
           new="                pass\n", tests=(STORE,)),
    Mutant(name="verify-never-rehashes", path="imageforge/cache/artifacts.py",
           old="bad = [b for b in blobs if stamps.get(b.name) != _stamp(b) and not _blob_ok(b)]",
           new="bad: list[Path] = []", tests=(STORE,)),
    Mutant(name="docker-config-left-behind", path="imageforge/cache/remote.py",
           old="    with tempfile.TemporaryDirectory(prefix=\"imageforge-docker-\") as tmp:\n"
               "        config = Path(tmp)\n        os.chmod(config, 0o700)\n",
           new="    if True:\n"
               "        config = Path(tempfile.mkdtemp(prefix=\"imageforge-docker-\"))\n"
               "        os.chmod(config, 0o755)\n",
           tests=("tests/unit/test_credentials.py",)),
    Mutant(name="docker-config-world-readable", path="imageforge/cache/remote.py",
           old="os.O_TRUNC, 0o600)", new="os.O_TRUNC, 0o644)",
           tests=("tests/unit/test_credentials.py",)),
    Mutant(name="bakefail-cause-keeps-all", path="imageforge/buildkit/bakefail.py",
           old="    tail = parts[-2:] if", new="    tail = parts if", tests=(
               "tests/unit/test_bakefail.py",)),
    Mutant(name="bakefail-cause-keeps-urls", path="imageforge/buildkit/bakefail.py",
           old="if \"://\" not in part]", new="if part]",
           tests=("tests/unit/test_bakefail.py",)),
    Mutant(name="bench-efa-accepts-more", path="bench/run.py",
           old="passed=sorted(efa.rebuilt) == sorted(EFA_ONLY) and not efa.faults",
           new="passed=set(EFA_ONLY) <= set(efa.rebuilt) and not efa.faults",
           tests=("tests/unit/test_bench.py",)),
    Mutant(name="bench-one-pin-accepts-more", path="bench/report.py",
           old="return sorted(self.rebuilt) == sorted(self.expected)",
           new="return set(self.expected) <= set(self.rebuilt)",
           tests=("tests/unit/test_bench.py",)),
)


def copy_tree(into: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                           *tests], cwd=tree, env=env, capture_output=True, text=True,
                          check=False)
    return proc.returncode, proc.stdout + proc.stderr


def uses_the_copy(tree: Path) -> bool:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    found = subprocess.run([sys.executable, "-c", "import imageforge; print(imageforge.__file__)"],
                           cwd=tree, env=env, capture_output=True, text=True, check=True)
    return Path(found.stdout.strip()).is_relative_to(tree)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args()
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:32} {m.path:24} {' '.join(m.tests)}")
        return 0
    unknown = set(args.names) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"no such mutant: {', '.join(sorted(unknown))}")
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    with tempfile.TemporaryDirectory(prefix="imageforge-mutants-") as scratch:
        tree = Path(scratch)
        copy_tree(tree)
        if not uses_the_copy(tree):
            print("the scratch copy's imageforge is not the one imported; stopping.")
            return 2
        baseline = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        code, output = run_tests(tree, baseline)
        if code != 0:
            print(f"the tests fail without any mutant:\n{output}")
            return 2
        survivors = []
        for mutant in chosen:
            path = tree / mutant.path
            original = path.read_text()
            if original.count(mutant.old) != 1:
                print(f"{mutant.name}: the code to mutate is not found exactly once in "
                      f"{mutant.path}; update the mutant.")
                survivors.append(mutant.name)
                continue
            path.write_text(original.replace(mutant.old, mutant.new))
            started = time.monotonic()
            try:
                code, output = run_tests(tree, mutant.tests)
            finally:
                path.write_text(original)
            # 1 is "tests failed"; anything else (an import error, no tests) kills nothing.
            killed = code == 1
            failed = [line for line in output.splitlines() if line.startswith("FAILED")]
            print(f"{mutant.name:32} {'killed' if killed else 'SURVIVED':9} "
                  f"{time.monotonic() - started:5.1f} s  {failed[0][7:] if failed else ''}")
            if not killed:
                survivors.append(mutant.name)
    if survivors:
        print(f"{len(survivors)} of {len(chosen)} mutants survived: {', '.join(survivors)}")
        return 1
    print(f"all {len(chosen)} mutants killed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Mutation testing of the modules that carry the promises, with mutmut, plus the known
mutants of scripts/mutants.py.

mutmut (configured in pyproject.toml, [tool.mutmut]) copies the tree to mutants/, mutates
every function of the listed modules behind a trampoline and, for each mutant, runs only
the unit tests that cover that function. Results are kept in mutants/ per function hash, so
a second run only tests what changed; mutants that survived an earlier run are tested again
(the tests may have changed since), and --fresh throws every cached verdict away.

A surviving mutant fails the run unless tests/mutation-equivalent/*.toml accepts it: each
entry names the function, the change (the diff's -/+ lines) and one line saying why no test
can tell the mutant from the original. Entries match by function and change, not by the
mutant's number, so they survive unrelated edits elsewhere in the function; an entry that
matches no survivor any more fails the run too (drop it or update it).

    .venv/bin/python scripts/mutation.py            # mutmut, then the known mutants
    .venv/bin/python scripts/mutation.py --fresh    # forget cached verdicts first
    .venv/bin/python scripts/mutation.py --no-known # mutmut only
    .venv/bin/python scripts/mutation.py --report   # what mutants/ holds, running nothing

Exit 0 when every mutant is killed or accepted, 1 otherwise, 2 when the run itself failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACCEPTED = ROOT / "tests/mutation-equivalent"
# mutmut's exit codes per mutant (mutmut.stats.status_by_exit_code).
KILLED = {1: "killed", 3: "killed", 36: "timeout", 37: "caught by type check", -24: "timeout",
          24: "timeout", 152: "timeout", 255: "timeout"}
NAMES = {0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 35: "suspicious",
         2: "interrupted", -11: "segfault", -9: "segfault"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Accepted:
    function: str
    change: tuple[str, ...]
    reason: str


def status(code: int | None) -> str:
    if code is None:
        return "not checked"
    return KILLED.get(code) or NAMES.get(code, "suspicious")


def function_of(mutant: str) -> str:
    return mutant.partition("__mutmut_")[0]


def module_of(mutant: str) -> str:
    return function_of(mutant).rpartition(".")[0]


def load_verdicts() -> dict[str, int | None]:
    """Every mutant of the mutated modules and its exit code, from mutants/**/*.meta."""
    verdicts: dict[str, int | None] = {}
    # The packages mutmut mutates ([tool.mutmut] source_paths): the engine and the stage
    # modules that hold compatibility rules.
    for meta in sorted(p for package in ("imageforge", "stages")
                       for p in (ROOT / "mutants" / package).rglob("*.py.meta")):
        try:
            verdicts.update(json.loads(meta.read_text())["exit_code_by_key"])
        except (ValueError, KeyError):
            # mutmut writes these in place: one stopped mid-write (Ctrl-C) leaves half a file.
            raise SystemExit(f"{meta.relative_to(ROOT)} is unreadable (a run stopped while "
                             "writing it?); run again with FRESH=1 (--fresh).") from None
    return verdicts


def change_of(mutant: str) -> tuple[str, ...]:
    """The -/+ lines of the mutant's diff, stripped: what the mutant changes."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        diff = get_diff_for_mutant(mutant, path=module_of(mutant).replace(".", "/") + ".py")
    finally:
        os.chdir(cwd)
    return tuple(line[0] + line[1:].strip() for line in diff.splitlines()[2:]
                 if line[:1] in "+-")


def load_accepted() -> list[Accepted]:
    accepted = []
    for path in sorted(ACCEPTED.glob("*.toml")):
        accepted.extend(load_accepted_file(path))
    return accepted


def load_accepted_file(path: Path) -> list[Accepted]:
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise SystemExit(f"{path.relative_to(ROOT)}: not valid TOML ({error})") from None
    accepted = []
    for entry in data.get("equivalent", []):
        reason = entry.get("reason", "").strip()
        if not reason or "\n" in reason:
            raise SystemExit(f"{path.relative_to(ROOT)}: {entry.get('function')}: "
                             "give a one-line reason")
        change = tuple(line[0] + line[1:].strip() for line in entry["change"].strip().splitlines())
        accepted.append(Accepted(function=entry["function"], change=change, reason=reason))
    return accepted


def mutmut(*args: str) -> int:
    command = [sys.executable, "-m", "mutmut", "run", *args]
    print("+", " ".join(command[:6]) + (f" ... ({len(args)} mutants)" if len(args) > 3 else ""),
          flush=True)
    return subprocess.run(command, cwd=ROOT, check=False).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fresh", action="store_true", help="remove mutants/ first")
    parser.add_argument("--no-known", action="store_true",
                        help="skip the known mutants of scripts/mutants.py")
    parser.add_argument("--report", action="store_true",
                        help="only report the verdicts mutants/ holds (run nothing)")
    args = parser.parse_args()
    # Started in the background by a shell, we inherit SIGINT ignored and so would every test
    # process: tests that interrupt a child (Ctrl-C cleanup) would fail on a clean tree.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    if args.fresh:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    # Survivors of an earlier run keep their verdict in mutmut's cache even when tests were
    # added since: name them explicitly so mutmut tests them again (first: they are what the
    # last run asked for), then let mutmut test every mutant without a verdict.
    before = load_verdicts() if (ROOT / "mutants").is_dir() else {}
    retest = sorted(m for m, code in before.items()
                    if code is not None and status(code) not in KILLED.values())
    if not args.report:
        if retest and mutmut(*retest) != 0:
            # E.g. every one of them changed since: the full run below tests them anew.
            print("mutmut could not re-test the earlier survivors; testing all unchecked")
        if mutmut() != 0:
            print("mutmut failed (see above: do the unit tests pass on a clean tree?)")
            return 2

    verdicts = load_verdicts()
    per_module: dict[str, Counter[str]] = defaultdict(Counter)
    for mutant, code in verdicts.items():
        per_module[module_of(mutant)][status(code)] += 1
    accepted = load_accepted()
    used: set[Accepted] = set()
    failing: list[tuple[str, str, tuple[str, ...]]] = []
    equivalent: list[tuple[str, Accepted]] = []
    unchecked: Counter[str] = Counter()
    for mutant, code in sorted(verdicts.items()):
        if status(code) in KILLED.values():
            continue
        if code is None:  # an interrupted run: tested next time
            unchecked[function_of(mutant)] += 1
            continue
        change = change_of(mutant)
        match = next((a for a in accepted
                      if a.function == function_of(mutant) and a.change == change), None)
        if match is None:
            failing.append((mutant, status(code), change))
        else:
            used.add(match)
            equivalent.append((mutant, match))

    print("\nmutmut, per module (killed includes timeouts; accepted = listed as equivalent):")
    total_killed = total = 0
    accepted_by_module = Counter(module_of(m) for m, _ in equivalent)
    for module, counts in sorted(per_module.items()):
        killed = sum(counts[s] for s in set(KILLED.values()))
        count = sum(counts.values())
        total_killed += killed
        total += count
        others = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())
                           if s not in KILLED.values())
        print(f"  {module:28} {killed:5}/{count:<5} killed"
              f"{f', {accepted_by_module[module]} accepted' if accepted_by_module[module] else ''}"
              f"{f'  ({others})' if others else ''}")
    print(f"  {'total':28} {total_killed:5}/{total:<5} killed, {len(equivalent)} accepted as "
          f"equivalent, {len(failing)} not killed")
    if total:
        print(f"  score: {total_killed}/{total} = {100 * total_killed / total:.1f} % killed; "
              f"{100 * (total_killed + len(equivalent)) / total:.1f} % killed or equivalent")

    if equivalent:
        print("\naccepted survivors (tests/mutation-equivalent/):")
        for mutant, entry in equivalent:
            print(f"  {mutant}: {entry.reason}")
    stale = [a for a in accepted if a not in used]
    for entry in stale:
        print(f"\n{ACCEPTED.name}: no surviving mutant of {entry.function} makes the change "
              f"{' / '.join(entry.change)}; remove or update the entry.")
    if failing:
        print(f"\n{len(failing)} mutants not killed (`.venv/bin/mutmut show NAME` shows one):")
        for mutant, what, change in failing:
            print(f"  {mutant} [{what}]")
            for line in change:
                print(f"      {line}")
    if unchecked:
        print(f"\n{sum(unchecked.values())} mutants not tested yet (the run was stopped):")
        for function, count in sorted(unchecked.items()):
            print(f"  {function}: {count}")

    code = 1 if failing or stale or unchecked else 0
    if not args.no_known and not args.report:
        print("\nknown mutants (scripts/mutants.py):", flush=True)
        known = subprocess.run([sys.executable, str(ROOT / "scripts/mutants.py")], cwd=ROOT,
                               check=False).returncode
        code = max(code, known)
    print(f"\nmutation testing took {time.monotonic() - started:.0f} s; "
          f"{'FAILED' if code else 'passed'}")
    return code


if __name__ == "__main__":
    sys.exit(main())

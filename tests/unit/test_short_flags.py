"""A short flag means one option in every task that has that option, or is not a flag at all.
invoke's automatic short flags (the first free letter of each option's name) made -s --set in
most tasks but --stage in verify, and -t --target, --tag, --to or --test."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import tasks

ROOT = Path(__file__).resolve().parents[2]
SHORT = {"-m": "--manifest", "-t": "--target", "-s": "--set"}


def flags_by_task() -> dict[str, dict[str, str]]:
    """Each task's flags as invoke's parser reads them: flag as typed -> its long option."""
    # A copy: invoke consumes a task's help texts when it builds the parser from them.
    contexts = copy.deepcopy(tasks.ns).to_contexts()
    return {str(context.name): {typed(name): f"--{argument.names[0]}"
                                for argument in context.args.values()
                                for name in argument.names}
            for context in contexts}


def typed(name: str) -> str:
    return f"-{name}" if len(name) == 1 else f"--{name}"


def test_each_short_flag_is_the_same_option_in_every_task() -> None:
    meanings: defaultdict[str, set[str]] = defaultdict(set)
    for flags in flags_by_task().values():
        for flag, option in flags.items():
            if not flag.startswith("--"):
                meanings[flag].add(option)
    assert dict(meanings) == {short: {option} for short, option in SHORT.items()}


def test_every_task_with_the_option_takes_its_short_flag() -> None:
    found = flags_by_task()
    assert len(found) >= 20
    missing = [f"{name} {option}" for name, flags in found.items()
               for short, option in SHORT.items() if option in flags and short not in flags]
    assert missing == []
    # The options the short flags stand for are the ones the manifest tasks share.
    assert all(set(SHORT) <= set(found[name]) for name in ("plan", "build", "verify"))


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("INVOKE_IMAGEFORGE_MANIFEST", None)
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, check=False, timeout=120)


def test_the_command_line_reads_the_short_flags_and_refuses_others() -> None:
    short = invoke("plan", "-t", "efa", "-m", "manifests/smddp.toml", "-s",
                   "stages.efa.version=1.14.1", "--json")
    long = invoke("plan", "--target", "efa", "--manifest", "manifests/smddp.toml", "--set",
                  "stages.efa.version=1.14.1", "--json")
    assert short.returncode == 0, short.stderr
    assert short.stdout == long.stdout
    # Once --output's automatic short flag.
    refused = invoke("render", "-o", "out.Dockerfile")
    assert refused.returncode == 1
    assert "No idea what '-o' is" in refused.stderr
    assert not (ROOT / "out.Dockerfile").exists()

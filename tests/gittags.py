"""A local git repository whose annotated tags are upstream's tag names (NCCL's v2.30.7-1),
for the tests that resolve a release tag to its commit without reaching upstream."""

from __future__ import annotations

import subprocess
from pathlib import Path


def tagged_repo(repo: Path, tags: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    """`repo` made with one empty commit per tag, in order: (its path, tag -> commit)."""
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    commits = {}
    for tag in tags:
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", tag], check=True)
        subprocess.run([*git, "tag", "-a", "-m", tag, tag], check=True)
        commits[tag] = subprocess.run([*git, "rev-parse", "HEAD"], check=True,
                                      capture_output=True, text=True).stdout.strip()
    return str(repo), commits

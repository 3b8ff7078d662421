"""Bare git repositories with a fixed history, written through ``git fast-import``.

fast-import takes authors, dates and file contents from its input stream alone, so the commit
SHAs depend only on what the generator feeds it: no working tree, index, user config, hooks or
clock is involved. Each commit is a full snapshot (``deleteall`` then every file).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sample.templates import SourceFile

AUTHOR = "Sample Upstream <upstream@sample.invalid>"
DEFAULT_BRANCH = "main"

# Per-invocation config that makes git behave the same on every machine.
_GIT_CONFIG = (
    "-c",
    f"init.defaultBranch={DEFAULT_BRANCH}",
    "-c",
    "core.autocrlf=false",
    "-c",
    "commit.gpgSign=false",
    "-c",
    "tag.gpgSign=false",
)

# Lets a client fetch a pinned commit by SHA (``git fetch --depth 1 origin <sha>``), which is
# how imageforge fetches sources that are not at a tag.
_SERVE_CONFIG = {
    "uploadpack.allowAnySHA1InWant": "true",
    "uploadpack.allowReachableSHA1InWant": "true",
    "uploadpack.allowTipSHA1InWant": "true",
    "http.receivepack": "false",
}


class GitError(Exception):
    """A git command failed while writing a sample repository."""


@dataclass(frozen=True)
class Commit:
    """One snapshot of the tree, with the refs that point at it."""

    label: str  # how the generator and pins.json name this commit
    message: str
    timestamp: int  # seconds since the epoch, UTC
    files: Sequence[SourceFile]
    gitlinks: Mapping[str, str] = field(default_factory=dict)  # path -> commit SHA (submodule)
    annotated_tags: Sequence[str] = ()
    lightweight_tags: Sequence[str] = ()


def git_env() -> dict[str, str]:
    """Environment with the user's and system's git config shut out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        LC_ALL="C",
        TZ="UTC",
    )
    return env


def run_git(args: Sequence[str], cwd: Path | None = None, stdin: bytes | None = None) -> str:
    """Run git with the fixed config; its stdout, stripped. Raises GitError with stderr."""
    cmd = ["git", *_GIT_CONFIG, *args]
    proc = subprocess.run(
        cmd, cwd=cwd, input=stdin, capture_output=True, env=git_env(), check=False
    )
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise GitError(f"{' '.join(cmd)} failed ({proc.returncode}): {err}")
    return proc.stdout.decode().strip()


def _data(payload: bytes) -> bytes:
    return b"data %d\n" % len(payload) + payload + b"\n"


def _commit_block(commit: Commit, mark: int) -> bytes:
    who = f"{AUTHOR} {commit.timestamp} +0000".encode()
    out = [
        f"commit refs/heads/{DEFAULT_BRANCH}\n".encode(),
        b"mark :%d\n" % mark,
        b"author " + who + b"\n",
        b"committer " + who + b"\n",
        _data(commit.message.encode()),
    ]
    if mark > 1:
        out.append(b"from :%d\n" % (mark - 1))
    out.append(b"deleteall\n")
    for source in sorted(commit.files, key=lambda f: f.path):
        out.append(b"M %o inline %s\n" % (0o100000 | source.mode, source.path.encode()))
        out.append(_data(source.data))
    for path, sha in sorted(commit.gitlinks.items()):
        out.append(f"M 160000 {sha} {path}\n".encode())
    out.append(b"\n")
    return b"".join(out)


def _tag_blocks(commit: Commit, mark: int) -> bytes:
    out: list[bytes] = []
    for tag in commit.annotated_tags:
        out += [
            f"tag {tag}\n".encode(),
            b"from :%d\n" % mark,
            f"tagger {AUTHOR} {commit.timestamp} +0000\n".encode(),
            _data(f"{tag}\n".encode()),
        ]
    for tag in commit.lightweight_tags:
        out += [f"reset refs/tags/{tag}\n".encode(), b"from :%d\n\n" % mark]
    return b"".join(out)


def fast_import_stream(commits: Sequence[Commit]) -> bytes:
    """The fast-import input for a linear history of ``commits``."""
    blocks = [b"feature done\n"]
    for mark, commit in enumerate(commits, start=1):
        blocks.append(_commit_block(commit, mark))
        blocks.append(_tag_blocks(commit, mark))
    blocks.append(b"done\n")
    return b"".join(blocks)


def write_bare_repo(path: Path, commits: Sequence[Commit]) -> dict[str, str]:
    """Create the bare repository ``path``; returns commit label -> SHA."""
    path.mkdir(parents=True)
    # An empty template: no sample hooks or description, whose text varies with git's version.
    run_git(["init", "--quiet", "--bare", "--template=", str(path)])
    for key, value in _SERVE_CONFIG.items():
        run_git(["config", key, value], cwd=path)
    run_git(
        ["fast-import", "--quiet", "--date-format=raw"], cwd=path, stdin=fast_import_stream(commits)
    )
    shas: dict[str, str] = {}
    for index, commit in enumerate(commits):
        back = len(commits) - 1 - index
        shas[commit.label] = run_git(["rev-parse", f"{DEFAULT_BRANCH}~{back}"], cwd=path)
    return shas


def tag_commits(path: Path) -> dict[str, str]:
    """Tag name -> the commit it points at (annotated tags peeled)."""
    out = run_git(
        ["for-each-ref", "--format=%(refname:short) %(*objectname) %(objectname)", "refs/tags"],
        cwd=path,
    )
    tags: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split()
        # Lightweight tags have no peeled object: the second field is then absent.
        tags[parts[0]] = parts[1] if len(parts) == 3 else parts[-1]
    return dict(sorted(tags.items()))

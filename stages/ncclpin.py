"""Which NCCL a pinned PyTorch commit uses: PyTorch's own pin, resolved to an exact NCCL commit.

Up to PyTorch 2.6 the pin is the git submodule third_party/nccl/nccl; from 2.7 it is a tag name
in .ci/docker/ci_commit_pins/nccl*.txt. The version is what makefiles/version.mk says at the
pinned commit, so a post-release fix keeps its release's number, exactly as PyTorch's headers
will report it. Nearest release tags are recorded as context, never used as the pin.

PyTorch's history is large, so for a github.com repository the contents API answers instead of
a clone; any other location (a mirror, file://, a plain path) is read with git.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from imageforge.stageapi import (
    DEFAULT_POLICY,
    CompatibilityError,
    RetryPolicy,
    SourceError,
    gitsource,
    redact,
    repotree,
)

if TYPE_CHECKING:
    import requests

SUBMODULE = "third_party/nccl/nccl"
PIN_DIR = ".ci/docker/ci_commit_pins"
VERSION_MK = "makefiles/version.mk"
GITHUB_API = "https://api.github.com"

RELEASE_TAG = re.compile(r"v(\d+)\.(\d+)\.(\d+)-(\d+)")
PIN_FILE = re.compile(r"nccl(?:-cu\d+)?\.txt")
CUDA = re.compile(r"(\d+)(?:\.(\d+))?")
NUMERIC = re.compile(r"\d+(?:\.\d+)*")
VERSION_LINE = re.compile(r"\s*(NCCL_MAJOR|NCCL_MINOR|NCCL_PATCH|NCCL_SUFFIX)\s*[:?]?=\s*(.*?)\s*")
# PyTorch 2.7 replaced the submodule with pin files; look where the release most likely has it.
PIN_FILES_FROM = (2, 7)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NcclPin:
    """The NCCL a PyTorch commit pins, and how that was found."""

    version: str  # what makefiles/version.mk declares at `commit`, e.g. "2.10.3"
    commit: str  # the exact NCCL commit to build
    # pytorch_repo, pytorch_ref, pytorch_commit, method ("submodule" | "pin-file"), path, pin
    # (gitlink SHA or tag), read_with, nccl_repo, describe, nearest_tags.
    evidence: dict[str, str]


def pytorch_nccl_pin(
    *,
    pytorch_repo: str,
    pytorch_commit: str,
    pytorch_version: str,
    cuda: str | None,
    nccl_repo: str,
    mirrors: Path,
    session: requests.Session | None = None,
    pytorch_ref: str | None = None,
    github_api: str = GITHUB_API,
    github_token: str | None = None,
    policy: RetryPolicy = DEFAULT_POLICY,
) -> NcclPin:
    """Resolve the NCCL that `pytorch_commit` pins to a commit of `nccl_repo` and its version.

    `cuda` ("12.4") picks the pin file of PyTorch releases that pin NCCL per CUDA version.
    `github_token` defaults to $GITHUB_TOKEN; it is sent as a Bearer header and never shown.
    """
    ref = pytorch_ref or f"v{pytorch_version}"
    token = github_token if github_token is not None else os.environ.get("GITHUB_TOKEN")
    with repotree.open_tree(pytorch_repo, pytorch_commit, mirrors, session=session,
                            api=github_api, token=token or None, policy=policy,
                            repo_key="stages.pytorch.repo",
                            commit_key="stages.pytorch.commit") as tree:
        found = _find_pin(tree, ref, pytorch_version, cuda)
    commit = found.pin if found.method == "submodule" else gitsource.resolve_ref(nccl_repo,
                                                                                 found.pin)
    evidence = {
        "pytorch_repo": redact(pytorch_repo), "pytorch_ref": ref,
        "pytorch_commit": pytorch_commit, "method": found.method, "path": found.path,
        "pin": found.pin, "read_with": tree.via, "nccl_repo": redact(nccl_repo),
        **_release_context(nccl_repo, commit, mirrors),
    }
    return NcclPin(version=_version_at(nccl_repo, commit, mirrors), commit=commit,
                   evidence=evidence)


def parse_version_mk(text: str) -> str:
    """NCCL's makefiles/version.mk -> "2.10.3" (NCCL_SUFFIX appended when set)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        match = VERSION_LINE.fullmatch(line)
        if match:
            values[match[1]] = match[2].strip("\"'")
    parts = [values.get(key, "") for key in ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH")]
    if not all(part.isdigit() for part in parts):
        raise ValueError("does not set NCCL_MAJOR, NCCL_MINOR and NCCL_PATCH to numbers")
    return ".".join(parts) + values.get("NCCL_SUFFIX", "")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Found:
    method: str
    path: str
    pin: str


def _find_pin(tree: repotree.Tree, ref: str, version: str, cuda: str | None) -> _Found:
    finders = [_from_submodule, _from_pin_file]
    if _pin_files_first(version):
        finders.reverse()
    for finder in finders:
        found = finder(tree, ref, cuda)
        if found is not None:
            return found
    raise CompatibilityError(
        f"PyTorch {ref} ({tree.label}, read with {tree.via}) pins no NCCL: there is neither a "
        f"submodule {SUBMODULE} nor an nccl*.txt in {PIN_DIR}; set stages.nccl.version to an "
        "explicit version instead of \"auto\"."
    )


def _pin_files_first(version: str) -> bool:
    match = NUMERIC.match(version)
    if match is None:
        return True  # a branch name: the newest layout is the likelier one
    parts = tuple(int(p) for p in match.group().split("."))
    return parts[:2] >= PIN_FILES_FROM


def _from_submodule(tree: repotree.Tree, _ref: str, _cuda: str | None) -> _Found | None:
    sha = tree.gitlink(SUBMODULE)
    return _Found(method="submodule", path=SUBMODULE, pin=sha) if sha else None


def _from_pin_file(tree: repotree.Tree, ref: str, cuda: str | None) -> _Found | None:
    names = sorted(name for name in tree.names(PIN_DIR) if PIN_FILE.fullmatch(name))
    if not names:
        return None
    path = f"{PIN_DIR}/{_choose_pin_file(names, cuda, ref)}"
    lines = [line.strip() for line in tree.text(path).splitlines()]
    pin = next((line for line in lines if line and not line.startswith("#")), None)
    if pin is None:
        raise SourceError(f"{path} of PyTorch {ref} ({tree.label}) is empty; check the "
                          "PyTorch commit")
    return _Found(method="pin-file", path=path, pin=pin)


def _choose_pin_file(names: list[str], cuda: str | None, ref: str) -> str:
    """nccl-cu<major><minor>.txt, else nccl-cu<major>.txt, else nccl.txt."""
    match = CUDA.match(cuda or "")
    wanted = []
    if match:
        major, minor = match[1], match[2] or ""
        wanted = [f"nccl-cu{major}{minor}.txt", f"nccl-cu{major}.txt"]
    chosen = next((name for name in [*wanted, "nccl.txt"] if name in names), None)
    if chosen is not None:
        return chosen
    need = f"CUDA {cuda}" if match else "an unset image.cuda"
    raise CompatibilityError(
        f"PyTorch {ref} pins NCCL per CUDA version in {PIN_DIR} ({', '.join(names)}) and none "
        f"of them is for {need}; set image.cuda to a CUDA those files cover, or set "
        "stages.nccl.version explicitly."
    )


def _git(repo: str, commit: str, mirrors: Path, args: list[str]) -> str:
    """Run git in the cached mirror of `repo`, which is made to contain `commit` first."""
    return gitsource.git_at(repo, commit, args, mirrors=mirrors)


# ---- the NCCL side --------------------------------------------------------------------------


def _version_at(repo: str, commit: str, mirrors: Path) -> str:
    text = gitsource.file_at(repo, commit, VERSION_MK, mirrors=mirrors).decode(errors="replace")
    try:
        return parse_version_mk(text)
    except ValueError as exc:
        raise SourceError(f"{VERSION_MK} at {commit} of {redact(repo)} {exc}; check that "
                          "stages.nccl.repo is an NCCL repository") from None


def _release_context(repo: str, commit: str, mirrors: Path) -> dict[str, str]:
    """The nearest release tags around `commit`, as the mirror knows them (context only)."""
    before = _release_tags(repo, commit, mirrors, "--merged")
    after = _release_tags(repo, commit, mirrors, "--contains") - before
    previous = max(before, key=_release_key, default=None)
    following = min(after, key=_release_key, default=None)
    later = (f"; first release containing it: {following}" if following else
             "; no release contains it yet")
    if previous is None:
        return {"describe": "", "nearest_tags": "no release tag before it" + later}
    distance = int(_git(repo, commit, mirrors, ["rev-list", "--count", f"{previous}..{commit}"]))
    if distance == 0:
        return {"describe": previous, "nearest_tags": f"{previous} (describe: the release "
                                                      "commit itself)"}
    describe = f"{previous}-{distance}-g{commit[:12]}"
    return {"describe": describe,
            "nearest_tags": f"{describe} (describe: {distance} commit(s) after {previous})"
                            + later}


def _release_tags(repo: str, commit: str, mirrors: Path, relation: str) -> set[str]:
    listing = _git(repo, commit, mirrors, ["tag", "--list", relation, commit])
    return {tag for tag in listing.split() if RELEASE_TAG.fullmatch(tag)}


def _release_key(tag: str) -> tuple[int, ...]:
    match = RELEASE_TAG.fullmatch(tag)
    return tuple(int(part) for part in match.groups()) if match else ()

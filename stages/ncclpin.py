"""Which NCCL a pinned PyTorch commit uses: PyTorch's own pin, resolved to an exact NCCL commit.

Up to PyTorch 2.6 the pin is the git submodule third_party/nccl/nccl; from 2.7 it is a tag name
in .ci/docker/ci_commit_pins/nccl*.txt. The version is what makefiles/version.mk says at the
pinned commit, so a post-release fix keeps its release's number, exactly as PyTorch's headers
will report it. Nearest release tags are recorded as context, never used as the pin.

PyTorch's history is large, so for a github.com repository the contents API answers instead of
a clone; any other location (a mirror, file://, a plain path) is read with git.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import requests

from imageforge.stageapi import (
    DEFAULT_POLICY,
    USER_AGENT,
    CompatibilityError,
    RetryPolicy,
    SourceError,
    gitsource,
    redact,
)

SUBMODULE = "third_party/nccl/nccl"
PIN_DIR = ".ci/docker/ci_commit_pins"
VERSION_MK = "makefiles/version.mk"
GITHUB_API = "https://api.github.com"

GITHUB_REPO = re.compile(r"https://(?:www\.)?github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?")
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
    with _tree(pytorch_repo, pytorch_commit, mirrors, session=session, api=github_api,
               token=token or None, policy=policy) as tree:
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


class _Tree(Protocol):
    """Read access to one commit of the PyTorch repository."""

    @property
    def via(self) -> str: ...

    @property
    def label(self) -> str: ...

    def gitlink(self, path: str) -> str | None: ...

    def names(self, directory: str) -> list[str]: ...

    def text(self, path: str) -> str: ...


def _find_pin(tree: _Tree, ref: str, version: str, cuda: str | None) -> _Found:
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


def _from_submodule(tree: _Tree, _ref: str, _cuda: str | None) -> _Found | None:
    sha = tree.gitlink(SUBMODULE)
    return _Found(method="submodule", path=SUBMODULE, pin=sha) if sha else None


def _from_pin_file(tree: _Tree, ref: str, cuda: str | None) -> _Found | None:
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


# ---- reading PyTorch with git ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _GitTree:
    repo: str
    commit: str
    mirrors: Path
    via: str = "git"

    @property
    def label(self) -> str:
        return f"{redact(self.repo)} at {self.commit}"

    def gitlink(self, path: str) -> str | None:
        return next((sha for kind, sha, name in self._entries(path)
                     if kind == "commit" and name == path), None)

    def names(self, directory: str) -> list[str]:
        return [name.rsplit("/", 1)[-1] for kind, _, name in self._entries(f"{directory}/")
                if kind == "blob"]

    def text(self, path: str) -> str:
        return gitsource.file_at(self.repo, self.commit, path, mirrors=self.mirrors).decode()

    def _entries(self, path: str) -> list[tuple[str, str, str]]:
        """(kind, sha, path) of what `git ls-tree` shows at `path`; empty when it is absent."""
        listing = _git(self.repo, self.commit, self.mirrors, ["ls-tree", self.commit, "--", path])
        entries = []
        for line in listing.splitlines():
            meta, _, name = line.partition("\t")
            _, kind, sha = meta.split()
            entries.append((kind, sha, name))
        return entries


def _git(repo: str, commit: str, mirrors: Path, args: list[str]) -> str:
    """Run git in the cached mirror of `repo`, which is made to contain `commit` first."""
    return gitsource.git_at(repo, commit, args, mirrors=mirrors)


# ---- reading PyTorch through the GitHub contents API ----------------------------------------


class _Transient(Exception):
    """A GitHub answer worth retrying."""


@dataclasses.dataclass(frozen=True)
class _GitHubTree:
    owner: str
    name: str
    commit: str
    api: str
    http: requests.Session
    token: str | None
    policy: RetryPolicy
    via: str = "the GitHub contents API"

    @property
    def label(self) -> str:
        return f"github.com/{self.owner}/{self.name} at {self.commit}"

    def gitlink(self, path: str) -> str | None:
        answer = self._get(path)
        if isinstance(answer, dict) and answer.get("type") == "submodule":
            return str(answer["sha"])
        return None

    def names(self, directory: str) -> list[str]:
        answer = self._get(directory)
        if not isinstance(answer, list):
            return []
        return [str(item["name"]) for item in answer
                if isinstance(item, dict) and item.get("type") == "file"]

    def text(self, path: str) -> str:
        answer = self._get(path)
        if isinstance(answer, dict) and answer.get("encoding") == "base64":
            with contextlib.suppress(binascii.Error, UnicodeDecodeError):
                return base64.b64decode(str(answer.get("content", ""))).decode()
        raise SourceError(f"the GitHub API gave no readable {path} for {self.label}; run "
                          "again, or use a git mirror as stages.pytorch.repo")

    def _get(self, path: str) -> Any:
        """The decoded JSON for `path` at the commit, or None when GitHub has no such path."""
        retrying = self.policy.retrying(_Transient)
        try:
            return retrying(self._attempt, path)
        except _Transient as exc:
            raise SourceError(f"the GitHub API did not answer for {path} of {self.label} "
                              f"({exc}); check your network and run again") from None

    def _attempt(self, path: str) -> Any:
        url = f"{self.api.rstrip('/')}/repos/{self.owner}/{self.name}/contents/{quote(path)}"
        try:
            with self.http.get(url, params={"ref": self.commit}, headers=self._headers(),
                               timeout=(10, 60)) as response:
                return self._answer(response, path)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise _Transient(f"{type(exc).__name__}") from exc

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/vnd.github+json", "User-Agent": USER_AGENT,
                   "X-GitHub-Api-Version": "2022-11-28"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _answer(self, response: requests.Response, path: str) -> Any:
        status = response.status_code
        if status == 200:
            try:
                return response.json()
            except ValueError:
                raise _Transient("the answer was not JSON") from None
        if status == 404:
            return self._not_found(response)
        if status in (403, 429) and response.headers.get("X-RateLimit-Remaining") == "0":
            raise self._rate_limited(response)
        if status == 429 or status >= 500:
            raise _Transient(f"{status} {response.reason}")
        hint = ("; GITHUB_TOKEN may lack access to the repository" if self.token else
                "; if this is a rate limit, set GITHUB_TOKEN to a GitHub token")
        raise SourceError(f"the GitHub API answered {status} {response.reason} for {path} of "
                          f"{self.label}{hint}")

    def _not_found(self, response: requests.Response) -> None:
        if "no commit found" in _message(response).lower():
            raise SourceError(f"github.com/{self.owner}/{self.name} has no commit {self.commit};"
                              " check stages.pytorch.commit or run `invoke lock --upgrade`")

    def _rate_limited(self, response: requests.Response) -> SourceError:
        reset = response.headers.get("X-RateLimit-Reset", "")
        when = (time.strftime(" (it resets at %H:%M UTC)", time.gmtime(int(reset)))
                if reset.isdigit() else "")
        advice = ("wait for the reset" if self.token else
                  "set GITHUB_TOKEN to a GitHub token for a higher limit, or wait for the reset")
        return SourceError(f"the GitHub API rate limit is used up{when} while reading "
                           f"{self.label}; {advice}, or use a git mirror as "
                           "stages.pytorch.repo")


def _message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    return str(body.get("message", "")) if isinstance(body, dict) else ""


@contextlib.contextmanager
def _tree(repo: str, commit: str, mirrors: Path, *, session: requests.Session | None,
          api: str, token: str | None, policy: RetryPolicy) -> Iterator[_Tree]:
    github = GITHUB_REPO.fullmatch(repo)
    if github is None:
        yield _GitTree(repo, commit, mirrors)
        return
    http = session or requests.Session()
    try:
        yield _GitHubTree(github[1], github[2], commit, api, http, token, policy)
    finally:
        if session is None:
            http.close()


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

"""One commit of a repository, read a file, a directory listing or a submodule's pin at a
time: through GitHub's contents API for a github.com repository (with the shared retry
policy), else with git in the source cache's mirror of it."""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from imageforge.errors import SourceError
from imageforge.sources import gitsource
from imageforge.sources.download import USER_AGENT, RetryPolicy
from imageforge.textsafe import redact

if TYPE_CHECKING:
    import requests

GITHUB_REPO = re.compile(r"https://(?:www\.)?github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?")


class Tree(Protocol):
    """Read access to one commit of a repository."""

    @property
    def via(self) -> str: ...

    @property
    def label(self) -> str: ...

    def gitlink(self, path: str) -> str | None: ...

    def names(self, directory: str) -> list[str]: ...

    def text(self, path: str) -> str: ...


@dataclasses.dataclass(frozen=True)
class GitTree:
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
        return gitsource.entries_at(self.repo, self.commit, path, mirrors=self.mirrors)


class _Transient(Exception):
    """A GitHub answer worth retrying."""


@dataclasses.dataclass(frozen=True)
class GitHubTree:
    owner: str
    name: str
    commit: str
    api: str
    http: requests.Session
    token: str | None
    policy: RetryPolicy
    # The manifest keys a user changes when the API cannot answer: the repository (a git
    # mirror instead) and the commit.
    repo_key: str
    commit_key: str
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
                          f"again, or use a git mirror as {self.repo_key}")

    def _get(self, path: str) -> Any:
        """The decoded JSON for `path` at the commit, or None when GitHub has no such path."""
        retrying = self.policy.retrying(_Transient)
        try:
            return retrying(self._attempt, path)
        except _Transient as exc:
            raise SourceError(f"the GitHub API did not answer for {path} of {self.label} "
                              f"({exc}); check your network and run again") from None

    def _attempt(self, path: str) -> Any:
        import requests

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
                              f" check {self.commit_key} or run `invoke lock --upgrade`")

    def _rate_limited(self, response: requests.Response) -> SourceError:
        reset = response.headers.get("X-RateLimit-Reset", "")
        when = (time.strftime(" (it resets at %H:%M UTC)", time.gmtime(int(reset)))
                if reset.isdigit() else "")
        advice = ("wait for the reset" if self.token else
                  "set GITHUB_TOKEN to a GitHub token for a higher limit, or wait for the reset")
        return SourceError(f"the GitHub API rate limit is used up{when} while reading "
                           f"{self.label}; {advice}, or use a git mirror as {self.repo_key}")


def _message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    return str(body.get("message", "")) if isinstance(body, dict) else ""


@contextlib.contextmanager
def open_tree(repo: str, commit: str, mirrors: Path, *, session: requests.Session | None,
              api: str, token: str | None, policy: RetryPolicy, repo_key: str,
              commit_key: str) -> Iterator[Tree]:
    """One commit of `repo`: through GitHub's contents API for a github.com repository (no
    clone of a large history), else with git in a cached mirror."""
    import requests

    github = GITHUB_REPO.fullmatch(repo)
    if github is None:
        yield GitTree(repo, commit, mirrors)
        return
    http = session or requests.Session()
    try:
        yield GitHubTree(github[1], github[2], commit, api, http, token, policy, repo_key,
                         commit_key)
    finally:
        if session is None:
            http.close()

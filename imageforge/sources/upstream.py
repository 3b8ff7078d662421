"""Upstream releases: the versions a stage may move to under `invoke lock --upgrade`.

A stage's releases are listed where its source lives:

- a git stage: the repository's tags that its ref template produces (`v{version}-1` for NCCL,
  `v{version}` for the others; `v1.1.3-aws` gives version `1.1.3-aws`);
- a file on github.com (release assets, tag archives): the GitHub tags API;
- a file on PyPI: the PyPI JSON API, releases that have a file the URL template names;
- any other file: the HTML index page (autoindex) of the directory holding the first URL path
  segment with a placeholder, e.g. the links `aws-efa-installer-{version}.tar.gz` of
  `https://host/dir/`.

The newest release the stage's `policy` allows (a packaging specifier; pre-releases are
skipped) wins, and only when it is newer than the manifest's version.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from html.parser import HTMLParser
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urljoin, urlsplit

from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from imageforge.errors import ManifestError, SourceError
from imageforge.model.manifest import Manifest, template
from imageforge.model.stage import Context, Stage
from imageforge.model.validate import problem
from imageforge.sources import gitsource, wheelmeta
from imageforge.sources.download import DEFAULT_POLICY, USER_AGENT, RetryPolicy
from imageforge.textsafe import redact

if TYPE_CHECKING:
    import requests

GITHUB_API = "https://api.github.com"
PYPI = "https://pypi.org"
PYPI_HOSTS = ("pypi.org", "files.pythonhosted.org", "pypi.python.org")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".zip")
PLACEHOLDER = re.compile(r"\{(version|version_underscored)\}")
GITHUB_PATH = re.compile(r"/([\w.-]+)/([\w.-]+?)(?:\.git)?(?:/.*)?")
NEXT_LINK = re.compile(r'<([^>]+)>;\s*rel="next"')
# A vendor's build of a release ("1.1.3-aws") orders like the release itself.
FLAVOUR = re.compile(r"(.+)-[A-Za-z]+")


def _unchanged(url: str) -> str:
    return url


@dataclasses.dataclass(frozen=True, kw_only=True)
class Endpoints:
    """Where listings are read. Tests point the APIs at local servers."""

    github_api: str = GITHUB_API
    pypi: str = PYPI
    # None: $GITHUB_TOKEN. Sent as a Bearer header to the GitHub API only, never shown.
    github_token: str | None = None
    policy: RetryPolicy = DEFAULT_POLICY
    # Where a URL is actually read (rewrite rules); what is recorded stays the original.
    locate: Callable[[str], str] = _unchanged

    def token(self) -> str | None:
        return self.github_token if self.github_token is not None else (
            os.environ.get("GITHUB_TOKEN") or None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Listing:
    source: str  # the listing's original location, redacted
    versions: tuple[str, ...]  # releases, written as the manifest would write them


@dataclasses.dataclass(frozen=True, kw_only=True)
class Upgrade:
    stage: str
    old: str
    new: str
    policy: str
    source: str

    def to_json(self) -> dict[str, str]:
        return {"from": self.old, "to": self.new, "policy": self.policy, "source": self.source}


def parse_version(text: str) -> Version | None:
    """A release version as packaging orders it, or None for what is not one."""
    flavour = FLAVOUR.fullmatch(text)
    for candidate in [text, *([flavour[1]] if flavour else [])]:
        try:
            return Version(candidate)
        except InvalidVersion:
            continue
    return None


def newest(versions: Iterable[str], policy: str) -> str | None:
    """The newest final release in `versions` that `policy` allows."""
    allowed = SpecifierSet(policy)
    ranked = []
    for text in versions:
        parsed = parse_version(text)
        if parsed is None or parsed.is_prerelease or parsed.is_devrelease:
            continue
        if allowed.contains(parsed):
            ranked.append((parsed, text))
    return max(ranked)[1] if ranked else None


def upgrades(manifest: Manifest, registry: Mapping[str, Stage], names: Sequence[str],
             endpoints: Endpoints) -> list[Upgrade]:
    """The version moves `lock --upgrade` makes among `names`: stages without a policy keep
    their version, and so do stages already at the newest allowed release."""
    found = []
    for name in names:
        policy = manifest.stages.get(name, {}).get("policy")
        if policy:
            upgrade = _upgrade(manifest, registry[name], str(policy), endpoints)
            if upgrade is not None:
                found.append(upgrade)
    return found


def _upgrade(manifest: Manifest, stage: Stage, policy: str, endpoints: Endpoints
             ) -> Upgrade | None:
    where = f"{manifest.path}: stages.{stage.name}"
    current = str(manifest.stages[stage.name]["version"])
    current_version = parse_version(current)
    if current_version is None:
        raise ManifestError(f"{where}.version {current!r} is not a release version, so policy "
                            f"{policy!r} cannot upgrade it; pin a release or remove the policy.")
    listing = releases(manifest, stage, endpoints)
    best = newest(listing.versions, policy)
    best_version = parse_version(best) if best else None
    if best is None or best_version is None or best_version <= current_version:
        return None
    return Upgrade(stage=stage.name, old=current, new=best, policy=policy, source=listing.source)


def releases(manifest: Manifest, stage: Stage, endpoints: Endpoints) -> Listing:
    """Every release of `stage` its upstream lists."""
    inputs = manifest.stages[stage.name]
    if stage.pypi_project:
        return pypi_releases(stage.pypi_project, endpoints)
    values = {**{key: field.default for key, field in stage.fields.items()}, **inputs}
    wheels = stage.wheel_index(Context(image=manifest.image, stages={stage.name: values}))
    if wheels is not None:
        return wheel_releases(*wheels, endpoints)
    # A stage with both source kinds lists the one the manifest uses.
    if "ref" in stage.fields and not inputs.get("url"):
        return git_releases(str(inputs["repo"]), str(template(manifest, stage, "ref")),
                            endpoints)
    return url_releases(str(template(manifest, stage, "url")), endpoints)


def wheel_releases(index: str, project: str, endpoints: Endpoints) -> Listing:
    """Releases of `project` that have wheels on a simple index (local labels such as +cu130
    are variants of one release)."""
    versions = []
    for wheel in wheelmeta.list_wheels(endpoints.locate(index), project):
        try:
            versions.append(parse_wheel_filename(wheel.filename)[1].public)
        except (InvalidWheelFilename, InvalidVersion):
            continue
    return _listing(f"{redact(index)} ({project})", versions)


def git_releases(repo: str, ref_template: str, endpoints: Endpoints) -> Listing:
    """Releases from the tags of `repo` that `ref_template` produces."""
    version_of = _matcher(ref_template, repo)
    tags = gitsource.list_tags(endpoints.locate(repo))
    return _listing(redact(repo), (version_of(tag) for tag in tags))


def url_releases(url_template: str, endpoints: Endpoints) -> Listing:
    """Releases of a downloaded file, from the listing its URL template points at."""
    parts = urlsplit(url_template)
    segments = parts.path.split("/")
    index = next((i for i, s in enumerate(segments) if PLACEHOLDER.search(s)), None)
    if index is None:
        raise ManifestError(f"{url_template}: the URL has no {{version}}, so there is nothing "
                            "to upgrade; remove the policy or template the URL.")
    host = parts.hostname or ""
    if host == "github.com" and GITHUB_PATH.fullmatch(parts.path):
        return _github_releases(url_template, segments[index], endpoints)
    if host in PYPI_HOSTS:
        return _pypi_releases(url_template, segments[-1], endpoints)
    directory = parts._replace(path="/".join(segments[:index]) + "/", query="", fragment="")
    return _index_releases(directory.geturl(), segments[index], endpoints)


def _listing(source: str, versions: Iterable[str | None]) -> Listing:
    found = tuple(sorted({v for v in versions
                          if v and problem("version", v) is None and parse_version(v)}))
    if not found:
        raise SourceError(f"{source} lists no release the manifest's template names; check "
                          "the url or ref template of the stage, or remove its policy.")
    return Listing(source=source, versions=found)


def _matcher(pattern: str, where: str) -> Callable[[str], str | None]:
    """name -> the version for which `pattern` renders exactly that name, or None."""
    parts = PLACEHOLDER.split(pattern)
    if len(parts) == 1:
        raise ManifestError(f"{where}: {pattern!r} has no {{version}}, so releases cannot be "
                            "told apart; template it or remove the policy.")
    regex = re.compile("".join(re.escape(p) if i % 2 == 0 else "(.+?)"
                               for i, p in enumerate(parts)))
    underscored = parts[1] == "version_underscored"

    def version_of(name: str) -> str | None:
        match = regex.fullmatch(name)
        if match is None:
            return None
        version = match[1].replace("_", ".") if underscored else match[1]
        return version if _render(pattern, version) == name else None

    return version_of


def _render(pattern: str, version: str) -> str:
    names = {"version": version, "version_underscored": version.replace(".", "_")}
    return PLACEHOLDER.sub(lambda m: names[m[1]], pattern)


# ---- HTTP index pages -----------------------------------------------------------------------


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(value for key, value in attrs if key == "href" and value)


def _index_releases(directory: str, segment: str, endpoints: Endpoints) -> Listing:
    located = endpoints.locate(directory)
    page = _get(located, headers={}, policy=endpoints.policy, what=directory)
    links = _Links()
    links.feed(page.text)
    version_of = _matcher(segment, directory)
    names = []
    for href in links.hrefs:
        link = urljoin(located, href).split("?", 1)[0].split("#", 1)[0]
        if link.startswith(located):
            names.append(unquote(link[len(located):].rstrip("/")))
    return _listing(redact(directory), (version_of(n) for n in names if "/" not in n))


# ---- the GitHub tags API --------------------------------------------------------------------


def _github_releases(url_template: str, segment: str, endpoints: Endpoints) -> Listing:
    match = GITHUB_PATH.fullmatch(urlsplit(url_template).path)
    assert match is not None
    owner, name = match[1], match[2]
    for suffix in ARCHIVE_SUFFIXES:
        segment = segment.removesuffix(suffix)
    source = f"{GITHUB_API}/repos/{owner}/{name}/tags"
    url: str | None = f"{endpoints.github_api.rstrip('/')}/repos/{owner}/{name}/tags?per_page=100"
    headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
    token = endpoints.token()
    tags: list[str] = []
    while url:
        located = endpoints.locate(url)
        # The token is GitHub's: never hand it to a host a rewrite rule sent us to.
        auth = {"Authorization": f"Bearer {token}"} if token and located == url else {}
        page = _get(located, headers={**headers, **auth}, policy=endpoints.policy,
                    what=source)
        tags += [str(t.get("name")) for t in _json(page, source) if isinstance(t, dict)]
        following = NEXT_LINK.search(page.headers.get("Link", ""))
        url = following[1] if following else None
    version_of = _matcher(segment, source)
    return _listing(source, (version_of(tag) for tag in tags))


# ---- the PyPI JSON API ----------------------------------------------------------------------


def _pypi_releases(url_template: str, filename: str, endpoints: Endpoints) -> Listing:
    project = PLACEHOLDER.split(filename)[0].rstrip("-")
    if not project:
        raise ManifestError(f"{url_template}: cannot tell the PyPI project from the file name; "
                            "name the file <project>-{version}-... as PyPI does.")
    source, releases = _pypi_project(project, endpoints)
    return _listing(source, (version for version, files in releases.items()
                             if _has_file(files, _render(filename, version))))


def pypi_releases(project: str, endpoints: Endpoints) -> Listing:
    """Releases of a package pip installs by name: those with a file not yanked."""
    source, releases = _pypi_project(project, endpoints)
    return _listing(source, (version for version, files in releases.items()
                             if isinstance(files, list) and any(
                                 isinstance(f, dict) and not f.get("yanked") for f in files)))


def _pypi_project(project: str, endpoints: Endpoints) -> tuple[str, dict[str, Any]]:
    """PyPI's JSON page of `project`: where it is, and its releases by version."""
    normalized = re.sub(r"[-_.]+", "-", project).lower()
    source = f"{PYPI}/pypi/{normalized}/json"
    url = f"{endpoints.pypi.rstrip('/')}/pypi/{normalized}/json"
    answer = _json(_get(endpoints.locate(url), headers={}, policy=endpoints.policy,
                        what=source), source)
    releases = answer.get("releases", {}) if isinstance(answer, dict) else {}
    return source, releases if isinstance(releases, dict) else {}


def _has_file(files: Any, filename: str) -> bool:
    return isinstance(files, list) and any(
        isinstance(f, dict) and f.get("filename") == filename and not f.get("yanked")
        for f in files)


# ---- HTTP ----------------------------------------------------------------------------------


class _Transient(Exception):
    """A failure worth retrying; the message is safe to show."""


def _get(url: str, *, headers: Mapping[str, str], policy: RetryPolicy,
         what: str) -> requests.Response:
    """GET `url` with retries; `what` names it in errors (never a token or a rewritten URL)."""
    retrying = policy.retrying(_Transient)
    try:
        return retrying(_attempt, url, {"User-Agent": USER_AGENT, **headers}, what)
    except _Transient as exc:
        raise SourceError(f"could not list the releases at {redact(what)} ({exc}); check the "
                          "URL and your network, then run again.") from None


def _attempt(url: str, headers: Mapping[str, str], what: str) -> requests.Response:
    import requests

    try:
        response = requests.get(url, headers=dict(headers), timeout=(10, 60))
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise _Transient(type(exc).__name__) from exc
    if response.status_code == 200:
        return response
    if response.status_code == 429 or response.status_code >= 500:
        raise _Transient(f"{response.status_code} {response.reason}")
    hint = ("; if this is GitHub's rate limit, set GITHUB_TOKEN" if "api.github.com" in what
            else "")
    raise SourceError(f"{redact(what)} answered {response.status_code} {response.reason} while "
                      f"listing releases{hint}; check the URL template of the stage.")


def _json(response: requests.Response, what: str) -> Any:
    try:
        return response.json()
    except ValueError:
        raise SourceError(f"{redact(what)} did not answer with JSON; check the URL.") from None

"""Where sources are fetched from: their own URLs, URLs moved by rewrite rules, or a mirror.

Rewrite rules (invoke config `imageforge.rewrite`) replace a URL prefix before anything is
fetched, e.g. github.com by a company git proxy; git submodules follow them too.

A mirror is a directory made by `sync` for air-gapped builds:

    index.json                  original URL or repo -> relative path + sha256 or commits
    files/<sha256>/<file name>  every downloaded file (and signatures, signing keys)
    git/<host>/<path>.git       bare repositories holding at least the locked commits

used from the directory itself (`--mirror DIR`) or wherever it is served over HTTP
(`--mirror URL`). With a mirror every source comes from it, never from its original URL.
Locks keep recording the original URLs. A mirror token ($IMAGEFORGE_MIRROR_TOKEN) is sent as
a Bearer header to the mirror's host only; other hosts get ~/.netrc credentials as usual.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import posixpath
import re
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from imageforge.errors import ManifestError, SourceError
from imageforge.jsonfile import write_json
from imageforge.model.inputs import stage_inputs
from imageforge.model.manifest import Manifest
from imageforge.model.sourcetypes import GitSource, Signature, Source, UrlSource
from imageforge.model.stage import Context, Stage, filename_of
from imageforge.sources import gitsource
from imageforge.sources.download import download
from imageforge.sources.locksettle import defined_stages
from imageforge.sources.sources import SourceCache
from imageforge.textsafe import redact

if TYPE_CHECKING:
    import requests

INDEX = "index.json"
FORMAT = 1
TOKEN_ENV = "IMAGEFORGE_MIRROR_TOKEN"
LOCATION = re.compile(r"(https?|file)://[^\s]+")


@dataclasses.dataclass(frozen=True)
class Rewrite:
    prefix: str
    replace: str


def parse_rewrites(value: object) -> tuple[Rewrite, ...]:
    """Rules from invoke config: a list of {prefix, replace} tables (invoke.yaml), or one
    string of `PREFIX=REPLACE` pairs separated by spaces ($INVOKE_IMAGEFORGE_REWRITE)."""
    if not value:
        return ()
    if isinstance(value, str):
        value = [_pair(item) for item in value.split()]
    if not isinstance(value, list | tuple):
        raise ManifestError("imageforge.rewrite in the invoke config must be a list of "
                            "{prefix: ..., replace: ...} tables; fix invoke.yaml.")
    return tuple(_rule(number, item) for number, item in enumerate(value))


def _pair(item: str) -> object:
    prefix, sep, replace = item.partition("=")
    return {"prefix": prefix, "replace": replace} if sep else item


def _rule(number: int, item: object) -> Rewrite:
    where = f"imageforge.rewrite[{number}] in the invoke config"
    if not isinstance(item, Mapping) or set(item) != {"prefix", "replace"}:
        raise ManifestError(f"{where} must be {{prefix: URL, replace: URL}} (or PREFIX=REPLACE "
                            "in $INVOKE_IMAGEFORGE_REWRITE); fix it.")
    prefix, replace = str(item["prefix"]), str(item["replace"])
    for url in (prefix, replace):
        if not LOCATION.fullmatch(url):
            raise ManifestError(f"{where}: {redact(url)!r} is not an http(s):// or file:// URL "
                                "without spaces; fix it.")
    if replace.startswith(prefix):
        # git applies insteadOf rules once; ours would move such a URL again on every pass.
        raise ManifestError(f"{where}: the replacement {redact(replace)} starts with the prefix "
                            f"{redact(prefix)} it replaces; use a prefix that is not part of it.")
    return Rewrite(prefix=prefix, replace=replace)


def rewrite(url: str, rules: Sequence[Rewrite]) -> str:
    """`url` with the longest matching prefix replaced (as git's insteadOf picks)."""
    matching = [rule for rule in rules if url.startswith(rule.prefix)]
    if not matching:
        return url
    rule = max(matching, key=lambda r: len(r.prefix))
    return rule.replace + url[len(rule.prefix):]


def token_from_env() -> str | None:
    return os.environ.get(TOKEN_ENV) or None


# ---- fetching through rewrites or a mirror ---------------------------------------------------


class Locations:
    """The sources.Locator of a run: rewrite rules, and a mirror when one is given."""

    def __init__(self, rewrites: Sequence[Rewrite] = (), mirror: str | None = None,
                 token: str | None = None) -> None:
        self.rewrites = tuple(rewrites)
        self.base = _base(mirror) if mirror else None
        self._token = token

    def url(self, url: str) -> str:
        return rewrite(url, self.rewrites)

    def source(self, source: Source) -> Source:
        if self.base is None:
            return self._rewritten(source)
        if isinstance(source, GitSource):
            entry = self._git_entry(source.repo, source.commit)
            return dataclasses.replace(source, repo=self._address(entry["path"]))
        return dataclasses.replace(
            source, url=self._file(source.url, source.sha256),
            signature=self._signature(source.signature))

    def session(self) -> requests.Session | None:
        if self.base is None or not self._token or not self.base.startswith("http"):
            return None
        import requests

        session = requests.Session()
        session.auth = _MirrorAuth(self.base, self._token)
        return session

    def git_config(self) -> dict[str, str]:
        if self.base is None:
            return {f"url.{r.replace}.insteadOf": r.prefix for r in self.rewrites}
        # Submodules name their original URLs; send git to their copies in the mirror.
        config = {f"url.{self._address(entry['path'])}.insteadOf": repo
                  for repo, entry in self._index.get("git", {}).items()}
        if self._token and self.base.startswith("http"):
            config[f"http.{self.base}/.extraHeader"] = f"Authorization: Bearer {self._token}"
        return config

    def _rewritten(self, source: Source) -> Source:
        if isinstance(source, GitSource):
            return dataclasses.replace(source, repo=self.url(source.repo))
        signature = source.signature and dataclasses.replace(
            source.signature, url=self.url(source.signature.url),
            key_url=self.url(source.signature.key_url))
        return dataclasses.replace(source, url=self.url(source.url), signature=signature)

    def _signature(self, signature: Signature | None) -> Signature | None:
        if signature is None:
            return None
        return dataclasses.replace(signature, url=self._file(signature.url, None),
                                   key_url=self._file(signature.key_url, None))

    def _file(self, url: str, sha256: str | None) -> str:
        entry = self._index.get("files", {}).get(redact(url))
        if entry is None:
            raise self._missing(f"{redact(url)} is not in the mirror")
        if sha256 is not None and entry.get("sha256") != sha256:
            raise self._missing(f"the mirror holds {redact(url)} with sha256 "
                                f"{entry.get('sha256')}, not the locked {sha256}")
        return self._address(entry["path"])

    def _git_entry(self, repo: str, commit: str | None) -> Mapping[str, Any]:
        entry: Mapping[str, Any] | None = self._index.get("git", {}).get(redact(repo))
        if entry is None:
            raise self._missing(f"{redact(repo)} is not in the mirror")
        if commit not in entry.get("commits", []):
            raise self._missing(f"the mirror of {redact(repo)} lacks the locked commit {commit}")
        return entry

    def _missing(self, what: str) -> SourceError:
        return SourceError(f"{what} {redact(str(self.base))}; run `invoke mirror.sync --to DIR` "
                           "with this manifest and lock, then use that mirror")

    def _address(self, path: str) -> str:
        return f"{self.base}/{quote(path)}"

    @functools.cached_property
    def _index(self) -> Mapping[str, Any]:
        assert self.base is not None
        with tempfile.TemporaryDirectory(prefix="imageforge-mirror-") as tmp:
            session = self.session()
            try:
                download(f"{self.base}/{INDEX}", Path(tmp) / INDEX, sha256=None, session=session)
            finally:
                if session is not None:
                    session.close()
            return _parse_index(Path(tmp) / INDEX, self.base)


def _base(mirror: str) -> str:
    """The mirror as a URL without a trailing slash: a directory becomes a file:// URL."""
    if re.match(r"(https?|file)://", mirror):
        return mirror.rstrip("/")
    return Path(mirror).expanduser().resolve().as_uri()


class _MirrorAuth:
    """The mirror token for the mirror's host; ~/.netrc for any other host. requests takes
    any callable as a session's auth; subclassing its AuthBase would import requests with
    this module."""

    def __init__(self, base: str, token: str) -> None:
        self.origin = _origin(base)
        self.token = token

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        url = str(request.url)
        if _origin(url) == self.origin:
            request.headers["Authorization"] = f"Bearer {self.token}"
            return request
        from requests.auth import HTTPBasicAuth
        from requests.utils import get_netrc_auth

        netrc = get_netrc_auth(url)
        return HTTPBasicAuth(*netrc)(request) if netrc else request


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower().rpartition("@")[2]


# ---- making a mirror -------------------------------------------------------------------------


def sync(manifest: Manifest, registry: Mapping[str, Stage], cache: SourceCache,
         to: Path) -> Path:
    """Copy every source of the (locked) `manifest` into the mirror `to`; returns its index.

    Files are verified (sha256, signature) through `cache` first. A mirror can be synced
    again with other manifests or locks: what it already holds is kept.
    """
    to.mkdir(parents=True, exist_ok=True)
    index = _read_index(to)
    for source in manifest_sources(manifest, registry):
        if isinstance(source, UrlSource):
            _sync_file(source, cache, to, index)
        else:
            _sync_git(source.repo, source.commit, source.submodules, cache, to, index)
    return _write_index(to, index)


def manifest_sources(manifest: Manifest, registry: Mapping[str, Stage]) -> list[Source]:
    """Every source of every stage the manifest's images need."""
    names = defined_stages(manifest, registry)
    context = Context(image=manifest.image,
                      stages={n: stage_inputs(manifest, registry[n], n) for n in names})
    return [source for name in names for source in registry[name].sources(context)]


def _sync_file(source: UrlSource, cache: SourceCache, to: Path, index: dict[str, Any]) -> None:
    entry = cache.materialize(source)
    assert source.sha256 is not None  # materialize refused unlocked sources
    _add_file(index, to, source.url, entry / source.filename, source.sha256)
    if source.signature is None:
        return
    located = cache.locate(source)
    assert isinstance(located, UrlSource)
    assert located.signature is not None
    for original, where in ((source.signature.url, located.signature.url),
                            (source.signature.key_url, located.signature.key_url)):
        with tempfile.TemporaryDirectory(dir=to) as tmp:
            file = Path(tmp) / filename_of(original)
            digest = download(where, file, sha256=None)
            _add_file(index, to, original, file, digest)


def _add_file(index: dict[str, Any], to: Path, url: str, file: Path, sha256: str) -> None:
    relative = f"files/{sha256}/{filename_of(url)}"
    target = to / relative
    if not target.is_file() or _sha256(target) != sha256:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        shutil.copyfile(file, scratch)
        os.replace(scratch, target)
    index["files"][redact(url)] = {"path": relative, "sha256": sha256}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _sync_git(repo: str, commit: str | None, submodules: tuple[str, ...] | bool,
              cache: SourceCache, to: Path, index: dict[str, Any]) -> None:
    assert commit is not None, "a mirror is synced from a locked manifest"
    relative = _git_path(repo)
    bare = to / relative
    gitsource.mirror_commit(cache.locate_url(repo), commit, bare)
    entry = index["git"].setdefault(redact(repo), {"path": relative, "commits": []})
    entry["commits"] = sorted({*entry["commits"], commit})
    if submodules is False or submodules == ():
        return
    for module in gitsource.submodules_at(repo, bare, commit):
        if submodules is True or module.path in submodules:
            # Inside a chosen submodule every nested one is needed (git's --recursive).
            _sync_git(_module_url(repo, module.url), module.commit, True, cache, to, index)


def _module_url(superproject: str, url: str) -> str:
    """A submodule URL as git resolves it: ./ and ../ are relative to the superproject."""
    if not url.startswith(("./", "../")):
        return url
    parts = urlsplit(superproject)
    if parts.scheme:
        path = posixpath.normpath(f"{parts.path.rstrip('/')}/{url}")
        return parts._replace(path=path).geturl()
    return posixpath.normpath(f"{superproject.rstrip('/')}/{url}")


def _git_path(repo: str) -> str:
    """git/<host>/<path>.git: the original layout, so relative submodule URLs still resolve
    inside the mirror."""
    parts = urlsplit(repo)
    if parts.scheme in ("http", "https"):
        host = (parts.hostname or "host") + (f"_{parts.port}" if parts.port else "")
        path = parts.path
    else:
        host, path = "local", (parts.path if parts.scheme else os.path.abspath(repo))
    segments = [s for s in posixpath.normpath(path).split("/") if s not in ("", ".", "..")]
    if not segments:
        raise SourceError(f"cannot mirror {redact(repo)}: it names no repository path")
    if not segments[-1].endswith(".git"):
        segments[-1] += ".git"
    return "/".join(["git", host, *segments])


def _read_index(to: Path) -> dict[str, Any]:
    path = to / INDEX
    if not path.exists():
        return {"format": FORMAT, "files": {}, "git": {}}
    return dict(_parse_index(path, str(to)))


def _parse_index(path: Path, mirror: str) -> Mapping[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        if data.get("format") != FORMAT or not isinstance(data.get("files"), dict) \
                or not isinstance(data.get("git"), dict):
            raise ValueError("unknown format")
    except (OSError, ValueError, AttributeError) as exc:
        raise SourceError(f"{redact(mirror)}/{INDEX} is not an imageforge mirror index ({exc}); "
                          "run `invoke mirror.sync --to DIR` to make one") from None
    return data


def _write_index(to: Path, index: Mapping[str, Any]) -> Path:
    path = to / INDEX
    ordered = {"format": FORMAT, "files": dict(sorted(index["files"].items())),
               "git": dict(sorted(index["git"].items()))}
    write_json(path, ordered)
    return path

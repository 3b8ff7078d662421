"""Git sources: resolve refs to commits, materialise a commit's tree, read files at a commit.

Everything runs `git` with argument lists. Repository URLs and refs come from manifests, so they
are checked before git sees them: a value starting with ``-`` would be read as an option.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from filelock import FileLock

from imageforge.cmd import run
from imageforge.errors import LockError, SourceError
from imageforge.textsafe import redact

FULL_SHA = re.compile(r"[0-9a-fA-F]{40}")
UNSAFE_CHARS = re.compile(r"[\s\x00-\x1f\x7f]")
# Characters git forbids in ref names; several of them are revision or glob syntax.
REF_FORBIDDEN = re.compile(r"[\s\x00-\x1f\x7f~^:?*\[\\]")
REMOTE_SCHEMES = ("https", "http", "file")

GIT_CONFIG = (
    # Submodules served from file:// are refused by default since git 2.38.1.
    "-c", "protocol.file.allow=always",
    # The checked-out bytes must not depend on this machine's settings.
    "-c", "core.autocrlf=false",
    "-c", "advice.detachedHead=false",
    # Abort stalled HTTP transfers instead of hanging forever.
    "-c", "http.lowSpeedLimit=1000",
    "-c", "http.lowSpeedTime=60",
)
# Variables that would point git at some other repository than the one we run it in.
REPOSITORY_ENV = (
    "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_NAMESPACE",
)


def resolve_ref(repo: str, ref: str) -> str:
    """Return the commit SHA that `ref` (tag, branch or full SHA) names in `repo` right now."""
    return _lookup(repo, ref)[1]


def verify_commit(repo: str, ref: str, commit: str, *, key: str = "commit") -> None:
    """Refuse a hand-pinned `commit` that is not the one `ref` names in `repo`: the image's
    labels and keys would claim a version whose code it does not have. Only a tag or a SHA
    names one commit for good: a commit pinned on a branch (or HEAD) is not compared with
    where the branch is now."""
    name, actual = _lookup(repo, ref)
    fixed = name.startswith("refs/tags/") or FULL_SHA.fullmatch(name)
    if not fixed or actual == commit.lower():
        return
    raise LockError(
        f"{key} {commit} is not {ref} of {redact(repo)}, which is commit {actual}; "
        f"pin {actual} for this version, or drop `commit` and run `invoke lock` (to build "
        f"{commit}, set the version it was tagged as)."
    )


def _lookup(repo: str, ref: str) -> tuple[str, str]:
    """The full name `ref` matched in `repo` (refs/tags/..., refs/heads/..., or the SHA
    itself) and the commit it names."""
    remote = _remote(repo)
    _check_ref(repo, ref)
    if FULL_SHA.fullmatch(ref):
        return ref.lower(), ref.lower()
    refs = _ls_remote(repo, remote, [], [ref, f"{ref}^{{}}"])
    for name in (ref, f"refs/tags/{ref}", f"refs/heads/{ref}"):
        # For an annotated tag the peeled entry is the commit; the plain entry is the tag object.
        commit = refs.get(f"{name}^{{}}") or refs.get(name)
        if commit is not None:
            return name, commit
    raise _missing_ref(repo, remote, ref)


def list_tags(repo: str) -> dict[str, str]:
    """Map every tag of `repo` to the commit it points at (annotated tags peeled)."""
    remote = _remote(repo)
    tags: dict[str, str] = {}
    for name, sha in _ls_remote(repo, remote, ["--tags"], []).items():
        tag = name.removeprefix("refs/tags/")
        if tag.endswith("^{}"):
            tags[tag.removesuffix("^{}")] = sha
        else:
            tags.setdefault(tag, sha)
    return tags


def checkout(
    repo: str,
    commit: str,
    dest: Path,
    *,
    submodules: Sequence[str] | bool = False,
    config: Mapping[str, str] | None = None,
) -> None:
    """Materialise exactly `commit`'s tree into `dest`, without any .git, atomically.

    `submodules`: False for none, True for all (recursively), or the paths to initialise
    (recursively inside them). `dest` must not exist; on failure it is not created.
    `config`: extra git configuration for the fetches (url.*.insteadOf, http.*.extraHeader).
    """
    remote = _remote(repo)
    _check_commit(repo, commit)
    paths = _submodule_paths(repo, submodules)
    if dest.exists():
        raise FileExistsError(f"{dest} already exists")
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        tree = scratch / "tree"
        _run(repo, ["init", "--quiet", str(tree)], "could not create a work tree for")
        _run(repo, ["remote", "add", "origin", remote], "could not configure", cwd=tree)
        _fetch_commit(repo, commit, tree, config)
        _checkout_commit(repo, commit, tree)
        if paths is not None:
            _update_submodules(repo, commit, paths, tree, config)
        _remove_git_dirs(tree)
        tree.rename(dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def entries_at(repo: str, commit: str, path: str, *, mirrors: Path) -> list[tuple[str, str, str]]:
    """(kind, sha, path) of what `git ls-tree` shows at `path` of `commit` ("commit" for a
    submodule's pin, "blob", "tree"); empty when there is nothing there."""
    _check_path(repo, path)
    listing = git_at(repo, commit, ["ls-tree", commit, "--", path], mirrors=mirrors)
    entries = []
    for line in listing.splitlines():
        meta, _, name = line.partition("\t")
        _, kind, sha = meta.split()
        entries.append((kind, sha, name))
    return entries


def file_at(repo: str, commit: str, path: str, *, mirrors: Path) -> bytes:
    """Return the contents of file `path` at `commit` of `repo`."""
    _check_path(repo, path)
    mirror = _mirror_with(repo, commit, mirrors)
    proc = _git(["cat-file", "blob", f"{commit}:{path}"], cwd=mirror)
    if proc.returncode != 0:
        raise SourceError(
            f"{redact(repo)} has no file {path!r} at {commit} ({_last_line(proc, repo)}); check "
            "the path"
        )
    return proc.stdout


def _remote(repo: str) -> str:
    """The URL to hand to git: a checked URL, or a plain path made absolute.

    An absolute path keeps git from reading ``host:path`` as ssh or ``x::y`` as a transport
    helper, and keeps it valid when git runs in another directory.
    """
    if not repo or repo.startswith("-") or UNSAFE_CHARS.search(repo):
        raise SourceError(
            f"refusing git repository {redact(repo)!r}: it is empty, starts with '-' or contains "
            "whitespace or control characters; fix the repo URL"
        )
    if "://" not in repo:
        return os.path.abspath(os.path.expanduser(repo))
    scheme = urlsplit(repo).scheme.lower()
    if scheme not in REMOTE_SCHEMES:
        raise SourceError(
            f"refusing git repository {redact(repo)}: scheme {scheme!r} is not supported; use "
            "https://, http://, file:// or a local path"
        )
    return repo


def _check_ref(repo: str, ref: str) -> None:
    if not ref or ref.startswith("-") or REF_FORBIDDEN.search(ref) or ".." in ref:
        raise SourceError(
            f"refusing git ref {ref!r} for {redact(repo)}: it is empty, starts with '-' or holds "
            "whitespace, control characters, '..' or one of ~^:?*[\\; use a tag, branch or SHA"
        )


def _check_commit(repo: str, commit: str) -> None:
    if not FULL_SHA.fullmatch(commit):
        raise SourceError(
            f"{commit!r} is not a full 40-character commit SHA for {redact(repo)}; run "
            "`invoke lock` to pin one"
        )


def _check_path(repo: str, path: str) -> None:
    parts = path.split("/")
    if not path or path.startswith(("-", "/")) or UNSAFE_CHARS.search(path) or ".." in parts:
        raise SourceError(
            f"refusing path {path!r} in {redact(repo)}: use a relative path without '..', "
            "whitespace or a leading '-'"
        )


def _submodule_paths(repo: str, submodules: Sequence[str] | bool) -> list[str] | None:
    """None for no submodules, [] for all of them, else the requested paths."""
    if submodules is True:
        return []
    if submodules is False or not submodules:
        return None
    paths = [submodules] if isinstance(submodules, str) else list(submodules)
    for path in paths:
        _check_path(repo, path)
    return paths


def _git_env(config: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in REPOSITORY_ENV}
    # Never wait for a password on a terminal; fail instead. LC_ALL keeps messages parseable.
    env.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    # Extra configuration travels in the environment, not on the command line that any
    # process can read: it may carry an Authorization header.
    start = int(env.get("GIT_CONFIG_COUNT", "0") or "0")
    for number, (key, value) in enumerate((config or {}).items(), start=start):
        env[f"GIT_CONFIG_KEY_{number}"] = key
        env[f"GIT_CONFIG_VALUE_{number}"] = value
    if config:
        env["GIT_CONFIG_COUNT"] = str(start + len(config))
    return env


def _git(args: Sequence[str], *, cwd: Path | None = None,
         config: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return run(["git", *GIT_CONFIG, *args], cwd=cwd, env=_git_env(config), timeout=None,
               error=SourceError, missing="install git and run again")


def _run(repo: str, args: Sequence[str], failure: str, *, cwd: Path | None = None,
         config: Mapping[str, str] | None = None) -> bytes:
    """Run git and return its stdout; `failure` + repo + git's last error line otherwise."""
    proc = _git(args, cwd=cwd, config=config)
    if proc.returncode != 0:
        raise SourceError(
            f"{failure} {redact(repo)} ({_last_line(proc, repo)}); check the repository URL and "
            "your network"
        )
    return proc.stdout


def _last_line(proc: subprocess.CompletedProcess[bytes], repo: str) -> str:
    lines = [line for line in proc.stderr.decode(errors="replace").splitlines() if line.strip()]
    if not lines:
        return f"git exited with {proc.returncode}"
    return lines[-1].strip().replace(repo, redact(repo))


def _ls_remote(repo: str, remote: str, options: list[str], patterns: list[str]) -> dict[str, str]:
    out = _run(repo, ["ls-remote", *options, "--", remote, *patterns], "git ls-remote failed for")
    refs: dict[str, str] = {}
    for line in out.decode().splitlines():
        sha, _, name = line.partition("\t")
        refs[name] = sha
    return refs


def _missing_ref(repo: str, remote: str, ref: str) -> SourceError:
    names = [
        name.removeprefix("refs/tags/").removeprefix("refs/heads/")
        for name in _ls_remote(repo, remote, ["--tags", "--heads", "--refs"], [])
    ]
    close = difflib.get_close_matches(ref, names, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return SourceError(
        f"{redact(repo)} has no tag or branch {ref!r}{hint}; check the version in the manifest"
    )


def _fetch_commit(repo: str, commit: str, tree: Path,
                  config: Mapping[str, str] | None = None) -> None:
    shallow = _git(["fetch", "--quiet", "--no-tags", "--depth", "1", "origin", commit], cwd=tree,
                   config=config)
    if shallow.returncode == 0:
        return
    # Servers speaking the old protocol refuse to send a commit that no ref points at;
    # fetching every branch and tag still finds it when it is reachable.
    _run(repo, ["fetch", "--quiet", "--tags", "origin"], f"could not fetch {commit} from",
         cwd=tree, config=config)


def _checkout_commit(repo: str, commit: str, tree: Path) -> None:
    proc = _git(["checkout", "--quiet", "--detach", commit], cwd=tree)
    if proc.returncode != 0:
        raise SourceError(
            f"commit {commit} is not in {redact(repo)} ({_last_line(proc, repo)}); run "
            "`invoke lock` to pin an existing commit"
        )
    head = _run(repo, ["rev-parse", "HEAD"], "could not read HEAD of", cwd=tree).decode().strip()
    if head != commit.lower():
        raise SourceError(
            f"checking out {commit} from {redact(repo)} gave {head}; the repository is "
            "inconsistent, so remove the cache entry and run again"
        )


def _update_submodules(repo: str, commit: str, paths: list[str], tree: Path,
                       config: Mapping[str, str] | None) -> None:
    # Blobless clones keep big submodule histories cheap; servers without filter support
    # simply send everything.
    _run(repo, ["submodule", "update", "--init", "--recursive", "--filter=blob:none", "--",
                *paths], f"could not fetch the submodules at {commit} of", cwd=tree,
         config=config)


def _remove_git_dirs(tree: Path) -> None:
    for root, dirs, files in os.walk(tree):
        if ".git" in dirs:
            dirs.remove(".git")
            shutil.rmtree(Path(root, ".git"))
        if ".git" in files:
            # A submodule's .git is a file pointing into the superproject's .git/modules.
            Path(root, ".git").unlink()


def git_at(repo: str, commit: str, args: Sequence[str], *, mirrors: Path) -> str:
    """Run a read-only git command in the cached mirror of `repo`, which holds `commit`."""
    mirror = _mirror_with(repo, commit, mirrors)
    return _run(repo, args, f"git {args[0]} failed at {commit} in", cwd=mirror).decode()


def _mirror_with(repo: str, commit: str, mirrors: Path) -> Path:
    """A cached bare clone of `repo` that is known to contain `commit`."""
    remote = _remote(repo)
    _check_commit(repo, commit)
    mirrors.mkdir(parents=True, exist_ok=True)
    mirror = mirrors / _mirror_name(remote)
    with FileLock(mirrors / f"{mirror.name}.lock"):
        if not mirror.exists():
            _clone_mirror(repo, remote, mirror)
        if not _has_commit(mirror, commit):
            _update_mirror(repo, commit, mirror)
    return mirror


def _mirror_name(remote: str) -> str:
    stem = remote.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", stem) or "repo"
    return f"{slug}-{hashlib.sha256(remote.encode()).hexdigest()[:16]}.git"


def _clone_mirror(repo: str, remote: str, mirror: Path) -> None:
    scratch = Path(tempfile.mkdtemp(dir=mirror.parent, prefix=f".{mirror.name}."))
    try:
        # Only trees and commits are needed up front; blobs are fetched when a file is read.
        _run(repo, ["clone", "--quiet", "--bare", "--filter=blob:none", "--", remote,
                    str(scratch / "repo")], "could not clone")
        (scratch / "repo").rename(mirror)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _has_commit(mirror: Path, commit: str) -> bool:
    return _git(["cat-file", "-e", f"{commit}^{{commit}}"], cwd=mirror).returncode == 0


def _update_mirror(repo: str, commit: str, mirror: Path) -> None:
    _git(["fetch", "--quiet", "origin", commit], cwd=mirror)
    if _has_commit(mirror, commit):
        return
    _run(repo, ["fetch", "--quiet", "--prune", "origin", "+refs/heads/*:refs/heads/*",
                "+refs/tags/*:refs/tags/*"], "could not update the mirror of", cwd=mirror)
    if not _has_commit(mirror, commit):
        raise SourceError(
            f"commit {commit} is not in {redact(repo)}; run `invoke lock` to pin an existing "
            "commit"
        )


# ---- bare mirrors for air-gapped builds -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Submodule:
    path: str
    url: str  # as .gitmodules writes it: absolute, or relative to the superproject's URL
    commit: str


def mirror_commit(repo: str, commit: str, bare: Path) -> None:
    """Make the bare repository `bare` (created when missing) hold `commit` of `repo`, kept
    reachable by the branch locked/<commit> so that any git client can fetch it."""
    remote = _remote(repo)
    _check_commit(repo, commit)
    if not bare.exists():
        _init_bare(repo, bare)
    if not _has_commit(bare, commit):
        # The commit with its history and nothing else (no other branches): a shallow copy
        # could not be served by plain HTTP servers, whose clients walk history.
        wanted = _git(["fetch", "--quiet", "--no-tags", remote, commit], cwd=bare)
        if wanted.returncode != 0:
            _run(repo, ["fetch", "--quiet", remote, "+refs/heads/*:refs/upstream/heads/*",
                        "+refs/tags/*:refs/upstream/tags/*"], f"could not fetch {commit} from",
                 cwd=bare)
    if not _has_commit(bare, commit):
        raise SourceError(f"commit {commit} is not in {redact(repo)}; run `invoke lock` to pin "
                          "an existing commit")
    _run(repo, ["update-ref", f"refs/heads/locked/{commit}", commit],
         "could not record the commit in the mirror of", cwd=bare)
    # Plain HTTP servers (no git on them) serve a repository through these index files.
    _run(repo, ["update-server-info"], "could not index the mirror of", cwd=bare)


def _init_bare(repo: str, bare: Path) -> None:
    bare.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=bare.parent, prefix=f".{bare.name}."))
    try:
        _run(repo, ["init", "--quiet", "--bare", str(scratch / "repo")],
             "could not create a mirror of")
        # Clients fetch the locked commits by SHA.
        _run(repo, ["config", "uploadpack.allowAnySHA1InWant", "true"],
             "could not configure the mirror of", cwd=scratch / "repo")
        (scratch / "repo").rename(bare)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def submodules_at(repo: str, bare: Path, commit: str) -> list[Submodule]:
    """The submodules `commit` pins, read from a repository that holds `commit`."""
    listing = _git(["config", "--blob", f"{commit}:.gitmodules", "--get-regexp",
                    r"^submodule\..*\.(path|url)$"], cwd=bare)
    if listing.returncode != 0:
        return []  # no .gitmodules: no submodules
    found: dict[str, dict[str, str]] = {}
    for line in listing.stdout.decode().splitlines():
        key, _, value = line.partition(" ")
        name, _, attribute = key.removeprefix("submodule.").rpartition(".")
        found.setdefault(name, {})[attribute] = value
    modules = []
    for entry in found.values():
        if "path" not in entry or "url" not in entry:
            continue
        _check_path(repo, entry["path"])
        sha = _gitlink(repo, bare, commit, entry["path"])
        if sha is not None:
            modules.append(Submodule(path=entry["path"], url=entry["url"], commit=sha))
    return modules


def _gitlink(repo: str, bare: Path, commit: str, path: str) -> str | None:
    listing = _run(repo, ["ls-tree", commit, "--", path], f"could not list {path!r} at {commit} "
                   "in", cwd=bare).decode()
    fields = listing.split("\t", 1)[0].split()
    return fields[2] if len(fields) == 3 and fields[1] == "commit" else None

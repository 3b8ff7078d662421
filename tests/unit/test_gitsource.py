from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from imageforge.errors import LockError, SourceError
from imageforge.sources import gitsource
from imageforge.sources.gitsource import checkout, entries_at, file_at, list_tags, resolve_ref

FIXED_DATE = "2022-01-31T12:00:00+00:00"


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.com",
        "GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE,
    }
    proc = subprocess.run(["git", "-c", "protocol.file.allow=always", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def commit_files(repo: Path, message: str, files: dict[str, str]) -> str:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(autouse=True)
def isolated_git(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's own git configuration (signing, hooks, url rewrites) must not leak in.
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


@dataclass
class Upstream:
    path: Path
    first: str  # tagged v1.10.1 (lightweight)
    second: str  # tagged v1.10.2 (annotated)
    third: str  # tip of main

    @property
    def url(self) -> str:
        return self.path.as_uri()


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    repo = tmp_path / "nccl"
    repo.mkdir()
    git(repo, "init", "--quiet", "-b", "main")
    first = commit_files(repo, "first", {"makefiles/version.mk": "NCCL_MINOR := 10\n",
                                         "README": "one\n"})
    git(repo, "tag", "v1.10.1")
    second = commit_files(repo, "second", {"README": "two\n", "src/nccl.h": "#define X 2\n"})
    git(repo, "tag", "-a", "v1.10.2", "-m", "release 1.10.2")
    third = commit_files(repo, "third", {"README": "three\n"})
    return Upstream(path=repo, first=first, second=second, third=third)


def test_resolve_lightweight_tag(upstream: Upstream) -> None:
    assert resolve_ref(upstream.url, "v1.10.1") == upstream.first


def test_resolve_annotated_tag_gives_the_commit(upstream: Upstream) -> None:
    tag_object = git(upstream.path, "rev-parse", "v1.10.2")
    assert tag_object != upstream.second
    assert resolve_ref(upstream.url, "v1.10.2") == upstream.second
    assert resolve_ref(str(upstream.path), "refs/tags/v1.10.2") == upstream.second


def test_resolve_branch_and_full_sha(upstream: Upstream) -> None:
    assert resolve_ref(str(upstream.path), "main") == upstream.third
    sha = "A" * 40
    assert resolve_ref(upstream.url, sha) == sha.lower()


def test_relative_plain_path(upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(upstream.path.parent)
    assert resolve_ref("nccl", "main") == upstream.third


def test_missing_ref_suggests_close_tags(upstream: Upstream) -> None:
    with pytest.raises(SourceError) as caught:
        resolve_ref(upstream.url, "v1.10.3")
    message = str(caught.value)
    assert upstream.url in message
    assert "'v1.10.3'" in message
    assert "did you mean v1.10.2, v1.10.1?" in message


def test_unreachable_repo(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"git ls-remote failed for .*missing"):
        resolve_ref(str(tmp_path / "missing"), "v1")


def test_list_tags_peels_annotated_tags(upstream: Upstream) -> None:
    assert list_tags(upstream.url) == {"v1.10.1": upstream.first, "v1.10.2": upstream.second}


def test_moved_tag_resolves_to_new_commit(upstream: Upstream) -> None:
    recorded = resolve_ref(upstream.url, "v1.10.2")
    git(upstream.path, "tag", "-f", "-a", "v1.10.2", "-m", "re-tagged", upstream.third)
    assert resolve_ref(upstream.url, "v1.10.2") == upstream.third != recorded


@pytest.mark.parametrize(
    ("repo", "ref"),
    [
        ("--upload-pack=touch pwned", "v1"),
        ("-uxx", "v1"),
        ("ssh://host/repo.git", "v1"),
        ("/srv/repo\n", "v1"),
        ("GOOD", "--upload-pack=touch${IFS}pwned"),
        ("GOOD", "-v1"),
        ("GOOD", "v1 v2"),
        ("GOOD", "v1/../main"),
        ("GOOD", "v1\x07"),
        ("GOOD", "v*"),
        ("GOOD", ""),
    ],
)
def test_refuses_option_like_repos_and_refs(
    upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repo: str, ref: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError, match="refusing"):
        resolve_ref(upstream.url if repo == "GOOD" else repo, ref)
    assert not (tmp_path / "pwned").exists()


def tree_of(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): path.read_text()
        for path in sorted(root.rglob("*")) if path.is_file()
    }


def test_checkout_exact_commit_without_git_dir(upstream: Upstream, tmp_path: Path) -> None:
    dest = tmp_path / "ctx" / "nccl"
    checkout(upstream.url, upstream.second, dest)
    assert tree_of(dest) == {"README": "two\n", "makefiles/version.mk": "NCCL_MINOR := 10\n",
                             "src/nccl.h": "#define X 2\n"}
    assert not (dest / ".git").exists()
    assert sorted(os.listdir(dest.parent)) == ["nccl"]


def test_checkout_from_plain_path(upstream: Upstream, tmp_path: Path) -> None:
    dest = tmp_path / "ctx"
    checkout(str(upstream.path), upstream.first, dest)
    assert tree_of(dest) == {"README": "one\n", "makefiles/version.mk": "NCCL_MINOR := 10\n"}


def test_checkout_falls_back_when_server_refuses_sha_fetch(
    upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Protocol v0 servers refuse to send a commit that no ref points at.
    commit_files(upstream.path, "fourth", {"README": "four\n"})
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "protocol.version")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "0")
    dest = tmp_path / "ctx"
    checkout(upstream.url, upstream.third, dest)
    assert (dest / "README").read_text() == "three\n"


def test_checkout_of_unknown_commit_leaves_nothing(upstream: Upstream, tmp_path: Path) -> None:
    folder = tmp_path / "ctx"
    folder.mkdir()
    with pytest.raises(SourceError, match=f"{'0' * 40}.*{upstream.url}.*invoke lock"):
        checkout(upstream.url, "0" * 40, folder / "nccl")
    assert os.listdir(folder) == []


def test_checkout_requires_full_sha(upstream: Upstream, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="full 40-character"):
        checkout(upstream.url, "v1.10.2", tmp_path / "ctx")


@dataclass
class Super:
    url: str
    commit: str
    lib_pinned: str
    lib_tip: str


@pytest.fixture
def superproject(tmp_path: Path) -> Super:
    lib = tmp_path / "lib"
    lib.mkdir()
    git(lib, "init", "--quiet", "-b", "main")
    pinned = commit_files(lib, "lib one", {"lib.h": "v1\n"})
    top = tmp_path / "pytorch"
    top.mkdir()
    git(top, "init", "--quiet", "-b", "main")
    commit_files(top, "top", {"setup.py": "print()\n"})
    git(top, "submodule", "--quiet", "add", lib.as_uri(), "third_party/lib")
    git(top, "commit", "--quiet", "-m", "add lib")
    commit = git(top, "rev-parse", "HEAD")
    # Upstream moves on; the superproject still pins the first commit.
    tip = commit_files(lib, "lib two", {"lib.h": "v2\n"})
    return Super(url=top.as_uri(), commit=commit, lib_pinned=pinned, lib_tip=tip)


def test_entries_at_reads_a_submodule_pin_from_one_mirror(superproject: Super,
                                                         tmp_path: Path) -> None:
    mirrors = tmp_path / "mirrors"
    [(kind, pin, name)] = entries_at(superproject.url, superproject.commit, "third_party/lib",
                                     mirrors=mirrors)
    assert (kind, name) == ("commit", "third_party/lib")
    assert pin == superproject.lib_pinned != superproject.lib_tip
    # A second lookup reuses the mirror.
    assert entries_at(superproject.url, superproject.commit, "third_party/lib",
                      mirrors=mirrors)[0][1] == pin
    assert len([path for path in mirrors.iterdir() if path.suffix == ".git"]) == 1


def test_entries_at_tells_files_from_submodules_and_absence(superproject: Super,
                                                            tmp_path: Path) -> None:
    mirrors = tmp_path / "m"
    assert [e[0] for e in entries_at(superproject.url, superproject.commit, "setup.py",
                                     mirrors=mirrors)] == ["blob"]
    assert entries_at(superproject.url, superproject.commit, "nope", mirrors=mirrors) == []
    with pytest.raises(SourceError, match="refusing path"):
        entries_at(superproject.url, superproject.commit, "../etc", mirrors=mirrors)


def test_file_at_reads_old_versions(upstream: Upstream, tmp_path: Path) -> None:
    mirrors = tmp_path / "mirrors"
    assert file_at(upstream.url, upstream.first, "README", mirrors=mirrors) == b"one\n"
    # A commit made after the mirror was cloned is fetched on demand.
    newer = commit_files(upstream.path, "fourth", {"README": "four\n"})
    assert file_at(upstream.url, newer, "README", mirrors=mirrors) == b"four\n"
    with pytest.raises(SourceError, match=r"has no file 'missing\.mk'"):
        file_at(upstream.url, upstream.first, "missing.mk", mirrors=mirrors)
    with pytest.raises(SourceError, match="refusing path"):
        file_at(upstream.url, upstream.first, "../etc/passwd", mirrors=mirrors)


def test_checkout_with_pinned_submodules(superproject: Super, tmp_path: Path) -> None:
    dest = tmp_path / "ctx"
    checkout(superproject.url, superproject.commit, dest, submodules=True)
    assert (dest / "third_party/lib/lib.h").read_text() == "v1\n"
    assert not list(dest.rglob(".git"))


def test_checkout_selected_submodules(superproject: Super, tmp_path: Path) -> None:
    without = tmp_path / "without"
    checkout(superproject.url, superproject.commit, without)
    assert list((without / "third_party/lib").iterdir()) == []
    selected = tmp_path / "selected"
    checkout(superproject.url, superproject.commit, selected, submodules=["third_party/lib"])
    assert (selected / "third_party/lib/lib.h").read_text() == "v1\n"


def test_verify_commit_accepts_the_commit_its_tag_names(upstream: Upstream) -> None:
    gitsource.verify_commit(upstream.url, "v1.10.1", upstream.first)
    # An annotated tag is compared by the commit it peels to, not the tag object.
    gitsource.verify_commit(upstream.url, "v1.10.2", upstream.second.upper())
    gitsource.verify_commit(upstream.url, upstream.third, upstream.third)


def test_verify_commit_refuses_another_versions_commit_naming_both(upstream: Upstream) -> None:
    with pytest.raises(LockError) as refused:
        gitsource.verify_commit(upstream.url, "v1.10.2", upstream.first)

    message = str(refused.value)
    assert refused.value.return_code == 8
    assert all(part in message for part in ("v1.10.2", upstream.first, upstream.second))


def test_verify_commit_leaves_a_commit_pinned_on_a_branch_alone(upstream: Upstream) -> None:
    # A branch moves on; the pinned commit is the version.
    gitsource.verify_commit(upstream.url, "main", upstream.first)
    with pytest.raises(LockError):
        gitsource.verify_commit(upstream.url, upstream.third, upstream.first)

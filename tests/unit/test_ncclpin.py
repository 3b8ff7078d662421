from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer, RequestHandler

from imageforge.errors import CompatibilityError, SourceError
from imageforge.sources.download import RetryPolicy
from stages.ncclpin import PIN_DIR, SUBMODULE, NcclPin, parse_version_mk, pytorch_nccl_pin

FIXED_DATE = "2022-01-31T12:00:00+00:00"
FAST = RetryPolicy(attempts=3, max_seconds=10, backoff_initial=0.01, backoff_max=0.02)
GITHUB_PYTORCH = "https://github.com/pytorch/pytorch.git"
CONTENTS = "/repos/pytorch/pytorch/contents/"
API_COMMIT = "1" * 40


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.com",
        "GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE,
    }
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          check=True)
    return proc.stdout.strip()


def commit(repo: Path, message: str, files: dict[str, str], removed: tuple[str, ...] = ()) -> str:
    """Commit exactly these changes; `git add -A` would also drop gitlinks without a checkout."""
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if files:
        git(repo, "add", "--", *files)
    if removed:
        git(repo, "rm", "--quiet", "-r", "--cached", "--", *removed)
    git(repo, "commit", "--quiet", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def version_mk(major: int, minor: int, patch: int) -> str:
    return (f"##### version\nNCCL_MAJOR   := {major}\nNCCL_MINOR   := {minor}\n"
            f"NCCL_PATCH   := {patch}\nNCCL_SUFFIX  :=\nPKG_REVISION := 1\n")


@dataclass(frozen=True)
class Repos:
    nccl: Path
    pytorch: Path
    release: str  # NCCL v2.10.3-1
    fix: str  # untagged post-release fix on top of it; version.mk still says 2.10.3
    newer: str  # NCCL v2.11.4-1
    pt_1_10_2: str  # submodule -> release
    pt_1_11_0: str  # submodule -> fix
    pt_2_7_0: str  # pin files nccl-cu12.txt (v2.11.4-1) and nccl-cu11.txt (v2.10.3-1)
    pt_bare: str  # neither a submodule nor an NCCL pin file
    pt_2_9_0: str  # nccl.txt (v2.11.4-1) and nccl-cu126.txt (v2.10.3-1)


def make_nccl(root: Path) -> tuple[Path, str, str, str]:
    repo = root / "nccl"
    repo.mkdir()
    git(repo, "init", "--quiet", "-b", "master")
    release = commit(repo, "2.10.3-1", {"makefiles/version.mk": version_mk(2, 10, 3),
                                        "src/nccl.h.in": "#define NCCL_MAJOR 2\n"})
    git(repo, "tag", "-a", "v2.10.3-1", "-m", "NCCL 2.10.3-1")
    fix = commit(repo, "fix a hang", {"src/transport.c": "fixed\n"})
    # Matches the v*.*.*-* glob but is not a release: must not be taken as the nearest release.
    git(repo, "tag", "v2.10.3-1-p2p-fix")
    newer = commit(repo, "2.11.4-1", {"makefiles/version.mk": version_mk(2, 11, 4)})
    git(repo, "tag", "v2.11.4-1")
    return repo, release, fix, newer


def make_pytorch(root: Path, release: str, fix: str) -> tuple[Path, list[str]]:
    repo = root / "pytorch"
    repo.mkdir()
    git(repo, "init", "--quiet", "-b", "main")
    gitmodules = ('[submodule "third_party/nccl/nccl"]\n\tpath = third_party/nccl/nccl\n'
                  "\turl = https://github.com/NVIDIA/nccl\n")
    pins = f"{PIN_DIR}/"
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{release},{SUBMODULE}")
    pt_1_10_2 = commit(repo, "1.10.2", {"README.md": "PyTorch\n", ".gitmodules": gitmodules})
    git(repo, "update-index", "--cacheinfo", f"160000,{fix},{SUBMODULE}")
    pt_1_11_0 = commit(repo, "1.11.0", {})
    pt_2_7_0 = commit(repo, "2.7.0", {pins + "nccl-cu12.txt": "v2.11.4-1\n",
                                      pins + "nccl-cu11.txt": "v2.10.3-1\n",
                                      pins + "triton.txt": "abc\n"},
                      removed=(SUBMODULE, ".gitmodules"))
    pt_bare = commit(repo, "no nccl pin", {},
                     removed=(pins + "nccl-cu12.txt", pins + "nccl-cu11.txt"))
    pt_2_9_0 = commit(repo, "2.9.0", {pins + "nccl.txt": "v2.11.4-1\n",
                                      pins + "nccl-cu126.txt": "# CUDA 12.6\n\nv2.10.3-1\n"})
    return repo, [pt_1_10_2, pt_1_11_0, pt_2_7_0, pt_bare, pt_2_9_0]


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Repos:
    root = tmp_path_factory.mktemp("upstreams")
    nccl, release, fix, newer = make_nccl(root)
    pytorch, commits = make_pytorch(root, release, fix)
    return Repos(nccl, pytorch, release, fix, newer, *commits)


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's git configuration and GitHub token must not leak into these tests.
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)


def resolve(repos: Repos, tmp_path: Path, pytorch_commit: str, version: str,
            cuda: str | None = "11.3", *, file_urls: bool = True) -> NcclPin:
    def location(path: Path) -> str:
        return path.as_uri() if file_urls else str(path)

    return pytorch_nccl_pin(pytorch_repo=location(repos.pytorch), pytorch_commit=pytorch_commit,
                            pytorch_version=version, cuda=cuda, nccl_repo=location(repos.nccl),
                            mirrors=tmp_path / "mirrors")


def test_submodule_at_a_release_commit(repos: Repos, tmp_path: Path) -> None:
    pin = resolve(repos, tmp_path, repos.pt_1_10_2, "1.10.2")

    assert (pin.version, pin.commit) == ("2.10.3", repos.release)
    assert pin.evidence["method"] == "submodule"
    assert pin.evidence["path"] == SUBMODULE
    assert pin.evidence["pin"] == repos.release
    assert pin.evidence["pytorch_ref"] == "v1.10.2"
    assert pin.evidence["pytorch_commit"] == repos.pt_1_10_2
    assert pin.evidence["read_with"] == "git"
    assert pin.evidence["describe"] == "v2.10.3-1"
    assert pin.evidence["nearest_tags"] == "v2.10.3-1 (describe: the release commit itself)"


def test_post_release_fix_keeps_the_older_version(repos: Repos, tmp_path: Path) -> None:
    pin = resolve(repos, tmp_path, repos.pt_1_11_0, "1.11.0", file_urls=False)

    assert (pin.version, pin.commit) == ("2.10.3", repos.fix)
    assert pin.evidence["describe"] == f"v2.10.3-1-1-g{repos.fix[:12]}"
    assert pin.evidence["nearest_tags"] == (
        f"v2.10.3-1-1-g{repos.fix[:12]} (describe: 1 commit(s) after v2.10.3-1); "
        "first release containing it: v2.11.4-1")
    assert "p2p-fix" not in str(pin.evidence)


@pytest.mark.parametrize(("cuda", "file", "version", "tag"), [
    ("12.4", "nccl-cu12.txt", "2.11.4", "v2.11.4-1"),
    ("11.8", "nccl-cu11.txt", "2.10.3", "v2.10.3-1"),
])
def test_pin_file_chosen_by_cuda_major(repos: Repos, tmp_path: Path, cuda: str, file: str,
                                       version: str, tag: str) -> None:
    pin = resolve(repos, tmp_path, repos.pt_2_7_0, "2.7.0", cuda)

    assert pin.version == version
    assert pin.commit == (repos.newer if tag == "v2.11.4-1" else repos.release)
    assert pin.evidence["method"] == "pin-file"
    assert pin.evidence["path"] == f"{PIN_DIR}/{file}"
    assert pin.evidence["pin"] == tag


def test_pin_file_found_even_when_the_version_suggests_a_submodule(repos: Repos,
                                                                   tmp_path: Path) -> None:
    pin = resolve(repos, tmp_path, repos.pt_2_7_0, "1.13.0", "12.1", file_urls=False)
    assert pin.evidence["path"] == f"{PIN_DIR}/nccl-cu12.txt"


@pytest.mark.parametrize(("cuda", "file", "version"), [
    ("12.6", "nccl-cu126.txt", "2.10.3"),
    ("12.8", "nccl.txt", "2.11.4"),
    (None, "nccl.txt", "2.11.4"),
])
def test_pin_file_for_cuda_minor_else_the_generic_one(repos: Repos, tmp_path: Path,
                                                      cuda: str | None, file: str,
                                                      version: str) -> None:
    pin = resolve(repos, tmp_path, repos.pt_2_9_0, "2.9.0", cuda)
    assert (pin.evidence["path"], pin.version) == (f"{PIN_DIR}/{file}", version)


def test_neither_submodule_nor_pin_file_is_a_clear_error(repos: Repos, tmp_path: Path) -> None:
    with pytest.raises(CompatibilityError) as error:
        resolve(repos, tmp_path, repos.pt_bare, "2.8.0")
    message = str(error.value)
    assert "PyTorch v2.8.0" in message
    assert SUBMODULE in message
    assert PIN_DIR in message
    assert "stages.nccl.version" in message


@pytest.mark.parametrize(("cuda", "need"), [("13.0", "CUDA 13.0"), (None, "unset image.cuda")])
def test_pin_files_without_this_cuda_name_the_files_found(repos: Repos, tmp_path: Path,
                                                          cuda: str | None, need: str) -> None:
    with pytest.raises(CompatibilityError) as error:
        resolve(repos, tmp_path, repos.pt_2_7_0, "2.7.0", cuda)
    message = str(error.value)
    assert "(nccl-cu11.txt, nccl-cu12.txt)" in message
    assert need in message
    assert "triton" not in message


def test_parse_version_mk() -> None:
    assert parse_version_mk(version_mk(2, 18, 5)) == "2.18.5"
    assert parse_version_mk('NCCL_MAJOR := 2\nNCCL_MINOR := 27\nNCCL_PATCH := 7\n'
                            'NCCL_SUFFIX := "a0"\n') == "2.27.7a0"
    with pytest.raises(ValueError, match="NCCL_PATCH"):
        parse_version_mk("NCCL_MAJOR := 2\nNCCL_MINOR := 10\n")


# ---- the GitHub contents API, served for real on 127.0.0.1 ---------------------------------


@pytest.fixture
def api(httpserver: HTTPServer) -> Iterator[HTTPServer]:
    yield httpserver
    httpserver.check_assertions()


def from_github(repos: Repos, tmp_path: Path, api: HTTPServer, version: str = "1.11.0",
                cuda: str | None = "11.3", token: str | None = None) -> NcclPin:
    return pytorch_nccl_pin(pytorch_repo=GITHUB_PYTORCH, pytorch_commit=API_COMMIT,
                            pytorch_version=version, cuda=cuda, nccl_repo=str(repos.nccl),
                            mirrors=tmp_path / "mirrors", github_api=api.url_for("/"),
                            github_token=token, policy=FAST)


def contents(api: HTTPServer, path: str, **headers: str) -> RequestHandler:
    return api.expect_request(CONTENTS + path, query_string={"ref": API_COMMIT},
                              headers=headers or None)


def test_github_submodule_answer(repos: Repos, tmp_path: Path, api: HTTPServer,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "token-from-env")
    contents(api, SUBMODULE, Authorization="Bearer token-from-env").respond_with_json(
        {"type": "submodule", "name": "nccl", "path": SUBMODULE, "sha": repos.fix,
         "submodule_git_url": "https://github.com/NVIDIA/nccl"})

    pin = from_github(repos, tmp_path, api)

    assert (pin.version, pin.commit) == ("2.10.3", repos.fix)
    assert pin.evidence["read_with"] == "the GitHub contents API"
    assert pin.evidence["pytorch_repo"] == GITHUB_PYTORCH
    assert "token-from-env" not in str(pin.evidence)
    request = api.log[0][0]
    assert request.headers["User-Agent"].startswith("imageforge/")


def test_github_pin_file_answer(repos: Repos, tmp_path: Path, api: HTTPServer) -> None:
    contents(api, PIN_DIR).respond_with_json([
        {"type": "file", "name": "nccl-cu12.txt"}, {"type": "file", "name": "triton.txt"}])
    contents(api, f"{PIN_DIR}/nccl-cu12.txt").respond_with_json(
        {"type": "file", "encoding": "base64",
         "content": base64.b64encode(b"v2.11.4-1\n").decode()})

    pin = from_github(repos, tmp_path, api, version="2.7.0", cuda="12.8")

    assert (pin.version, pin.commit) == ("2.11.4", repos.newer)
    assert pin.evidence["pin"] == "v2.11.4-1"


def test_github_retries_a_server_error(repos: Repos, tmp_path: Path, api: HTTPServer) -> None:
    api.expect_oneshot_request(CONTENTS + SUBMODULE).respond_with_data("busy", status=503)
    contents(api, SUBMODULE).respond_with_json({"type": "submodule", "sha": repos.release})

    assert from_github(repos, tmp_path, api).commit == repos.release
    assert len(api.log) == 2


def test_github_404_everywhere_names_both_places(repos: Repos, tmp_path: Path,
                                                 api: HTTPServer) -> None:
    for path in (SUBMODULE, PIN_DIR):
        contents(api, path).respond_with_json({"message": "Not Found"}, status=404)

    with pytest.raises(CompatibilityError) as error:
        from_github(repos, tmp_path, api, version="1.10.2")

    message = str(error.value)
    assert "PyTorch v1.10.2 (github.com/pytorch/pytorch at " in message
    assert SUBMODULE in message
    assert PIN_DIR in message


def test_github_unknown_commit(repos: Repos, tmp_path: Path, api: HTTPServer) -> None:
    contents(api, SUBMODULE).respond_with_json(
        {"message": f"No commit found for the ref {API_COMMIT}"}, status=404)

    with pytest.raises(SourceError, match="has no commit"):
        from_github(repos, tmp_path, api)


@pytest.mark.parametrize(("token", "advice"), [
    (None, "set GITHUB_TOKEN to a GitHub token"),
    ("s3cret-token", "wait for the reset"),
])
def test_github_rate_limit(repos: Repos, tmp_path: Path, api: HTTPServer, token: str | None,
                           advice: str) -> None:
    contents(api, SUBMODULE).respond_with_json(
        {"message": "API rate limit exceeded"}, status=403,
        headers={"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1700000000"})

    with pytest.raises(SourceError) as error:
        from_github(repos, tmp_path, api, token=token)

    message = str(error.value)
    assert "rate limit is used up (it resets at 22:13 UTC)" in message
    assert advice in message
    assert "s3cret" not in message
    assert len(api.log) == 1  # a spent rate limit is not retried

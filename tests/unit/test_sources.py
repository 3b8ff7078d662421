from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from imageforge.errors import ChecksumError, LockError, SourceError
from imageforge.model.sourcetypes import GitSource, Source, UrlSource
from imageforge.sources.sources import SourceCache
from tests.payloads import random_tarball
from tests.servers import ScriptedServer

EFA = random_tarball(150_000)
BOOST = random_tarball(90_000)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


@pytest.fixture(autouse=True)
def isolated_git(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "upstream"
    path.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "T", "GIT_COMMITTER_EMAIL": "t@example.com",
           "GIT_AUTHOR_DATE": "2022-01-31T12:00:00Z", "GIT_COMMITTER_DATE": "2022-01-31T12:00:00Z"}
    (path / "Makefile").write_text("all:\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "one"]):
        subprocess.run(["git", *args], cwd=path, env=env, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True,
                            text=True, check=True).stdout.strip()
    return path, commit


def efa_source(server: ScriptedServer) -> UrlSource:
    return UrlSource(name="src-efa", url=server.url("/efa.tar.gz"), sha256=sha(EFA),
                     filename="aws-efa-installer.tar.gz")


def test_materialize_all_in_parallel(
    server: ScriptedServer, repo: tuple[Path, str], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server.route("/efa.tar.gz", EFA, drip=0.01)
    server.route("/boost.tar.bz2", BOOST, drip=0.01)
    repo_path, commit = repo
    sources: list[Source] = [
        efa_source(server),
        UrlSource(name="src-boost", url=server.url("/boost.tar.bz2"), sha256=sha(BOOST),
                  filename="boost.tar.bz2"),
        GitSource(name="src-nccl", repo=repo_path.as_uri(), ref="main", commit=commit),
    ]
    cache = SourceCache(tmp_path / "sources")

    paths = cache.materialize_all(sources, jobs=3, progress=False)

    assert paths == {source.name: cache.path_for(source) for source in sources}
    efa_dir = paths["src-efa"]
    assert efa_dir == tmp_path / "sources" / "sha256" / sha(EFA)
    assert os.listdir(efa_dir) == ["aws-efa-installer.tar.gz"]
    assert (efa_dir / "aws-efa-installer.tar.gz").read_bytes() == EFA
    assert (paths["src-boost"] / "boost.tar.bz2").read_bytes() == BOOST
    assert paths["src-nccl"] == tmp_path / "sources" / "git" / commit
    assert os.listdir(paths["src-nccl"]) == ["Makefile"]
    marker = json.loads((efa_dir.parent / f"{sha(EFA)}.complete").read_text())
    assert marker["sha256"] == sha(EFA)
    assert marker["size"] == len(EFA)
    assert marker["url"] == server.url("/efa.tar.gz")
    assert "fetched_at" in marker
    assert "src-boost: fetching" in capsys.readouterr().err

    # Everything is cached now: no more requests, same paths.
    assert cache.materialize_all(sources, progress=True) == paths
    assert server.count("/efa.tar.gz") == server.count("/boost.tar.bz2") == 1


def test_progress_bars(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.route("/efa.tar.gz", EFA)
    cache = SourceCache(tmp_path / "sources")
    paths = cache.materialize_all([efa_source(server)], progress=True)
    assert (paths["src-efa"] / "aws-efa-installer.tar.gz").read_bytes() == EFA
    assert "src-efa: ready" in capsys.readouterr().err


def test_first_failure_is_raised_and_leaves_nothing(
    server: ScriptedServer, tmp_path: Path
) -> None:
    server.route("/efa.tar.gz", b"tampered")
    server.route("/boost.tar.bz2", BOOST)
    boost = UrlSource(name="src-boost", url=server.url("/boost.tar.bz2"), sha256=sha(BOOST),
                      filename="boost.tar.bz2")
    cache = SourceCache(tmp_path / "sources")
    with pytest.raises(ChecksumError, match=r"efa\.tar\.gz"):
        cache.materialize_all([efa_source(server), boost], jobs=1, progress=False)
    leftovers = os.listdir(tmp_path / "sources" / "sha256")
    assert f"{sha(EFA)}.lock" in leftovers
    assert all(name.endswith(".lock") for name in leftovers)
    # With one worker the next source is not even started (it once was, when the worker
    # picked it up before the failure was seen, and its entry was left behind).
    assert server.count("/boost.tar.bz2") == 0


def test_two_processes_fetch_once(server: ScriptedServer, tmp_path: Path) -> None:
    # A slow body keeps the first fetch running while the second process arrives.
    server.route("/efa.tar.gz", EFA, drip=0.03)
    script = textwrap.dedent(f"""
        from pathlib import Path
        from imageforge.sources.sources import SourceCache
        from imageforge.model.sourcetypes import UrlSource
        source = UrlSource(name="src-efa", url={server.url("/efa.tar.gz")!r},
                           sha256={sha(EFA)!r}, filename="efa.tar.gz")
        print(SourceCache(Path({str(tmp_path / "sources")!r})).materialize(source))
    """)
    workers = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [worker.communicate(timeout=30)[0].strip() for worker in workers]

    assert [worker.returncode for worker in workers] == [0, 0]
    assert outputs[0] == outputs[1] == str(tmp_path / "sources" / "sha256" / sha(EFA))
    assert server.count("/efa.tar.gz") == 1
    assert (Path(outputs[0]) / "efa.tar.gz").read_bytes() == EFA


def test_entry_without_marker_is_replaced(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/efa.tar.gz", EFA)
    source = efa_source(server)
    cache = SourceCache(tmp_path / "sources")
    entry = cache.path_for(source)
    entry.mkdir(parents=True)
    (entry / source.filename).write_bytes(EFA[:1000])  # a crash mid-way left this
    (entry.parent / f".{entry.name}.abc123").mkdir()  # and this scratch dir

    assert cache.materialize(source) == entry
    assert (entry / source.filename).read_bytes() == EFA
    assert server.count("/efa.tar.gz") == 1
    assert sorted(os.listdir(entry.parent)) == [
        entry.name, f"{entry.name}.complete", f"{entry.name}.lock",
    ]


def test_entry_with_wrong_size_is_replaced(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/efa.tar.gz", EFA)
    source = efa_source(server)
    cache = SourceCache(tmp_path / "sources")
    entry = cache.materialize(source)
    (entry / source.filename).write_bytes(b"truncated")

    cache.materialize(source)
    assert (entry / source.filename).read_bytes() == EFA
    assert server.count("/efa.tar.gz") == 2


def test_same_bytes_under_two_names(server: ScriptedServer, tmp_path: Path) -> None:
    server.route("/efa.tar.gz", EFA)
    cache = SourceCache(tmp_path / "sources")
    first = cache.materialize(efa_source(server))
    second = cache.materialize(replace(efa_source(server), name="src-efa-2", filename="efa.tgz"))
    assert first == second
    assert (first / "aws-efa-installer.tar.gz").read_bytes() == (first / "efa.tgz").read_bytes()
    assert server.count("/efa.tar.gz") == 1


def test_unlocked_sources_cannot_be_materialized(server: ScriptedServer, tmp_path: Path) -> None:
    cache = SourceCache(tmp_path / "sources")
    with pytest.raises(LockError, match=r"src-efa.*invoke lock"):
        cache.materialize(replace(efa_source(server), sha256=None))
    with pytest.raises(LockError, match=r"src-nccl.*v2\.10\.3.*invoke lock"):
        cache.materialize(GitSource(name="src-nccl", repo="https://github.com/NVIDIA/nccl.git",
                                    ref="v2.10.3", commit=None))
    with pytest.raises(LockError, match="invalid commit"):
        cache.path_for(GitSource(name="src-nccl", repo="x", ref="v1", commit="../../etc"))
    assert not (tmp_path / "sources").exists()


def test_checkout_entries_depend_on_submodules(tmp_path: Path) -> None:
    cache = SourceCache(tmp_path)
    commit = "a" * 40
    plain = cache.path_for(GitSource(name="t", repo="r", ref="v1", commit=commit))
    every = cache.path_for(GitSource(name="t", repo="r", ref="v1", commit=commit, submodules=True))
    some = cache.path_for(GitSource(name="t", repo="r", ref="v1", commit=commit,
                                    submodules=("third_party/nccl",)))
    assert plain == tmp_path / "git" / commit
    assert every.name.startswith(f"{commit}-")
    assert len({plain, every, some}) == 3


def test_bad_file_names_are_refused() -> None:
    with pytest.raises(SourceError, match="invalid file name"):
        UrlSource(name="x", url="https://h/x", sha256=None, filename="../x")

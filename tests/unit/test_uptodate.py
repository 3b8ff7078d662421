"""imageforge/uptodate.py: the record of an up-to-date build and the answer from it.

The engine's API is a real HTTP server on a unix socket in the test (DOCKER_HOST points at
it), answering /images/<name>/json as the engine does; files are real files whose stat
changes. The whole path with a real engine and real builds:
tests/integration/test_uptodate_build.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from imageforge import uptodate
from tests.engine_socket import ID, TAG, serve_engine


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A stand-in engine API on a real unix socket: the test sets its images."""
    with serve_engine(tmp_path, monkeypatch) as images:
        yield images


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> uptodate.Watch:
    watch = uptodate.Watch()
    monkeypatch.setattr(uptodate, "WATCH", watch)
    return watch


def setup_build(tmp_path: Path, engine: dict[str, str], watch: uptodate.Watch
                ) -> tuple[Path, Path, Path]:
    """A manifest the build read, a cache with one entry, the image on the engine."""
    manifest = tmp_path / "sample.toml"
    manifest.write_text("[image]\n")
    watch.opened.add(str(manifest))
    watch.listed.add(str(tmp_path / "stages"))
    (tmp_path / "stages").mkdir()
    cache = tmp_path / "cache"
    entry = cache / "artifacts" / "entries" / ("e" * 64)
    entry.mkdir(parents=True)
    (entry / "meta.json").write_text(json.dumps({"hits": 2, "last_used": 1.0}))
    engine[TAG] = ID
    return manifest, cache, entry


def remember(cache: Path, entry: Path, checkout: Path, files: tuple[Path, ...] = ()) -> None:
    uptodate.remember(["build", "--target", "smddp"], cache_dir=cache, checkout=checkout,
                      images=[TAG], entries=[entry], files=files,
                      report={"target": "smddp", "image_digest": None, "stages": []},
                      stdout="nothing rebuilt: every stage came from the artifact cache")


ARGV = ["build", "--target", "smddp"]


def test_an_unchanged_build_is_answered_with_its_summary_report_and_uses(
        tmp_path: Path, engine: dict[str, str], watched: uptodate.Watch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _, cache, entry = setup_build(tmp_path, engine, watched)
    remember(cache, entry, tmp_path)
    assert uptodate.answer(ARGV)
    assert capsys.readouterr().out == \
        "nothing rebuilt: every stage came from the artifact cache\n"
    (report,) = (cache / "reports").glob("*-smddp.json")
    assert json.loads(report.read_text()) == {"target": "smddp", "image_digest": ID,
                                              "stages": []}
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["hits"] == 3
    assert meta["last_used"] > 1.0
    assert uptodate.answer(ARGV)
    assert len(list((cache / "reports").glob("*-smddp.json"))) == 2


@pytest.mark.parametrize("change", ["file", "dir", "image", "image-gone", "entry", "blob",
                                    "argv", "env", "cwd", "git"])
def test_any_change_it_depends_on_sends_it_to_the_full_build(
        tmp_path: Path, engine: dict[str, str], watched: uptodate.Watch,
        monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    manifest, cache, entry = setup_build(tmp_path, engine, watched)
    blob = cache / "artifacts" / "entries" / ("e" * 64) / "blob"
    blob.write_text("layer")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / ".git" / "refs" / "heads").mkdir(parents=True)
    (tmp_path / ".git" / "refs" / "heads" / "main").write_text("a" * 40 + "\n")
    remember(cache, entry, tmp_path, files=(blob,))
    argv = list(ARGV)
    if change == "file":
        manifest.write_text("[image]\nname = 'other'\n")
    elif change == "dir":
        (tmp_path / "stages" / "gdrcopy.py").write_text("")
    elif change == "image":
        engine[TAG] = "sha256:" + "2" * 64
    elif change == "image-gone":
        del engine[TAG]
    elif change == "entry":
        (entry / "meta.json").unlink()
    elif change == "blob":
        blob.write_text("LAYER")
    elif change == "argv":
        argv.append("--no-test")
    elif change == "env":
        monkeypatch.setenv("IMAGEFORGE_LOG", "debug")
    elif change == "cwd":
        monkeypatch.chdir(tmp_path)
    elif change == "git":
        (tmp_path / ".git" / "refs" / "heads" / "main").write_text("b" * 40 + "\n")
    assert not uptodate.answer(argv)
    assert not (cache / "reports").exists()


def test_what_a_shell_changes_between_commands_is_not_a_change(
        tmp_path: Path, engine: dict[str, str], watched: uptodate.Watch,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _, cache, entry = setup_build(tmp_path, engine, watched)
    remember(cache, entry, tmp_path)
    monkeypatch.setenv("OLDPWD", "/elsewhere")
    monkeypatch.setenv("SHLVL", "7")
    assert uptodate.answer(ARGV)


def test_only_a_build_is_answered(tmp_path: Path, engine: dict[str, str],
                                  watched: uptodate.Watch) -> None:
    _, cache, entry = setup_build(tmp_path, engine, watched)
    uptodate.remember(["plan"], cache_dir=cache, checkout=tmp_path, images=[TAG],
                      entries=[entry], files=(), report={"target": "smddp"}, stdout="x")
    assert not uptodate.answer(["plan"])


def test_nothing_is_recorded_by_an_unwatched_process_or_without_the_engine(
        tmp_path: Path, engine: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    watch = uptodate.Watch()
    _, cache, entry = setup_build(tmp_path, engine, watch)
    monkeypatch.setattr(uptodate, "WATCH", None)
    remember(cache, entry, tmp_path)
    assert not uptodate.records_dir().exists()
    monkeypatch.setattr(uptodate, "WATCH", watch)
    del engine[TAG]                      # an image the engine does not hold
    remember(cache, entry, tmp_path)
    assert not uptodate.records_dir().exists()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no.sock'}")   # nobody answers
    engine[TAG] = ID
    remember(cache, entry, tmp_path)
    assert not uptodate.records_dir().exists()


def test_files_in_the_cache_and_scratch_places_are_not_inputs(
        tmp_path: Path, engine: dict[str, str], watched: uptodate.Watch) -> None:
    _, cache, entry = setup_build(tmp_path, engine, watched)
    watched.opened |= {str(cache / "artifacts" / "x.json"), "/proc/self/status",
                       "/sys/kernel/mm", "/dev/null"}
    remember(cache, entry, tmp_path)
    (record,) = uptodate.records_dir().glob("*.json")
    files = [p for p, _ in json.loads(record.read_text())["files"]]
    assert str(tmp_path / "sample.toml") in files
    assert not [p for p in files if p.startswith((str(cache), "/proc/", "/sys/", "/dev/"))]
    assert list(uptodate.records_dir().iterdir()) == [record]


@pytest.mark.parametrize(("variable", "value"), [("DOCKER_CONTEXT", "second"),
                                                 ("DOCKER_HOST", "tcp://10.0.0.1:2375")])
def test_an_engine_other_than_the_local_socket_is_never_asked(
        tmp_path: Path, engine: dict[str, str], watched: uptodate.Watch,
        monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    _, cache, entry = setup_build(tmp_path, engine, watched)
    remember(cache, entry, tmp_path)
    monkeypatch.setenv(variable, value)
    with pytest.raises(OSError, match="not the local engine"):
        uptodate.image_ids([TAG])


def test_a_docker_cli_context_other_than_default_is_never_asked(
        tmp_path: Path, engine: dict[str, str]) -> None:
    config = tmp_path / "docker-config"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"currentContext": "remote"}))
    with pytest.raises(OSError, match="not the local engine"):
        uptodate.image_ids([TAG])
    (config / "config.json").write_text(json.dumps({"currentContext": "default"}))
    engine[TAG] = ID
    assert uptodate.image_ids([TAG, "gone:1"]) == {TAG: ID, "gone:1": None}


def test_the_watch_sees_reads_and_listings_but_not_writes(tmp_path: Path) -> None:
    read, written, listed = tmp_path / "read.toml", tmp_path / "written", tmp_path / "dir"
    read.write_text("x")
    listed.mkdir()
    code = (
        "import json, os, sys\n"
        "from imageforge import uptodate\n"
        "uptodate.start_watching()\n"
        "uptodate.start_watching()\n"
        f"open({str(read)!r}).read()\n"
        f"open({str(written)!r}, 'w').write('y')\n"
        f"os.close(os.open({str(written)!r}, os.O_WRONLY))\n"
        f"os.listdir({str(listed)!r})\n"
        "w = uptodate.WATCH\n"
        "print(json.dumps([sorted(w.opened), sorted(w.listed)]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    opened, listed_dirs = json.loads(out.stdout)
    assert str(read) in opened
    assert str(written) not in opened
    assert str(listed) in listed_dirs


def test_the_record_name_is_the_command_its_directory_and_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = uptodate.record_name(ARGV)
    assert uptodate.record_name(ARGV) == first
    assert uptodate.record_name([*ARGV, "--no-test"]) != first
    monkeypatch.setenv("OLDPWD", "/x")
    assert uptodate.record_name(ARGV) == first
    monkeypatch.setenv("INVOKE_IMAGEFORGE_CACHE_DIR", "/elsewhere")
    second = uptodate.record_name(ARGV)
    assert second != first
    monkeypatch.chdir(tmp_path)
    assert uptodate.record_name(ARGV) != second

"""`imageforge build` with nothing to do is answered from its record (imageforge/uptodate.py)
without the docker CLI, BuildKit or the engine's modules, and every change that matters sends
it back to the full build. Full-image artifacts live in the engine's image store by key.

Real builds of the sample with the `imageforge` console command; a `docker` and a `git` on
PATH record each command they are asked for and then run the real one."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.cache_consistency import assert_cache_consistent
from tests.integration.conftest import ROOT, docker_out

TAG = f"imageforge-test/uptodate:{uuid.uuid4().hex[:8]}"
IMAGEFORGE = str(Path(sys.executable).with_name("imageforge"))
# Every warning's prefix (imageforge/log.py); a build that gave one leaves no record.
WARNED = "imageforge: warning:"


@pytest.fixture
def traced(tmp_path: Path) -> tuple[dict[str, str], Path]:
    bindir = tmp_path / "traced-docker"
    bindir.mkdir()
    calls = bindir / "calls.log"
    calls.write_text("")
    # The full build runs git (the revision label) and may run docker; an answer from the
    # record runs no program at all (the engine's API answers the full build's questions
    # about images, so docker alone would not tell them apart).
    for program in ("docker", "git"):
        real = shutil.which(program)
        assert real is not None
        (bindir / program).write_text(f'#!/bin/sh\nprintf "{program} %s\\n" "$*" >> {calls}\n'
                                      f'exec {real} "$@"\n')
        (bindir / program).chmod(0o755)
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
           "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    return env, calls


def imageforge(manifest: Path, cache: Path, env: dict[str, str], *args: str,
               target: str = "smddp", tag: str = TAG) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "INVOKE_IMAGEFORGE_CACHE_DIR": str(cache), **env}
    return subprocess.run([IMAGEFORGE, "build", "--target", target, "--manifest", str(manifest),
                           "--no-test", "--progress", "plain", "--tag", tag, *args],
                          cwd=ROOT, env=full_env, capture_output=True, text=True, check=False,
                          timeout=900)


def states(cache: Path) -> dict[str, str]:
    report = sorted((cache / "reports").glob("*.json"))[-1]
    return {s["name"]: s["state"] for s in json.loads(report.read_text())["stages"]}


def metas(cache: Path) -> dict[str, dict[str, str]]:
    root = cache / "artifacts" / "entries"
    found = (json.loads((d / "meta.json").read_text()) for d in sorted(root.iterdir()))
    return {m["stage"]: m for m in found}


def answered(result: subprocess.CompletedProcess[str], calls: Path) -> bool:
    """Answered from the record: it worked and ran no docker or git command at all."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ran = calls.read_text()
    calls.write_text("")
    return ran == ""


def full_build(manifest: Path, cache: Path, env: dict[str, str], calls: Path
               ) -> subprocess.CompletedProcess[str]:
    """A build that must run docker and leave a record. A build that warned records nothing,
    by design (a bake BuildKit failed transiently under load runs again with a warning,
    buildkit/bake.py; once a full run's build warned of something else), so the next build is
    the first to record: up to two more, each of which must run docker too."""
    result = imageforge(manifest, cache, env)
    assert not answered(result, calls)
    for _ in range(2):
        if WARNED not in result.stderr:
            break
        result = imageforge(manifest, cache, env)
        assert not answered(result, calls)
    assert WARNED not in result.stderr, result.stderr[-3000:]
    return result


def test_an_up_to_date_build_runs_no_docker_and_every_change_that_matters_does(
        sample_manifest: Path, tmp_path: Path, traced: tuple[dict[str, str], Path]) -> None:
    env, calls = traced
    cache = tmp_path / "cache"
    manifest = tmp_path / "sample.toml"
    manifest.write_text(sample_manifest.read_text())
    shutil.copy(sample_manifest.with_suffix(".lock.json"), tmp_path / "sample.lock.json")
    try:
        full_build(manifest, cache, env, calls)
        reports = len(list((cache / "reports").glob("*.json")))

        again = imageforge(manifest, cache, env)
        assert answered(again, calls)
        assert "nothing rebuilt: every stage came from the artifact cache" in again.stdout
        assert set(states(cache).values()) == {"cached"}
        assert len(list((cache / "reports").glob("*.json"))) == reports + 1
        hits = {stage: int(m["hits"]) for stage, m in metas(cache).items()}
        assert answered(imageforge(manifest, cache, env), calls)
        assert {s: int(m["hits"]) for s, m in metas(cache).items()} == \
            {s: n + 1 for s, n in hits.items()}

        # A file the build read changed (same bytes, new mtime): the full build decides.
        os.utime(manifest)
        full_build(manifest, cache, env, calls)
        assert set(states(cache).values()) == {"cached"}
        assert answered(imageforge(manifest, cache, env), calls)

        # Another environment, other flags: their own full build first.
        assert not answered(imageforge(manifest, cache, {**env, "IMAGEFORGE_LOG": "info"}),
                            calls)
        assert not answered(imageforge(manifest, cache, env, "--set",
                                       "waive.nccl-pytorch-pin=a label-only change"), calls)

        # The image gone: made again, never assumed.
        subprocess.run(["docker", "image", "rm", TAG], check=True, capture_output=True)
        assert not answered(imageforge(manifest, cache, env), calls)
        assert docker_out("image", "inspect", "--format", "{{.Id}}", TAG)

        # The target's artifact gone from the image store: rebuilt, with a warning.
        smddp = metas(cache)["smddp"]["image"]
        subprocess.run(["docker", "image", "rm", smddp], check=True, capture_output=True)
        rebuilt = imageforge(manifest, cache, env)
        assert not answered(rebuilt, calls)
        assert "cached artifact of smddp" in rebuilt.stderr
        assert "is gone from the image store" in rebuilt.stderr
        assert states(cache)["smddp"] == "built"
        # A build that warned records nothing (the next one must be able to warn again).
        full_build(manifest, cache, env, calls)
        assert answered(imageforge(manifest, cache, env), calls)
        assert_cache_consistent(cache)
    finally:
        subprocess.run(["docker", "image", "rm", "--force", TAG], capture_output=True,
                       check=False)


def test_full_image_artifacts_are_names_in_the_image_store_checked_before_use(
        sample_manifest: Path, tmp_path: Path, traced: tuple[dict[str, str], Path]) -> None:
    env, _ = traced
    cache = tmp_path / "cache"
    tag = f"imageforge-test/uptodate-efa:{uuid.uuid4().hex[:8]}"
    try:
        built = imageforge(sample_manifest, cache, env, target="efa-nccl", tag=tag)
        assert built.returncode == 0, built.stderr
        found = metas(cache)
        # efa is built FROM by nccl's image and efa-nccl is the image: whole images, kept by
        # name; nccl and aws-ofi-nccl are their exports only, as OCI layouts.
        for stage in ("efa", "efa-nccl"):
            meta = found[stage]
            assert re.fullmatch(rf"imageforge-artifact/[0-9a-f]{{12}}/{stage}:{meta['key'][7:]}",
                                meta["image"])
            assert docker_out("image", "inspect", "--format", "{{.Id}}", meta["image"]) == \
                meta["digest"]
            entry = cache / "artifacts" / "entries" / meta["key"][7:]
            assert sorted(p.name for p in entry.iterdir()) == ["meta.json"]
        for stage in ("nccl", "aws-ofi-nccl"):
            assert found[stage]["image"] is None
        assert_cache_consistent(cache)

        # The name now points at other content (a poisoned or replaced image): never used.
        # (efa-nccl's own artifact goes too, so the image must be built FROM efa again.)
        efa = found["efa"]
        subprocess.run(["docker", "tag", "imageforge/base:bookworm", efa["image"]], check=True,
                       capture_output=True)
        subprocess.run(["docker", "image", "rm", found["efa-nccl"]["image"]], check=True,
                       capture_output=True)
        again = imageforge(sample_manifest, cache, env, target="efa-nccl", tag=tag)
        assert again.returncode == 0, again.stderr
        assert "cached artifact of efa" in again.stderr
        assert "names other content" in again.stderr
        assert "cached artifact of efa-nccl" in again.stderr
        assert states(cache)["efa"] == "built"
        assert states(cache)["efa-nccl"] == "built"
        assert states(cache)["nccl"] == "cached"
        assert docker_out("image", "inspect", "--format", "{{.Id}}", efa["image"]) == \
            metas(cache)["efa"]["digest"]
        assert_cache_consistent(cache)

        # Pruning an image entry untags its image.
        pruned = subprocess.run(
            [sys.executable, "-m", "invoke", "-r", str(ROOT), "cache.prune", "--max-size", "0"],
            cwd=ROOT, env={**os.environ, "INVOKE_IMAGEFORGE_CACHE_DIR": str(cache)},
            capture_output=True, text=True, check=False, timeout=300)
        assert pruned.returncode == 0, pruned.stderr
        gone = subprocess.run(["docker", "image", "inspect", efa["image"]],
                              capture_output=True, check=False)
        assert gone.returncode != 0
    finally:
        subprocess.run(["docker", "image", "rm", "--force", tag], capture_output=True,
                       check=False)

"""A registry that answers 500 in the middle of a push or a pull and then goes away (a real
HTTP proxy in front of the test registry, tests/flakyproxy.py): cache.push and cache.pull
exit 9, `build --remote` keeps its build and warns, `build --push` exits 12. The local
cache stays consistent and the same command succeeds once the registry answers.

Builds run on the test's own second engine, so its containers and builders can be counted.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.cache_consistency import assert_cache_consistent
from tests.flakyproxy import FlakyProxy, Trigger, blob_upload, manifest_request
from tests.integration.conftest import (
    SecondDockerd,
    assert_engine_clean,
    invoke,
    registry_env,
)

RUN = uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def nccl_cache(sample_manifest: Path, second_dockerd: SecondDockerd,
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding the sample's nccl artifact, built once."""
    cache = tmp_path_factory.mktemp("nccl-cache")
    second_dockerd.start()
    result = invoke("build", "--target", "nccl", "--manifest", str(sample_manifest),
                    "--progress", "plain", "--no-test", cache=cache, env=second_dockerd.env)
    assert result.returncode == 0, result.stderr
    return cache


def run(engine: SecondDockerd, cache: Path, *args: str) -> tuple[int, str, str]:
    result = invoke(*args, cache=cache, env={**engine.env, **registry_env()}, timeout=300)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stdout, (result.stderr.strip().splitlines() or [""])[-1]


def flaky(registry: str, trigger: Trigger) -> FlakyProxy:
    """Passes the first matching request, answers 500 to the next three, then goes away."""
    return FlakyProxy(registry, trigger=trigger, after=1, errors=3)


def copy_of(cache: Path, tmp_path: Path) -> Path:
    """A private copy of a cache (its entries' blobs still hard links of the shared ones),
    so a test's faults cannot touch another's."""
    target = tmp_path / "cache"
    subprocess.run(["cp", "-a", str(cache), str(target)], check=True)
    return target


def entries(cache: Path) -> list[str]:
    root = cache / "artifacts" / "entries"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.mark.usefixtures("sample_manifest")
def test_cache_push_to_a_registry_failing_midway_exits_9_then_pushes(
        registry: str, dockerd2: SecondDockerd, nccl_cache: Path,
        tmp_path: Path) -> None:
    cache = copy_of(nccl_cache, tmp_path)
    before = entries(cache)
    builders = dockerd2.builders()
    with flaky(registry, blob_upload) as proxy:
        code, _, last = run(dockerd2, cache, "cache.push", "--remote",
                            f"{proxy.address}/push-{RUN}")
    assert code == 9, last
    assert last.startswith(f"imageforge: error: could not push 1 artifact(s) to "
                           f"{proxy.address}/"), last
    assert proxy.failed > 0
    assert entries(cache) == before
    assert_cache_consistent(cache)
    assert_engine_clean(dockerd2, builders)
    code, out, last = run(dockerd2, cache, "cache.push", "--remote", f"{registry}/push-{RUN}")
    assert code == 0, last
    assert f"pushed 1 of 1 artifacts to {registry}/push-{RUN}" in out


def test_cache_pull_from_a_registry_failing_midway_exits_9_then_pulls(
        sample_manifest: Path, registry: str, dockerd2: SecondDockerd, nccl_cache: Path,
        tmp_path: Path) -> None:
    remote = f"pull-{RUN}"
    code, _, last = run(dockerd2, nccl_cache, "cache.push", "--remote", f"{registry}/{remote}")
    assert code == 0, last
    builders = dockerd2.builders()
    cache = tmp_path / "cache"
    pull = ("cache.pull", "--target", "nccl", "--manifest", str(sample_manifest))
    # The registry answers that it holds the artifact, then fails the pull that follows. The
    # engine pushed the artifact and holds every blob, so BuildKit's pull asks only about the
    # manifest: counted on blob downloads, the proxy would let the whole pull through.
    with flaky(registry, manifest_request) as proxy:
        code, _, last = run(dockerd2, cache, *pull, "--remote", f"{proxy.address}/{remote}")
        assert code == 9, (last, proxy.log)
        assert last.startswith(f"imageforge: error: could not pull artifacts from "
                               f"{proxy.address}/"), last
        assert proxy.failed > 0
        assert entries(cache) == []
        assert_cache_consistent(cache)
        # Now it is gone altogether: asked to pull, that is an error, not an empty registry.
        proxy.go_down()
        code, _, last = run(dockerd2, cache, *pull, "--remote", f"{proxy.address}/{remote}")
        assert code == 9, last
        assert last.startswith(f"imageforge: error: remote cache {proxy.address}/{remote} is "
                               "unreachable"), last
    assert_engine_clean(dockerd2, builders)
    code, out, last = run(dockerd2, cache, *pull, "--remote", f"{registry}/{remote}")
    assert code == 0, last
    assert "pulled 1 artifacts" in out
    assert len(entries(cache)) == 1
    assert_cache_consistent(cache)


def test_build_remote_keeps_its_build_when_the_registry_fails_during_its_push(
        sample_manifest: Path, registry: str, dockerd2: SecondDockerd,
        tmp_path: Path) -> None:
    build = ("build", "--target", "nccl", "--manifest", str(sample_manifest), "--progress",
             "plain")
    with flaky(registry, blob_upload) as proxy:
        code, _, last = run(dockerd2, tmp_path, *build, "--remote", f"{proxy.address}/b-{RUN}")
    assert code == 0, last
    assert "imageforge: warning: pushing 1 artifact(s) to the remote cache" in last, last
    assert f"push them later with `invoke cache.push --remote {proxy.address}/b-{RUN}`" in last
    assert len(entries(tmp_path)) == 1
    assert_cache_consistent(tmp_path)
    # What the warning says to do, against the registry that answers again.
    code, out, last = run(dockerd2, tmp_path, "cache.push", "--remote", f"{registry}/b-{RUN}")
    assert code == 0, last
    assert "pushed 1 of 1" in out, last
    plan = invoke("plan", "--target", "nccl", "--manifest", str(sample_manifest), "--json",
                  "--remote", f"{registry}/b-{RUN}", cache=tmp_path / "fresh",
                  env={**dockerd2.env, **registry_env()})
    statuses = {s["name"]: s["status"] for s in json.loads(plan.stdout)["stages"]}
    assert statuses["nccl"] == "remote"


def test_build_push_to_a_failing_registry_exits_12_and_the_rerun_only_pushes(
        sample_manifest: Path, registry: str, dockerd2: SecondDockerd,
        tmp_path: Path) -> None:
    # nccl is not an image target: its artifact is stored by the bake that builds it, and a
    # last bake makes the pushed image from that artifact. The push fails in that last bake.
    builders = dockerd2.builders()
    build = ("build", "--target", "nccl", "--manifest", str(sample_manifest), "--progress",
             "plain", "--push")
    with flaky(registry, blob_upload) as proxy:
        tag = f"{proxy.address}/img-{RUN}/nccl:1"
        code, _, last = run(dockerd2, tmp_path, *build, "--tag", tag)
    assert code == 12, last
    # The whole sentence: the cause is BuildKit's last words only, no URL, no upload token.
    said = re.fullmatch(rf"imageforge: error: pushing {re.escape(tag)} failed "
                        r"\((?P<cause>[^()]+)\); "
                        r"no image was tagged or pushed: run the build again once the "
                        r"registry answers\.", last)
    assert said is not None, last
    assert not any(part in said["cause"] for part in ("://", "/v2/", "uploads", "_state")), last
    stored = entries(tmp_path)
    assert len(stored) == 1
    assert_cache_consistent(tmp_path)
    assert_engine_clean(dockerd2, builders)
    tag = f"{registry}/img-{RUN}/nccl:1"
    code, out, last = run(dockerd2, tmp_path, *build, "--tag", tag)
    assert code == 0, last
    assert entries(tmp_path) == stored
    assert re.search(r"^nccl +cached ", out, re.MULTILINE), out

"""The artifact cache with real BuildKit, a real registry with auth, real processes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.cache_consistency import assert_cache_consistent, sha256_of
from tests.integration.conftest import (
    ROOT,
    Running,
    SecondDockerd,
    invoke,
    process_with,
    registry_env,
)

RUN = uuid.uuid4().hex[:8]


def build(manifest: Path, cache: Path, *args: str, env: dict[str, str] | None = None,
          target: str = "smddp") -> subprocess.CompletedProcess[str]:
    # --no-test: these tests are about what the cache holds, never about the image's checks.
    return invoke("build", "--target", target, "--manifest", str(manifest), "--progress",
                  "plain", "--no-test", "--tag", f"imageforge-test/{target}:{RUN}", *args,
                  cache=cache, env=env)


def last_report(cache: Path, target: str = "smddp") -> dict[str, str]:
    report = sorted((cache / "reports").glob(f"*-{target}.json"))[-1]
    return {s["name"]: s["state"] for s in json.loads(report.read_text())["stages"]}


def entries(cache: Path) -> list[Path]:
    root = cache / "artifacts" / "entries"
    return sorted(root.iterdir()) if root.exists() else []


def test_cross_target_reuse_without_rebuild_or_refetch(sample_manifest: Path,
                                                       tmp_path: Path) -> None:
    first = build(sample_manifest, tmp_path, target="efa-nccl")
    assert first.returncode == 0, first.stderr
    second = build(sample_manifest, tmp_path)
    assert second.returncode == 0, second.stderr
    states = last_report(tmp_path)
    assert {states[s] for s in ("efa", "nccl", "aws-ofi-nccl")} == {"cached"}
    assert {states[s] for s in ("pytorch", "torchvision", "boost", "smddp")} == {"built"}
    # Reused stages' sources are not fetched (not even looked up) again.
    assert "src-efa" not in second.stderr
    assert "src-nccl:" not in second.stderr


def test_fresh_local_cache_with_warm_registry_builds_nothing(
        sample_manifest: Path, registry: str, tmp_path: Path) -> None:
    remote = f"{registry}/cache-{RUN}"
    warm = build(sample_manifest, tmp_path / "a", "--remote", remote, env=registry_env())
    assert warm.returncode == 0, warm.stderr
    plan = invoke("plan", "--target", "smddp", "--manifest", str(sample_manifest), "--remote",
                  remote, "--json", cache=tmp_path / "b", env=registry_env())
    assert plan.returncode == 0, plan.stderr
    statuses = {s["name"]: s["status"] for s in json.loads(plan.stdout)["stages"]}
    # base is only its FROM line: the base image itself is its artifact.
    assert statuses.pop("base") == "cached"
    # The warm build's stderr says why a stage is missing (a push that failed is a warning).
    assert set(statuses.values()) == {"remote"}, (statuses, warm.stderr[-3000:])
    cold = build(sample_manifest, tmp_path / "b", "--remote", remote, env=registry_env())
    assert cold.returncode == 0, cold.stderr
    assert "built" not in set(last_report(tmp_path / "b").values())
    assert "nothing rebuilt" in cold.stdout
    pulled = invoke("cache.pull", "--target", "smddp", "--manifest", str(sample_manifest),
                    "--remote", remote, cache=tmp_path / "c", env=registry_env())
    assert pulled.returncode == 0, pulled.stderr
    assert len(entries(tmp_path / "c")) == len(statuses)  # every stage but base


def test_an_image_pin_change_on_an_empty_engine_runs_only_its_own_step(
        sample_manifest: Path, registry: str, dockerd2: SecondDockerd, upstream: str,
        tmp_path: Path) -> None:
    """A CI runner that starts empty, changing only the image stage's own pin (smddp's
    wheel): every stage it reads comes from the remote cache, and BuildKit's cache of the
    image's own steps, kept beside its artifact there, answers every step before the pip
    install. Without it, the runner would copy every artifact into the image again."""
    remote = f"{registry}/layers-{RUN}"
    warm = build(sample_manifest, tmp_path / "a", "--remote", remote, env=registry_env())
    assert warm.returncode == 0, warm.stderr
    wheel = requests.get(f"{upstream}/files/smdistributed_dataparallel-1.4.1-cp311-cp311-"
                         "linux_x86_64.whl", timeout=30)
    wheel.raise_for_status()
    dockerd2.docker("builder", "prune", "-af")
    changed = build(sample_manifest, tmp_path / "b", "--remote", remote,
                    "--set", "stages.smddp.version=1.4.1",
                    "--set", f"stages.smddp.sha256={hashlib.sha256(wheel.content).hexdigest()}",
                    env={**registry_env(), **dockerd2.env})
    assert changed.returncode == 0, changed.stderr
    report = sorted((tmp_path / "b" / "reports").glob("*-smddp.json"))[-1]
    stages = {s["name"]: s for s in json.loads(report.read_text())["stages"]}
    assert {n for n, s in stages.items() if s["state"] == "built"} == {"smddp"}
    assert {s["state"] for n, s in stages.items() if n not in ("base", "smddp")} == {"remote"}
    assert stages["smddp"]["steps"] >= 10
    assert stages["smddp"]["steps_run"] == 1, (stages["smddp"], changed.stderr[-3000:])


def test_registry_credentials_are_required_and_never_printed(
        sample_manifest: Path, registry: str, tmp_path: Path) -> None:
    remote = f"{registry}/cache-{RUN}"
    denied = invoke("plan", "--target", "smddp", "--manifest", str(sample_manifest), "--remote",
                    remote, cache=tmp_path, env={"IMAGEFORGE_REGISTRY_USER": "imageforge",
                                         "IMAGEFORGE_REGISTRY_PASSWORD": "wrong"})
    assert denied.returncode == 9
    assert "refused our credentials" in denied.stderr
    ok = invoke("plan", "--target", "smddp", "--manifest", str(sample_manifest), "--remote",
                remote, cache=tmp_path, env=registry_env())
    password = registry_env()["IMAGEFORGE_REGISTRY_PASSWORD"]
    for out in (denied.stdout, denied.stderr, ok.stdout, ok.stderr):
        assert password not in out


def test_unreachable_registry_degrades_to_local_with_a_warning(sample_manifest: Path,
                                                               tmp_path: Path) -> None:
    result = build(sample_manifest, tmp_path, "--remote", "127.0.0.1:9/nowhere",
                   target="nccl")
    assert result.returncode == 0, result.stderr
    assert "remote cache 127.0.0.1:9/nowhere is unreachable" in result.stderr
    assert last_report(tmp_path, "nccl")["nccl"] == "built"


def platform_manifest(tag: str, scratch: Path) -> str:
    """The digest of `tag`'s linux manifest (config and layers). Not the engine's image ID:
    that is the index, which also holds the build's provenance, new in every build."""
    saved = scratch / f"{uuid.uuid4().hex}.tar"
    subprocess.run(["docker", "save", "-o", str(saved), tag], check=True, capture_output=True)
    with tarfile.open(saved) as tar:
        def blob(digest: str) -> dict[str, Any]:
            handle = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert handle is not None
            return dict(json.load(handle))
        top = tar.extractfile("index.json")
        assert top is not None
        digest = str(json.load(top)["manifests"][0]["digest"])
        while "manifests" in (document := blob(digest)):
            digest = next(str(m["digest"]) for m in document["manifests"]
                          if m.get("platform", {}).get("os") == "linux")
    return digest


def test_a_stage_target_is_one_image_built_or_read_from_the_cache(sample_manifest: Path,
                                                                  tmp_path: Path) -> None:
    # A target that is not an image stage is tagged as its artifact (its exports on scratch):
    # the build that makes nccl once tagged the whole build stage (base and compilers), and
    # one that read nccl from the cache tagged its exports.
    tags = [f"imageforge-test/nccl:{RUN}-{how}" for how in ("built", "cached")]
    for tag in tags:
        result = invoke("build", "--target", "nccl", "--manifest", str(sample_manifest),
                        "--progress", "plain", "--no-test", "--tag", tag,
                        cache=tmp_path / "cache")
        assert result.returncode == 0, result.stderr[-4000:]
    assert last_report(tmp_path / "cache", "nccl")["nccl"] == "cached"
    try:
        assert platform_manifest(tags[0], tmp_path) == platform_manifest(tags[1], tmp_path)
    finally:
        subprocess.run(["docker", "image", "rm", *tags], capture_output=True, check=False)


def test_corrupted_entry_is_detected_discarded_and_rebuilt(sample_manifest: Path,
                                                           tmp_path: Path) -> None:
    first = build(sample_manifest, tmp_path, target="nccl")
    assert first.returncode == 0, first.stderr[-4000:]
    (entry,) = [e for e in entries(tmp_path)
                if json.loads((e / "meta.json").read_text())["stage"] == "nccl"]
    blob = max((entry / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)
    with blob.open("r+b") as handle:
        handle.write(b"corrupt!")
    again = build(sample_manifest, tmp_path, target="nccl")
    assert again.returncode == 0, again.stderr
    assert "cached artifact of nccl" in again.stderr
    assert "corrupt" in again.stderr
    assert last_report(tmp_path, "nccl")["nccl"] == "built"
    verify = invoke("cache.ls", "--json", cache=tmp_path)
    assert [e["stage"] for e in json.loads(verify.stdout)].count("nccl") == 1


def test_two_builds_at_once_share_the_work(sample_manifest: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path)}
    argv = [sys.executable, "-m", "invoke", "-r", str(ROOT), "build", "--target", "efa-nccl",
            "--manifest", str(sample_manifest), "--progress", "plain"]
    procs = [subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    reports = sorted((tmp_path / "reports").glob("*-efa-nccl.json"))
    assert len(reports) == 2
    built = [s["name"] for r in reports for s in json.loads(r.read_text())["stages"]
             if s["state"] == "built"]
    assert len(built) == len(set(built)), f"a stage was built twice: {built}"
    assert len(entries(tmp_path)) == 5  # every stage but base (its FROM line only)


def test_two_builds_and_a_prune_at_once_end_in_time_and_leave_a_good_cache(
        sample_manifest: Path, tmp_path: Path) -> None:
    # Entries both builds reuse (efa, nccl, aws-ofi-nccl) and the prune wants gone.
    first = build(sample_manifest, tmp_path, target="aws-ofi-nccl")
    assert first.returncode == 0, first.stderr[-4000:]
    args = ("--target", "efa-nccl", "--manifest", str(sample_manifest), "--progress", "plain",
            "--no-test")
    running = [Running("build", *args, cache=tmp_path), Running("build", *args, cache=tmp_path),
               Running("cache.prune", "--older-than", "0s", cache=tmp_path)]
    codes = [r.finish(timeout=300) for r in running]  # a deadlock fails here, in bounded time
    assert codes == [0, 0, 0], [r.stderr for r in running]
    assert "Traceback" not in "".join(r.stderr for r in running)
    # Whoever got a key's lock first, the prune removed what it listed: before the builds
    # locked them (they build them again) or after they were done reading them.
    pruned = running[2].stdout
    assert all(f"removed {stage}" in pruned for stage in ("efa ", "nccl ", "aws-ofi-nccl "))
    assert_cache_consistent(tmp_path)
    again = build(sample_manifest, tmp_path, target="efa-nccl")
    assert again.returncode == 0, again.stderr
    assert_cache_consistent(tmp_path)


def test_sigkill_mid_build_leaves_no_partial_entry(sample_manifest: Path,
                                                   tmp_path: Path) -> None:
    # A PyTorch flag BuildKit has never built here, so the build is slow enough to interrupt;
    # it is also in the command line of PyTorch's build step, which tells us that step runs.
    flag = f"-Xfatbin-{RUN}"
    manifest = tmp_path / "sample.toml"
    manifest.write_text(sample_manifest.read_text().replace(
        "max_jobs = 2", f'max_jobs = 2\nnvcc_flags = "{flag}"'))
    assert invoke("lock", "--manifest", str(manifest), cache=tmp_path).returncode == 0
    running = Running("build", "--target", "pytorch", "--manifest", str(manifest), "--progress",
                      "plain", cache=tmp_path)
    running.wait_for(r"\bpytorch +building", timeout=300)
    assert any(re.search(r"\bpytorch +building", line) for line in running.lines), \
        running.stderr
    running.wait_until(lambda: process_with(flag), "PyTorch's build step", timeout=300)
    running.signal(signal.SIGKILL, group=True)
    assert running.finish() == -signal.SIGKILL, "the build was still running when it was killed"
    for entry in entries(tmp_path):
        assert (entry / "meta.json").exists()
        assert (entry / "index.json").exists()
    again = invoke("build", "--target", "pytorch", "--manifest", str(manifest), "--progress",
                   "plain", cache=tmp_path)
    assert again.returncode == 0, again.stderr
    assert last_report(tmp_path, "pytorch")["pytorch"] == "built"
    leftovers = list((tmp_path / "artifacts" / "tmp").iterdir())
    assert leftovers == [], leftovers


@pytest.mark.parametrize("args", [("--max-size", "1K"), ("--older-than", "0s")])
def test_prune_empties_the_cache_and_a_build_refills_it(sample_manifest: Path, tmp_path: Path,
                                                        args: tuple[str, str]) -> None:
    first = build(sample_manifest, tmp_path, target="boost")
    assert first.returncode == 0, first.stderr[-4000:]
    assert len(entries(tmp_path)) == 1
    pruned = invoke("cache.prune", *args, cache=tmp_path)
    assert pruned.returncode == 0, pruned.stderr
    assert entries(tmp_path) == []
    assert not any((tmp_path / "artifacts" / "blobs" / "sha256").iterdir())
    refilled = build(sample_manifest, tmp_path, target="boost")
    assert refilled.returncode == 0, refilled.stderr[-4000:]
    assert last_report(tmp_path, "boost")["boost"] == "built"


def test_a_second_builder_reuses_the_first_builders_artifacts(
        sample_manifest: Path, registry: str, second_builder: str, tmp_path: Path) -> None:
    remote = f"{registry}/shared-{RUN}"
    first = build(sample_manifest, tmp_path / "a", "--remote", remote, env=registry_env(),
                  target="efa-nccl")
    assert first.returncode == 0, first.stderr
    second = build(sample_manifest, tmp_path / "b", "--remote", remote, "--builder",
                   second_builder, env=registry_env(), target="efa-nccl")
    assert second.returncode == 0, second.stderr
    states = last_report(tmp_path / "b", "efa-nccl")
    assert "built" not in states.values(), states
    loaded = subprocess.run(["docker", "--context", second_builder, "image", "inspect",
                             f"imageforge-test/efa-nccl:{RUN}"], capture_output=True,
                            check=False)
    assert loaded.returncode == 0, "the image was loaded into the second engine"


def layer_cache_problems(directory: Path) -> list[str]:
    """Why `directory` is not a whole BuildKit local cache export: its index and every blob
    the index and the manifests it names refer to, each with the bytes its digest says."""
    blobs = directory / "blobs" / "sha256"
    problems, pending = [], list(json.loads((directory / "index.json").read_text())["manifests"])
    while pending:
        descriptor = pending.pop()
        blob = blobs / str(descriptor["digest"]).removeprefix("sha256:")
        if not blob.is_file():
            problems.append(f"{directory.name}: {descriptor['digest']} missing")
        elif sha256_of(blob) != blob.name:
            problems.append(f"{directory.name}: {blob.name} holds other bytes")
        elif "manifest" in str(descriptor.get("mediaType", "")):
            document = json.loads(blob.read_bytes())
            pending += document.get("manifests", []) + document.get("layers", [])
            pending += [document["config"]] if "config" in document else []
    return problems


def test_layer_cache_is_exported_per_stage_and_read_back(sample_manifest: Path,
                                                         dockerd2: SecondDockerd,
                                                         tmp_path: Path) -> None:
    layers = tmp_path / "buildkit"
    result = build(sample_manifest, tmp_path / "a", "--layer-cache", str(layers),
                   target="boost")
    assert result.returncode == 0, result.stderr
    built = {name for name, state in last_report(tmp_path / "a", "boost").items()
             if state == "built"}
    # One export per stage built, each whole, each with content of its own.
    assert {d.name for d in layers.iterdir()} == built, built
    for directory in layers.iterdir():
        assert layer_cache_problems(directory) == []
        assert len(list((directory / "blobs" / "sha256").iterdir())) > 1
    # Read back: another engine whose BuildKit cache is emptied, and an empty artifact store,
    # so nothing but the exports can answer its steps. BuildKit reports every step of every
    # stage as a cache hit (a stage that ran a step would say "built"), and the exports stay
    # whole.
    dockerd2.docker("builder", "prune", "-af")
    again = build(sample_manifest, tmp_path / "b", "--layer-cache", str(layers),
                  target="boost", env=dockerd2.env)
    assert again.returncode == 0, again.stderr
    for name in built:
        assert re.search(rf"\] {re.escape(name)} +cached$", again.stderr, re.M), again.stderr
        assert not re.search(rf"\] {re.escape(name)} +built", again.stderr), again.stderr
        assert layer_cache_problems(layers / name) == []

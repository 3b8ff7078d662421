"""`build --push` with nothing to build, against the real registry (distribution, htpasswd auth)
behind a real logging proxy (tests/flakyproxy.py, set never to fail): when the tag already holds
this build's image, the build reads the image's labels and ends, loading, making and pushing
nothing, also on a fresh runner that has only the remote cache; when the tag holds another
image, the image is made and pushed again."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from imageforge.cache import registryhttp, remote
from imageforge.docker import LABEL_PREFIX
from tests.flakyproxy import FlakyProxy
from tests.integration.conftest import REGISTRY_PASSWORD, REGISTRY_USER, invoke, registry_env

RUN = uuid.uuid4().hex[:8]
WRITES = ("PUT", "POST", "PATCH", "DELETE")


def never(method: str, path: str) -> bool:
    del method, path
    return False


@pytest.fixture(scope="module")
def proxy(registry: str) -> Iterator[FlakyProxy]:
    """Passes every request through and logs it (no request counts towards a failure)."""
    with FlakyProxy(registry, trigger=never, after=1, errors=0) as passing:
        yield passing


def build(manifest: Path, cache: Path, *args: str) -> tuple[str, str]:
    result = invoke("build", "--target", "nccl", "--manifest", str(manifest), "--progress",
                    "plain", "--push", *args, cache=cache, env=registry_env(), timeout=600)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout, result.stderr


def served(registry: str, name: str, tag: str) -> str:
    response = requests.head(f"http://{registry}/v2/{name}/manifests/{tag}",
                             auth=(REGISTRY_USER, REGISTRY_PASSWORD), timeout=30, headers={
                                 "Accept": "application/vnd.oci.image.index.v1+json"})
    response.raise_for_status()
    return response.headers["Docker-Content-Digest"]


def labels(registry: str, name: str, tag: str) -> dict[str, str]:
    """The labels imageforge gives the linux/amd64 image at name:tag (each stage's key, the
    target, the manifest's digest), read as the registry serves them."""
    with remote.credentials(registry, registry_env()) as env:
        found = registryhttp.Client(registry, env).image_config(
            name, tag, platform="linux/amd64", timeout=30)
    assert found is not None
    return {label: value for label, value in found[1]["config"]["Labels"].items()
            if label.startswith((f"{LABEL_PREFIX}.key.", f"{LABEL_PREFIX}.target",
                                 f"{LABEL_PREFIX}.manifest-digest"))}


def latest_report(cache: Path) -> dict[str, str]:
    report = sorted((cache / "reports").glob("*.json"), key=os.path.getmtime)[-1]
    return {s["name"]: s["state"] for s in json.loads(report.read_text())["stages"]}


def test_a_push_whose_image_the_registry_holds_loads_makes_and_pushes_nothing(
        sample_manifest: Path, registry: str, proxy: FlakyProxy,
        tmp_path: Path) -> None:
    name, cache_repo = f"push-{RUN}/nccl", f"{proxy.address}/push-cache-{RUN}"
    tag = f"{proxy.address}/{name}:1"
    _, first = build(sample_manifest, tmp_path / "first", "--tag", tag, "--remote", cache_repo)
    assert "already this build's image" not in first
    pushed = served(registry, name, "1")

    # Again, with the same cache: the registry is only asked, never written to.
    del proxy.log[:]
    _, again = build(sample_manifest, tmp_path / "first", "--tag", tag, "--remote", cache_repo)
    assert f"{tag} in the registry is already this build's image ({pushed})" in again, again
    assert not [entry for entry in proxy.log if entry[0] in WRITES], proxy.log
    assert set(latest_report(tmp_path / "first").values()) == {"cached"}, \
        latest_report(tmp_path / "first")

    # A fresh runner: an empty cache, the artifacts only in the remote cache. Nothing of
    # them is pulled: the artifacts are asked about (HEAD), the image's labels are read.
    del proxy.log[:]
    _, fresh = build(sample_manifest, tmp_path / "fresh", "--tag", tag, "--remote", cache_repo)
    assert "already this build's image" in fresh, fresh
    assert not [entry for entry in proxy.log if entry[0] in WRITES], proxy.log
    artifact_reads = [path for method, path, _ in proxy.log
                      if method == "GET" and f"/push-cache-{RUN}/" in path]
    assert artifact_reads == [], artifact_reads
    states = latest_report(tmp_path / "fresh")
    assert "built" not in states.values(), states
    assert states["nccl"] == "remote", states
    assert served(registry, name, "1") == pushed


def test_a_push_whose_tag_holds_another_image_makes_and_pushes_it_again(
        sample_manifest: Path, registry: str, proxy: FlakyProxy, tmp_path: Path) -> None:
    name = f"push-{RUN}/other"
    tag = f"{proxy.address}/{name}:1"
    build(sample_manifest, tmp_path / "cache", "--tag", tag)
    ours, made = served(registry, name, "1"), labels(registry, name, "1")
    assert made[f"{LABEL_PREFIX}.target"] == "nccl", made
    # Someone pushes another image to the same tag.
    context = tmp_path / "other"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM scratch\nCOPY Dockerfile /{RUN}\n")
    with remote.credentials(registry, registry_env()) as env:
        proc = subprocess.run(["docker", "buildx", "build", "--quiet", "--output",
                               f"type=registry,name={registry}/{name}:1", str(context)],
                              env={**os.environ, **env}, capture_output=True, text=True,
                              check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert served(registry, name, "1") != ours

    del proxy.log[:]
    _, again = build(sample_manifest, tmp_path / "cache", "--tag", tag)
    assert "already this build's image" not in again
    assert [path for method, path, _ in proxy.log
            if method == "PUT" and path.endswith(f"/{name}/manifests/1")], proxy.log
    # This build's image again, its keys as the first push gave them.
    assert labels(registry, name, "1") == made

"""Golden images end to end: pushing with provenance keeps every secret out of the registry;
the nightly builds, tests, pushes and promotes, then finds itself up to date."""

from __future__ import annotations

import base64
import contextlib
import functools
import gzip
import json
import secrets
import subprocess
import threading
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

from tests.integration.conftest import REGISTRY_PASSWORD, REGISTRY_USER, invoke, registry_env

RUN = uuid.uuid4().hex[:8]
ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])


def registry_blobs(registry: str, name: str, reference: str) -> dict[str, bytes]:
    """Every manifest, config, layer and attestation reachable from name:reference, by
    digest (layers decompressed)."""
    auth = (REGISTRY_USER, REGISTRY_PASSWORD)
    base = f"http://{registry}/v2/{name}"
    found: dict[str, bytes] = {}
    pending = [reference]
    while pending:
        ref = pending.pop()
        response = requests.get(f"{base}/manifests/{ref}", headers={"Accept": ACCEPT},
                                auth=auth, timeout=30)
        response.raise_for_status()
        found[f"manifest {ref}"] = response.content
        manifest = response.json()
        pending += [m["digest"] for m in manifest.get("manifests", [])]
        for blob in [manifest.get("config"), *manifest.get("layers", [])]:
            if not blob:
                continue
            data = requests.get(f"{base}/blobs/{blob['digest']}", auth=auth, timeout=60).content
            found[blob["digest"]] = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    return found


@contextlib.contextmanager
def token_mirror(root: Path, token: str) -> Iterator[tuple[str, list[str]]]:
    """`root` served on 127.0.0.1 to requests bearing `token` only; yields the URL and the
    Authorization header of every request."""
    seen: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization") or "")
            if self.headers.get("Authorization") != f"Bearer {token}":
                self.send_error(401)
                return
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0),
                                functools.partial(Handler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_push_keeps_registry_password_and_mirror_token_out_of_everything(
        sample_manifest: Path, registry: str, cache_dir: Path, tmp_path: Path) -> None:
    token = "mirror-token-" + secrets.token_hex(8)
    temp = tmp_path / "tmp"  # where the private docker config goes, and must not stay
    temp.mkdir()
    env = {**registry_env(), "IMAGEFORGE_MIRROR_TOKEN": token, "TMPDIR": str(temp)}
    mirror = tmp_path / "mirror"
    synced = invoke("mirror.sync", "--to", str(mirror), "--manifest", str(sample_manifest),
                    cache=cache_dir)
    assert synced.returncode == 0, synced.stderr
    tag = f"{registry}/secrets/efa-nccl:{RUN}"
    fetch_cache = tmp_path / "fetch-cache"
    with token_mirror(mirror, token) as (url, seen):
        # A cache of its own, so every source really comes through the mirror.
        fetched = invoke("fetch", "--target", "efa-nccl", "--manifest", str(sample_manifest),
                         "--mirror", url, cache=fetch_cache, env=env)
        assert fetched.returncode == 0, fetched.stderr
        assert seen, "every mirror request had the token"
        assert set(seen) == {f"Bearer {token}"}, "every mirror request had the token"
        result = invoke("build", "--target", "efa-nccl", "--manifest", str(sample_manifest),
                        "--push", "--tag", tag, "--remote", f"{registry}/cache-secrets-{RUN}",
                        "--mirror", url, "--progress", "plain", cache=cache_dir, env=env)
    assert result.returncode == 0, result.stderr
    # The stage artifacts too (those this run reused from the local cache are pushed here).
    shared = invoke("cache.push", "--target", "efa-nccl", "--manifest", str(sample_manifest),
                    "--remote", f"{registry}/cache-secrets-{RUN}", cache=cache_dir, env=env)
    assert shared.returncode == 0, shared.stderr
    assert "pushed" in shared.stdout, shared.stderr
    pushed = registry_blobs(registry, "secrets/efa-nccl", RUN)
    artifact_key = json.loads(invoke("plan", "--target", "efa-nccl", "--manifest",
                                     str(sample_manifest), "--json",
                                     cache=cache_dir).stdout)["stages"][-1]["key"]
    pushed.update(registry_blobs(registry, f"cache-secrets-{RUN}/efa-nccl", artifact_key[7:]))
    assert any(b"https://slsa.dev/provenance" in m for m in pushed.values()), "provenance"
    sbom = [json.loads(m) for m in pushed.values()
            if b"https://spdx.dev/Document" in m and b"SPDX-2.3" in m]
    assert sbom, "the pushed image carries an SBOM"
    assert "libc6" in {p["name"] for p in sbom[0]["predicate"]["packages"]}
    config = next(v for v in pushed.values() if b'"io.imageforge.target"' in v)
    assert b'"io.imageforge.revision"' in config
    assert b"org.opencontainers.image.created" in config
    # The private docker config is gone: nothing of imageforge's is left in TMPDIR.
    assert [p.name for p in temp.iterdir() if p.name.startswith("imageforge-docker-")] == []
    # docker's config.json holds the password base64-encoded: look for that form too.
    encoded = base64.b64encode(f"{REGISTRY_USER}:{REGISTRY_PASSWORD}".encode()).decode()
    outputs = "".join(r.stdout + r.stderr for r in (fetched, result, shared))
    for secret in (REGISTRY_PASSWORD, encoded, token):
        for where, data in pushed.items():
            assert secret.encode() not in data, f"{secret[:6]}... found in {where}"
        assert secret not in outputs
        for path in [*cache_dir.rglob("*"), *fetch_cache.rglob("*"), *temp.rglob("*")]:
            if path.is_file() and path.stat().st_size < 50_000_000:
                assert secret.encode() not in path.read_bytes(), f"{secret[:6]}... in {path}"


def test_pushed_provenance_names_no_repository_around_the_cache(
        sample_manifest: Path, registry: str, tmp_path: Path) -> None:
    """buildx puts the git remote and commit of the repository around a bake's context into
    the image's provenance. imageforge's contexts sit in its cache directory, here inside a
    checkout of a private repository, whose address must not travel with the image
    (bake.BAKE_ENV)."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "README").write_text("a team's repository\n")
    address = f"git.corp.example/platform/private-{RUN}.git"
    for args in (["init", "-q"], ["remote", "add", "origin", f"https://{address}"],
                 ["add", "README"],
                 ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(checkout), *args], check=True, capture_output=True)
    tag = f"{registry}/provenance/efa:{RUN}"
    result = invoke("build", "--target", "efa", "--manifest", str(sample_manifest), "--push",
                    "--tag", tag, "--progress", "plain", cache=checkout / "cache",
                    env=registry_env())
    assert result.returncode == 0, result.stderr
    pushed = registry_blobs(registry, "provenance/efa", RUN)
    assert any(b"https://slsa.dev/provenance" in m for m in pushed.values()), "provenance"
    for where, data in pushed.items():
        assert b"git.corp.example" not in data, f"the checkout's remote is in {where}"


def test_nightly_builds_tests_pushes_promotes_then_is_up_to_date(
        sample_manifest_copy: Path, registry: str, cache_dir: Path, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    args = ["nightly", "--manifest", str(sample_manifest_copy), "--target", "efa-nccl", "--push",
            "--repository", f"{registry}/golden-{RUN}", "--report", str(reports)]
    first = invoke(*args, cache=cache_dir, env=registry_env())
    assert first.returncode == 0, first.stdout + first.stderr
    report = json.loads((reports / "nightly.json").read_text())
    assert report["status"] == "ok"
    assert [s["name"] for s in report["steps"]] == ["lock --upgrade", "build", "test-image",
                                                    "size budget", "push", "promote"]
    golden = requests.get(f"http://{registry}/v2/golden-{RUN}/sample-smddp/manifests/golden",
                          headers={"Accept": ACCEPT}, auth=(REGISTRY_USER, REGISTRY_PASSWORD),
                          timeout=30)
    assert golden.status_code == 200
    assert golden.headers["Docker-Content-Digest"] == report["image"]["digest"]
    suite = ET.fromstring((reports / "nightly.xml").read_text())
    assert suite.get("failures") == "0"
    assert "| promote | ✅ ok |" in (reports / "nightly.md").read_text()
    second = invoke(*args, cache=cache_dir, env=registry_env())
    assert second.returncode == 0, second.stderr
    assert "up to date" in second.stdout
    again = json.loads((reports / "nightly.json").read_text())
    assert [s["status"] for s in again["steps"] if s["name"] == "build"] == ["skipped"]


def test_nightly_verifies_the_stages_verified_longest_ago(
        sample_manifest_copy: Path, cache_dir: Path, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    args = ["nightly", "--manifest", str(sample_manifest_copy), "--target", "efa-nccl",
            "--report", str(reports), "--verify", "2"]
    seen = []
    for _ in range(2):
        result = invoke(*args, cache=cache_dir)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        report = json.loads((reports / "nightly.json").read_text())
        [step] = [s for s in report["steps"] if s["name"] == "verify --rebuild"]
        assert step["status"] == "ok"
        assert {v["result"] for v in report["verified"]} <= {"same", "same files"}
        seen.append([v["stage"] for v in report["verified"]])
    # Never verified first, in plan order; the next night takes the next two.
    assert seen == [["efa", "nccl"], ["aws-ofi-nccl", "nccl-tests"]]
    assert "| verify --rebuild | ✅ ok |" in (reports / "nightly.md").read_text()


def test_promote_refuses_a_digest_that_never_passed_test_image(registry: str,
                                                               cache_dir: Path) -> None:
    result = invoke("promote", "--image", f"{registry}/golden/x@sha256:{'0' * 64}", "--tag",
                    "golden", cache=cache_dir, env=registry_env())
    assert result.returncode == 10
    assert "no passing `invoke test-image` record" in result.stderr

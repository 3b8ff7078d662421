"""cache_trust = "verified" against a real registry (with auth): a remote artifact is used
only once a rebuild from scratch matched it, by the digest that rebuild saw; an artifact
replaced in the registry after that (a poisoned cache) is refused, exit 13."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from imageforge.cache.remote import credentials
from tests.integration.conftest import invoke, registry_env

TARGET = "boost"
VERIFIED = {**registry_env(), "INVOKE_IMAGEFORGE_CACHE_TRUST": "verified"}


def build(manifest: Path, cache: Path, remote: str, env: dict[str, str]
          ) -> subprocess.CompletedProcess[str]:
    # --no-test: what is built or reused is the question here, not the image's checks.
    return invoke("build", "--target", TARGET, "--manifest", str(manifest), "--remote", remote,
                  "--progress", "plain", "--no-test", cache=cache, env=env)


def state(cache: Path, stage: str = TARGET) -> str:
    report = max((cache / "reports").glob(f"*-{TARGET}.json"), key=lambda p: p.stat().st_mtime)
    return str(next(s["state"] for s in json.loads(report.read_text())["stages"]
                    if s["name"] == stage))


def pipeline_stages(manifest: Path, cache: Path, remote: str) -> list[str]:
    """The stages ci.generate gives a job under the policy, asked with `cache`'s records."""
    result = invoke("ci.generate", "--target", TARGET, "--manifest", str(manifest), "--remote",
                    remote, "--json", cache=cache, env=VERIFIED)
    assert result.returncode == 0, result.stderr[-3000:]
    return [job["stage"] for job in json.loads(result.stdout)["jobs"]]


def with_records(source: Path, cache: Path) -> Path:
    """A fresh cache directory that knows only what `source`'s rebuilds verified."""
    shutil.copytree(source / "artifacts" / "verified", cache / "artifacts" / "verified")
    return cache


def test_only_verified_remote_artifacts_are_used_and_a_replaced_one_is_refused(
        sample_manifest: Path, registry: str, tmp_path: Path) -> None:
    remote = f"{registry}/trust-{uuid.uuid4().hex[:8]}"
    pushed = build(sample_manifest, tmp_path / "a", remote, registry_env())
    assert pushed.returncode == 0, pushed.stderr[-3000:]

    # Never verified: not used, built here, and the build says why.
    unverified = build(sample_manifest, tmp_path / "b", remote, VERIFIED)
    assert unverified.returncode == 0, unverified.stderr[-3000:]
    assert state(tmp_path / "b") == "built"
    assert "was never verified by a rebuild" in unverified.stderr
    # So a generated pipeline gives it a job, though the registry holds its key.
    assert TARGET in pipeline_stages(sample_manifest, tmp_path / "b", remote)

    # A rebuild from scratch matches the registry's artifact: recorded by its digest.
    verified = invoke("verify", "--rebuild", "--target", TARGET, "--manifest",
                      str(sample_manifest), "--remote", remote, "--json", "--progress", "plain",
                      cache=tmp_path / "b", env=registry_env())
    assert verified.returncode == 0, verified.stderr[-3000:]
    [verdict] = json.loads(verified.stdout)["stages"]
    assert verdict["result"] == "same", verdict
    assert verdict["remote_digest"].startswith("sha256:")

    fresh = with_records(tmp_path / "b", tmp_path / "c")
    used = build(sample_manifest, fresh, remote, VERIFIED)
    assert used.returncode == 0, used.stderr[-3000:]
    assert state(fresh) == "remote"
    assert TARGET not in pipeline_stages(sample_manifest, fresh, remote)

    # Someone replaces the artifact under the key in the registry.
    key = json.loads(invoke("plan", "--target", TARGET, "--manifest", str(sample_manifest),
                            "--json", cache=fresh).stdout)["stages"][-1]["key"]
    ref = f"{remote}/{TARGET}:{key.removeprefix('sha256:')}"
    poisoned = tmp_path / "poisoned"
    poisoned.mkdir()
    (poisoned / "Dockerfile").write_text("FROM scratch\nCOPY evil /out/evil\n")
    (poisoned / "evil").write_text("not what the pins say\n")
    with credentials(registry, registry_env()) as env:
        push = subprocess.run(["docker", "buildx", "build", "--output",
                               f"type=registry,name={ref}", str(poisoned)],
                              env={**os.environ, **env}, capture_output=True, text=True,
                              check=False)
    assert push.returncode == 0, push.stderr

    # Without the policy the registry's word is taken (what the policy is for) ...
    trusting = invoke("plan", "--target", TARGET, "--manifest", str(sample_manifest),
                      "--remote", remote, "--json", cache=tmp_path / "d", env=registry_env())
    assert json.loads(trusting.stdout)["stages"][-1]["status"] == "remote"
    # ... with it, the replaced artifact is refused before anything is built.
    refused = build(sample_manifest, with_records(tmp_path / "b", tmp_path / "e"), remote,
                    VERIFIED)
    assert refused.returncode == 13, refused.stderr[-3000:]
    assert "was replaced after it was verified and is refused" in refused.stderr
    assert ref in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "e" / "artifacts" / "entries").exists() or not any(
        (tmp_path / "e" / "artifacts" / "entries").iterdir())
    # And a rebuild compared with it names the planted file.
    caught = invoke("verify", "--rebuild", "--target", TARGET, "--manifest",
                    str(sample_manifest), "--remote", remote, "--json", "--progress", "plain",
                    cache=tmp_path / "b", env=registry_env())
    assert caught.returncode == 13, caught.stderr[-3000:]
    [verdict] = json.loads(caught.stdout)["stages"]
    assert verdict["result"] == "differs"
    assert ref in verdict["detail"]

"""One pin changed, by --set or by editing the manifest without `invoke lock`: only the stages
that depend on it rebuild (the lock applies entry by entry), as the plan and the build say."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import requests

from tests.integration.conftest import invoke

TARGET = "efa-nccl"
SHA_1_14_1 = 'sha256 = "24220cb0add4527f3e3797d4cb19e85aadca13c5b549902a19028aa19afd0a54"\n'


def efa_sha256(upstream: str, version: str) -> str:
    reply = requests.get(f"{upstream}/files/aws-efa-installer-{version}.tar.gz", timeout=30)
    reply.raise_for_status()
    return hashlib.sha256(reply.content).hexdigest()


def plan_json(manifest: Path, cache: Path, *overrides: str) -> dict[str, Any]:
    sets = [arg for o in overrides for arg in ("--set", o)]
    result = invoke("plan", "--target", TARGET, "--manifest", str(manifest), "--json", *sets,
                    cache=cache)
    assert result.returncode == 0, result.stderr
    plan: dict[str, Any] = json.loads(result.stdout)
    return plan


def statuses(manifest: Path, cache: Path, *overrides: str) -> dict[str, str]:
    return {s["name"]: s["status"] for s in plan_json(manifest, cache, *overrides)["stages"]}


def dependents(plan: dict[str, Any], name: str) -> set[str]:
    """`name` and every stage that builds on it, by the plan's own graph."""
    found = {name}
    for stage in plan["stages"]:  # topological order: deps come first
        if found & set(stage["deps"]):
            found.add(stage["name"])
    return found


def built(manifest: Path, cache: Path, *overrides: str) -> tuple[set[str], str]:
    """The stages the build's own report says it built, and what it told the user."""
    sets = [arg for o in overrides for arg in ("--set", o)]
    result = invoke("build", "--target", TARGET, "--manifest", str(manifest), "--no-test",
                    "--progress", "plain", *sets, cache=cache)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = max((cache / "reports").glob(f"*-{TARGET}.json"), key=lambda p: p.stat().st_mtime)
    stages = json.loads(report.read_text())["stages"]
    return {s["name"] for s in stages if s["state"] == "built"}, result.stderr


def test_one_pin_rebuilds_its_dependents_only(sample_manifest: Path, cache_dir: Path,
                                              upstream: str, tmp_path: Path) -> None:
    lock_before = sample_manifest.with_name("sample.lock.json").read_bytes()
    built(sample_manifest, cache_dir)
    assert set(statuses(sample_manifest, cache_dir).values()) == {"cached"}
    efa_dependents = dependents(plan_json(sample_manifest, cache_dir), "efa")
    assert "nccl" not in efa_dependents

    # Edited in the file, not re-locked: the build resolves the one stale entry, says so,
    # and rebuilds what depends on EFA.
    edited = tmp_path / "sample.toml"
    text = sample_manifest.read_text().replace('version = "1.14.1"', 'version = "1.15.1"')
    edited.write_text(text.replace(SHA_1_14_1, ""))
    edited.with_name("sample.lock.json").write_bytes(lock_before)
    plan = statuses(edited, cache_dir)
    assert {n for n, s in plan.items() if s == "build"} == efa_dependents
    rebuilt, told = built(edited, cache_dir)
    assert rebuilt == efa_dependents
    assert "(stages.efa.src-efa) resolved for this run" in told

    # The same kind of move by --set, to another release, over the unchanged manifest.
    older = ("stages.efa.version=1.11.2",
             f"stages.efa.sha256={efa_sha256(upstream, '1.11.2')}")
    plan = statuses(sample_manifest, cache_dir, *older)
    assert {n for n, s in plan.items() if s == "build"} == efa_dependents
    assert built(sample_manifest, cache_dir, *older)[0] == efa_dependents

    # A mirror (same commit, another location) rebuilds nothing; the lock was never touched.
    mirror = f"stages.nccl.repo={upstream}/git/nccl.git/"
    assert set(statuses(sample_manifest, cache_dir, mirror).values()) == {"cached"}
    assert sample_manifest.with_name("sample.lock.json").read_bytes() == lock_before

"""Pip requirements, locked: exact versions and sha256 hashes, dependencies included.

A stage that pip installs declares its requirements (`Stage.pip_requirements`). `invoke lock`
resolves them for the image's Python and platform, not the host's, with uv's resolver
(`uv pip compile --generate-hashes`: pip itself refuses a foreign `--python-version` unless
every package is a wheel, and the SageMaker packages are sdists). The lock records each
stage's set as one entry beside what it was resolved from:

    "pip": {"sagemaker-training": {
        "from": {"requirements": ["sagemaker-training==5.1.4", ...], "python": "3.11",
                 "platform": "linux/amd64"},
        "packages": [{"name": "boto3", "version": "1.44.8", "hashes": ["sha256:...", ...]}]}}

The stage installs that set with `pip install --require-hashes` from a requirements file its
recipe writes, so every version and hash is part of the recipe text and thus of the stage
key. An entry is used while its requirements, Python and platform still match, and is
re-resolved when they change or under `lock --upgrade`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from imageforge import cmd
from imageforge.errors import LockError, SourceError
from imageforge.model.manifest import Manifest
from imageforge.model.stage import Context, Inputs, Stage
from imageforge.sources import cabundle

# The stage input that holds the locked set (filled from the lock, never from the manifest).
INPUT = "pip_lock"
# manylinux_2_28 is the oldest glibc among the bases the manifests use (Ubuntu 20.04 has 2.31),
# so every wheel the resolver picks installs on them.
PLATFORMS = {"linux/amd64": "x86_64-manylinux_2_28", "linux/arm64": "aarch64-manylinux_2_28"}
TIMEOUT_S = 300

Entry = Mapping[str, Any]


def requirements(stage: Stage, context: Context) -> list[str]:
    return list(stage.pip_requirements(context))


# The index a set is resolved on unless its stage names another (an `index` key).
PYPI_SIMPLE = "https://pypi.org/simple"


def origin(wanted: Sequence[str], image: Inputs, index: str | None = None) -> dict[str, Any]:
    """What a stage's set is resolved from: its requirements, the image's Python and platform,
    and its own index when it names one other than PyPI (a PyTorch-style per-variant one)."""
    found = {"requirements": list(wanted), "python": str(image["python"]),
             "platform": str(image["platform"])}
    if index and index.rstrip("/") != PYPI_SIMPLE:
        found["index"] = index.rstrip("/")
    return found


def resolve(stage: str, wanted: Sequence[str], *, python: str, platform: str,
            index_url: str) -> list[dict[str, Any]]:
    """Every package `wanted` needs on `python`/`platform`, pinned with all its sha256 hashes."""
    from uv import find_uv_bin

    argv = [find_uv_bin(), "pip", "compile", "-", "--quiet", "--no-config", "--no-cache",
            "--generate-hashes", "--no-header", "--no-annotate",
            "--python", sys.executable, "--python-version", python,
            "--python-platform", PLATFORMS[platform], "--index-url", index_url]
    env = {**os.environ, "NO_COLOR": "1"}
    bundle = cabundle.resolve(None)
    if bundle:
        # The same bundle builds get: behind a TLS-intercepting proxy PyPI needs it here too.
        env["SSL_CERT_FILE"] = str(bundle)
    result = cmd.run(argv, input="\n".join(wanted) + "\n", text=True, env=env, timeout=TIMEOUT_S,
                 error=SourceError,
                 timed_out=f"stages.{stage}: resolving its pip requirements at {index_url} took "
                           f"over {TIMEOUT_S} s; check the network and retry.")
    if result.returncode != 0:
        raise _failure(stage, wanted, python, index_url, result.stderr)
    return parse(result.stdout)


def _failure(stage: str, wanted: Sequence[str], python: str, index_url: str,
             stderr: str) -> LockError | SourceError:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    why = " ".join(lines[:4])[:400] or "no reason given"
    if "No solution found" in stderr or "not found in the package registry" in stderr:
        return LockError(f"stages.{stage}: pip requirements {', '.join(wanted)} have no "
                         f"solution for Python {python} ({why}); fix them in the manifest.")
    return SourceError(f"stages.{stage}: cannot resolve its pip requirements at {index_url} "
                       f"({why}); check the network or the index and retry.")


def parse(text: str) -> list[dict[str, Any]]:
    """`name==version` lines with their `--hash=sha256:` continuation lines, as uv writes
    them with --generate-hashes."""
    packages: list[dict[str, Any]] = []
    for raw in text.splitlines():
        line = raw.strip().removesuffix("\\").strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("--hash="):
            packages[-1]["hashes"].append(line.removeprefix("--hash="))
            continue
        name, _, version = line.partition("==")
        packages.append({"name": name.strip(), "version": version.strip(), "hashes": []})
    return sorted(packages, key=lambda p: str(p["name"]))


def context(manifest: Manifest, registry: Mapping[str, Stage]) -> Context:
    """Every stage's table, or its defaults: what requirements are read from (a stage's may
    name another's, as smddp names the training toolkit's)."""
    values = {name: dict(manifest.stages[name]) if manifest.has_stage(name) else
              {key: field.default for key, field in stage.fields.items()}
              for name, stage in registry.items()}
    return Context(image=manifest.image, stages=values)


def moves(before: Entry, after: Entry) -> str:
    """`boto3 1.44.8 -> 1.44.9, six (none) -> 1.17.0`: the packages whose version moved."""
    old, new = _versions(before), _versions(after)
    return ", ".join(f"{name} {old.get(name, '(none)')} -> {new.get(name, '(none)')}"
                     for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)
                     ) or "same versions, new hashes"


def _versions(entry: Entry) -> dict[str, str]:
    return {p["name"]: p["version"] for p in entry.get("packages", [])}

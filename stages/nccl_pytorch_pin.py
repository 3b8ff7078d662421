"""The nccl stage's lock pin: the NCCL that the pinned PyTorch commit builds against.

For PyTorch from wheels it is the wheel's `Requires-Dist: nvidia-nccl-cuXX==V`
(stages/ncclwheelpin.py). Otherwise it is resolved when the lock is written, from PyTorch's
commit alone (never from where PyTorch was fetched): its `third_party/nccl` submodule, or the
pin file of releases that pin NCCL per CUDA version (stages/ncclpin.py). With
`[stages.nccl] version = "auto"` the nccl stage builds that version and exact commit; with an
explicit version it is the evidence the NCCL-vs-PyTorch rule judges the manifest by.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from imageforge.stageapi import (
    Context,
    GitSource,
    LockError,
    LockPin,
    Manifest,
    ManifestError,
    Pin,
    Stage,
    Upstream,
    image_cuda,
    redact,
    stage_inputs,
)
from stages import nccl_wheel, ncclwheelpin
from stages.ncclpin import pytorch_nccl_pin

ENTRY = "nccl_pytorch_pin"


def _pytorch(manifest: Manifest, registry: Mapping[str, Stage]) -> tuple[Mapping[str, Any],
                                                                         GitSource]:
    inputs = stage_inputs(manifest, registry["pytorch"], "pytorch")
    source = registry["pytorch"].sources(Context(image=manifest.image,
                                                 stages={"pytorch": inputs}))[0]
    assert isinstance(source, GitSource)
    return inputs, source


def _wheel(manifest: Manifest, registry: Mapping[str, Stage]) -> Mapping[str, Any] | None:
    """The pytorch stage's inputs when it installs wheels (stages/ncclwheelpin.py)."""
    inputs = stage_inputs(manifest, registry["pytorch"], "pytorch")
    return inputs if inputs["provider"] == "wheel" else None


def _nccl_wheel(manifest: Manifest) -> bool:
    """True when the nccl stage takes the library of the torch wheel's own NCCL wheel."""
    return nccl_wheel.from_wheel(manifest.stages.get("nccl", {}))


def origin(manifest: Manifest, registry: Mapping[str, Stage]) -> Mapping[str, Any] | None:
    wheel = _wheel(manifest, registry)
    if wheel is not None:
        found = ncclwheelpin.origin(manifest.image, wheel)
        # Only then: the locks written before the provider existed stay current.
        return {**found, "nccl_provider": "wheel"} if _nccl_wheel(manifest) else found
    inputs, source = _pytorch(manifest, registry)
    if not source.commit:
        return None
    cuda = image_cuda(manifest)
    return {"pytorch_version": str(inputs["version"]), "pytorch_commit": source.commit,
            "cuda": str(cuda) if cuda else None}


def resolve(manifest: Manifest, registry: Mapping[str, Stage], where: Upstream) -> Pin:
    nccl_repo = str(manifest.stages["nccl"].get("repo", registry["nccl"].fields["repo"].default))
    wheel = _wheel(manifest, registry)
    if wheel is not None and _nccl_wheel(manifest):
        return ncclwheelpin.resolve_wheel(manifest.image, wheel, where)
    if wheel is not None:
        return ncclwheelpin.resolve(manifest.image, wheel, nccl_repo, where)
    if _nccl_wheel(manifest):
        raise ManifestError(f"{manifest.path}: stages.nccl.provider = \"wheel\" takes the NCCL "
                            "wheel the torch wheel pins, but stages.pytorch.provider is "
                            "\"source\"; set [stages.pytorch] provider = \"wheel\", or build "
                            "NCCL from source.")
    _, pytorch = _pytorch(manifest, registry)
    assert pytorch.commit
    cuda = image_cuda(manifest)
    pin = pytorch_nccl_pin(
        pytorch_repo=where.locate(pytorch.repo), pytorch_commit=pytorch.commit,
        pytorch_version=str(manifest.stages["pytorch"]["version"]), pytorch_ref=pytorch.ref,
        cuda=str(cuda) if cuda else None, nccl_repo=where.locate(nccl_repo),
        mirrors=where.mirrors)
    # The lock records where sources come from, not where rewrite rules sent this machine.
    evidence = {**pin.evidence, "pytorch_repo": redact(pytorch.repo),
                "nccl_repo": redact(nccl_repo)}
    return {"version": pin.version, "commit": pin.commit, "evidence": evidence}


def waits(manifest: Manifest) -> bool:
    return manifest.stages.get("nccl", {}).get("version") == "auto"


def apply(manifest: Manifest, pin: Pin) -> Manifest:
    """Replace `stages.nccl.version = "auto"` by the version and exact commit PyTorch pins."""
    nccl = manifest.stages.get("nccl")
    if nccl is None or nccl.get("version") != "auto":
        return manifest
    if nccl_wheel.from_wheel(nccl):
        url, sha256 = _entry(pin, "wheel_url", URL), _entry(pin, "sha256", SHA256)
        resolved = {**nccl, "version": _entry(pin, "version", VERSION), "wheel_url": url,
                    "sha256": sha256}
        return dataclasses.replace(manifest, stages={**manifest.stages, "nccl": resolved})
    # The pin may be a post-release fix with no tag of its own: build the commit itself.
    commit = _entry(pin, "commit", COMMIT)
    resolved = {**nccl, "version": _entry(pin, "version", VERSION), "commit": commit,
                "ref": commit}
    return dataclasses.replace(manifest, stages={**manifest.stages, "nccl": resolved})


# What the lock's entry may hold: it is read from a file, and its values reach RUN lines.
VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")
COMMIT = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
# A URL without shell or quoting characters, though it is always quoted.
URL = re.compile(r"https?://[A-Za-z0-9._~:/?#@&+,=%-]+")


def _entry(pin: Pin, key: str, pattern: re.Pattern[str]) -> str:
    value = pin.get(key)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise LockError(f"the lock's {ENTRY} entry has no valid {key} (found {value!r:.80}); "
                        "delete the entry and run `invoke lock`.")
    return value


def describe(before: Pin | None, after: Pin | None) -> str:
    version = after.get("version") if after else None
    commit = after.get("commit") or after.get("sha256") if after else None
    return (f"nccl pinned by pytorch: {before.get('version') if before else None} -> "
            f"{version} ({commit})")


PIN = LockPin(entry=ENTRY, reads=("pytorch",), origin=origin, resolve=resolve, apply=apply,
              describe=describe, waits=waits)

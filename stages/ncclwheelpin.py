"""The NCCL a PyTorch wheel pins, resolved to NCCL's release tag and exact commit.

Each torch wheel requires exactly one `nvidia-nccl-cuXX==V`, and V depends on the CUDA variant
as well as the release (torch 2.14.1: 2.30.7 for cu130, 2.29.3 for cu126), so the pin is read
from the exact wheel the image installs: the torch wheel of that release, variant, Python and
platform on the manifest's index. Its METADATA is read without downloading the wheel where the
index allows (imageforge.sources.wheelmeta). NCCL's tag for V is `v{V}-1`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from imageforge.stageapi import Context, Pin, SourceError, Upstream, gitsource, redact, wheelmeta
from stages import pytorch_wheel

NCCL_WHEEL = re.compile(r"nvidia-nccl-cu(\d+)")


def origin(image: Mapping[str, Any], pytorch: Mapping[str, Any]) -> dict[str, Any]:
    """What the pin depends on: the exact torch wheel that would be picked."""
    ctx = Context(image=image, stages={"pytorch": pytorch})
    return {"provider": "wheel", "pytorch_version": str(pytorch["version"]),
            "variant": pytorch_wheel.variant(ctx), "index": str(pytorch["index"]),
            "python": str(image["python"]), "platform": str(image["platform"])}


def _requirement(wanted: Mapping[str, Any], where: Upstream
                 ) -> tuple[wheelmeta.Wheel, str, str]:
    """The torch wheel the image installs, and the NCCL wheel (name, version) it requires."""
    index = wanted["index"].rstrip("/")
    wheels = wheelmeta.list_wheels(where.locate(index), "torch")
    wheel = _pick(wheels, wanted)
    metadata = wheelmeta.read_metadata(wheel)
    environment = wheelmeta.marker_environment(wanted["python"], wanted["platform"])
    found = wheelmeta.pinned(metadata, NCCL_WHEEL, environment=environment)
    if found is None:
        raise SourceError(f"stages.nccl.version = \"auto\": {wheel.filename} requires no "
                          "nvidia-nccl-cuXX wheel, so it pins no NCCL; set stages.nccl.version "
                          "to the NCCL to build, with provider = \"source\".")
    name, nccl = found
    _check_variant(name, wanted["variant"], wheel.filename)
    return wheel, name, nccl


def resolve_wheel(image: Mapping[str, Any], pytorch: Mapping[str, Any], where: Upstream) -> Pin:
    """With `[stages.nccl] provider = "wheel"`: the NCCL wheel itself, for the image's platform,
    by the sha256 the index publishes for it (the file is fetched only when building)."""
    wanted = origin(image, pytorch)
    index = wanted["index"].rstrip("/")
    torch, name, nccl = _requirement(wanted, where)
    wheels = wheelmeta.list_wheels(where.locate(index), name)
    wheel = wheelmeta.pick(wheels, project=name, version=nccl, python=wanted["python"],
                           platform=wanted["platform"])
    if not wheel.sha256:
        raise SourceError(f"stages.nccl.provider = \"wheel\": {redact(index)} gives no sha256 "
                          f"for {wheel.filename}, so it cannot be locked; use an index that "
                          "publishes hashes (PyPI, download.pytorch.org) in stages.pytorch.index.")
    return {"version": nccl, "wheel_url": redact(wheel.url), "sha256": wheel.sha256,
            "evidence": {"method": "wheel", "wheel": torch.filename,
                         "wheel_sha256": torch.sha256, "requires": f"{name}=={nccl}",
                         "index": redact(index), "nccl_wheel": wheel.filename}}


def resolve(image: Mapping[str, Any], pytorch: Mapping[str, Any], nccl_repo: str,
            where: Upstream) -> Pin:
    wanted = origin(image, pytorch)
    index, version = wanted["index"].rstrip("/"), wanted["pytorch_version"]
    wheel, name, nccl = _requirement(wanted, where)
    tag = f"v{nccl}-1"
    try:
        commit = gitsource.resolve_ref(where.locate(nccl_repo), tag)
    except SourceError as exc:
        raise SourceError(f"stages.nccl.version = \"auto\": torch {version} pins NCCL {nccl} "
                          f"({name}), but stages.nccl.repo {redact(nccl_repo)} has no release "
                          f"tag {tag} ({exc}); point stages.nccl.repo at NCCL's repository or "
                          "set stages.nccl.version.") from None
    return {"version": nccl, "commit": commit, "evidence": {
        "method": "wheel", "wheel": wheel.filename, "wheel_sha256": wheel.sha256,
        "requires": f"{name}=={nccl}", "index": redact(index), "tag": tag,
        "nccl_repo": redact(nccl_repo)}}


def _pick(wheels: list[wheelmeta.Wheel], wanted: Mapping[str, Any]) -> wheelmeta.Wheel:
    """The variant's own wheel (`+cu130` on a PyTorch-style index), else the index's plain
    wheel of that release (PyPI has one variant per release; its pin says which)."""
    common = {"project": "torch", "version": wanted["pytorch_version"],
              "python": wanted["python"], "platform": wanted["platform"]}
    local = [w for w in wheels if "+" in w.filename.split("-")[1]]
    if local and wanted["variant"]:
        return wheelmeta.pick(wheels, local=wanted["variant"], **common)
    return wheelmeta.pick(wheels, **common)


def _check_variant(name: str, variant: str | None, filename: str) -> None:
    """PyPI's plain wheel is built for one CUDA major: it must be the variant's."""
    major = NCCL_WHEEL.fullmatch(name)
    if variant is None or major is None:
        return
    if not variant.startswith(f"cu{major[1]}"):
        raise SourceError(f"stages.pytorch.variant is {variant}, but {filename} is built for "
                          f"CUDA {major[1]} (it requires {name}); use a per-variant index in "
                          "stages.pytorch.index or the variant the wheel is built for.")

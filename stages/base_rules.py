"""The base stage's compatibility rules: the base image's CUDA and the GPU archs it compiles
for. Their sources, fix hints and the CUDA arch table are data in stages/base_rules.toml."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.version import Version

from imageforge.stageapi import (
    CUDA_BASE,
    Manifest,
    Registry,
    Rule,
    Violation,
    image_cuda,
    minor,
    numeric,
    read,
)

DATA = Path(__file__).with_name("base_rules.toml")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArchSupport:
    since: Version
    until: Version | None


def _parse(raw: Mapping[str, Any]) -> dict[str, ArchSupport]:
    return {str(arch): ArchSupport(since=Version(s["since"]),
                                   until=Version(s["until"]) if "until" in s else None)
            for arch, s in raw["cuda_arch"].items()}


def archs(path: Path = DATA) -> Mapping[str, ArchSupport]:
    """Compute capability -> the CUDA releases that compile for it."""
    return read(path, _parse)


def _base_cuda(manifest: Manifest, rule: Rule, _registry: Registry) -> list[Violation]:
    base = str(manifest.image["base"])
    match = CUDA_BASE.search(base)
    declared = numeric(manifest.image.get("cuda"))
    if match is None or declared is None:
        return []
    base_cuda = f"{match[1]}.{match[2]}"
    if minor(declared) == base_cuda:
        return []
    return [rule.violation(
        "image.cuda",
        f"image.base {base} is CUDA {base_cuda}, but image.cuda is {manifest.image['cuda']}.",
        base=base_cuda, cuda=minor(declared))]


def _cuda_arch(manifest: Manifest, rule: Rule, _registry: Registry) -> list[Violation]:
    support = archs(rule.data)
    cuda = image_cuda(manifest)
    if cuda is None:
        return []
    return [found for key, listed in _arch_lists(manifest) for arch in listed
            for found in _arch_problem(rule, support, cuda, key, arch.split("+")[0])]


def _arch_problem(rule: Rule, archs: Mapping[str, ArchSupport], cuda: Version, key: str,
                  arch: str) -> list[Violation]:
    support = archs.get(arch)
    sm = "sm_" + arch.replace(".", "")
    if support is None:
        return [rule.violation(key, f"{arch} in {key} is not a CUDA compute capability.",
                               action=f"use one of {', '.join(archs)}")]
    if cuda < support.since:
        return [rule.violation(
            key, f"{sm} ({arch}) in {key} needs CUDA {support.since} or newer, but the image's "
                 f"CUDA is {cuda}.",
            action=f"remove {arch} from {key}, or use CUDA {support.since} or newer")]
    if support.until is not None and cuda >= support.until:
        return [rule.violation(
            key, f"CUDA {support.until} dropped {sm} ({arch}), but {key} lists it for CUDA "
                 f"{cuda}.",
            action=f"remove {arch} from {key}, or use a CUDA older than {support.until}")]
    return []


def _ptx_arch(manifest: Manifest, rule: Rule, _registry: Registry) -> list[Violation]:
    torch = manifest.stages.get("pytorch")
    ptx = torch.get("ptx_arch") if torch else None
    if not ptx:
        return []
    listed = [arch.split("+")[0] for _, archs in _arch_lists(manifest) for arch in archs]
    if str(ptx).split("+")[0] in listed:
        return []
    shown = ", ".join(dict.fromkeys(listed)) or "none"
    return [rule.violation(
        "stages.pytorch.ptx_arch",
        f"stages.pytorch.ptx_arch {ptx} is not in the arch list ({shown}), so no PTX would be "
        "embedded.", archs=shown, arch=str(ptx))]


def _arch_lists(manifest: Manifest) -> list[tuple[str, Sequence[str]]]:
    lists: list[tuple[str, Sequence[str]]] = [("image.cuda_arch", manifest.image["cuda_arch"])]
    torch = manifest.stages.get("pytorch")
    if torch:
        lists.append(("stages.pytorch.extra_cuda_arch", torch.get("extra_cuda_arch") or []))
    return lists


RULES = (
    Rule(id="base-cuda", judge=_base_cuda, data=DATA),
    Rule(id="cuda-arch", judge=_cuda_arch, data=DATA),
    Rule(id="ptx-arch", judge=_ptx_arch, data=DATA),
)

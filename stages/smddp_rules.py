"""The smddp stage's compatibility rules: the SMDDP wheel must be the one of
stages.smddp.version, for the image's Python, PyTorch and CUDA. The combinations AWS shipped
and the rules' sources are data in stages/smddp_rules.toml."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from imageforge.stageapi import (
    Manifest,
    Registry,
    Rule,
    Violation,
    filename_of,
    image_cuda,
    numeric,
    read,
)

DATA = Path(__file__).with_name("smddp_rules.toml")
SMDDP_PYTORCH = re.compile(r"/pytorch/([^/]+)/cu\d+/")
CPYTHON = re.compile(r"cp(\d)(\d+)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shipped:
    """What an SMDDP release was shipped with (the known-good table)."""

    pytorch: str
    cuda: str


def _parse(raw: Mapping[str, Any]) -> dict[str, Shipped]:
    return {str(row["smddp"]): Shipped(pytorch=str(row["pytorch"]), cuda=str(row["cuda"]))
            for row in raw["known_good"]}


def shipped(path: Path = DATA) -> Mapping[str, Shipped]:
    """SMDDP version -> what AWS shipped it with."""
    return read(path, _parse)


def _smddp_wheel(manifest: Manifest, rule: Rule, _registry: Registry) -> list[Violation]:
    smddp = manifest.stages.get("smddp")
    if smddp is None:
        return []
    filename = filename_of(str(smddp["url"]))
    wheel = _wheel(manifest)
    if wheel is None:
        return [rule.violation("stages.smddp.url",
                               f"stages.smddp.url names {filename!r}, which is not a wheel.",
                               version=str(smddp["version"]))]
    if wheel[0] == numeric(smddp["version"]):
        return []
    return [rule.violation(
        "stages.smddp.url",
        f"stages.smddp.url is the wheel of SMDDP {wheel[0]}, but stages.smddp.version is "
        f"{smddp['version']}.", version=str(smddp["version"]))]


def _smddp_python(manifest: Manifest, rule: Rule, _registry: Registry) -> list[Violation]:
    wheel = _wheel(manifest)
    python = str(manifest.image["python"])
    if wheel is None:
        return []
    pythons = sorted({p for p in (_python_of(tag) for tag in wheel[1]) if p})
    if not pythons or python in pythons:
        return []
    filename = filename_of(str(manifest.stages["smddp"]["url"]))
    return [rule.violation(
        "image.python",
        f"the SMDDP wheel {filename} is for Python {', '.join(pythons)}, but image.python is "
        f"{python}.", python=python, tag=python.replace(".", ""), wheel_python=pythons[0])]


def _smddp_pytorch(manifest: Manifest, rule: Rule, _registry: Registry) -> list[Violation]:
    table = shipped(rule.data)
    smddp = manifest.stages.get("smddp")
    torch = manifest.stages.get("pytorch")
    if smddp is None or torch is None:
        return []
    segment = SMDDP_PYTORCH.search(str(smddp["url"]))
    known = _shipped(table, smddp["version"])
    if segment:
        wanted, where = segment[1], f"its URL's /pytorch/{segment[1]}/ segment"
    elif known:
        wanted, where = known.pytorch, f"SMDDP {smddp['version']} shipped with it"
    else:
        return []
    if numeric(wanted) == numeric(torch["version"]):
        return []
    return [rule.violation(
        "stages.pytorch.version",
        f"the SMDDP wheel is built for PyTorch {wanted} ({where}), but stages.pytorch.version "
        f"is {torch['version']}.", wanted=wanted, pytorch=str(torch["version"]))]


def last_pytorch(path: Path = DATA) -> Version:
    """The newest PyTorch major.minor any SMDDP release was built for."""
    return read(path, _last)


def _last(raw: Mapping[str, Any]) -> Version:
    return Version(str(raw["last_pytorch"]))


def _smddp_no_pytorch_2_6(manifest: Manifest, rule: Rule, _registry: Registry
                          ) -> list[Violation]:
    torch = manifest.stages.get("pytorch")
    if manifest.stages.get("smddp") is None or torch is None:
        return []
    version, last = numeric(torch["version"]), last_pytorch(rule.data)
    if version is None or Version(f"{version.major}.{version.minor}") <= last:
        return []
    return [rule.violation(
        "stages.smddp", f"SMDDP's last release is for PyTorch {last}, but stages.pytorch.version "
        f"is {torch['version']}.", last=str(last))]


def _smddp_cuda(manifest: Manifest, rule: Rule, _registry: Registry) -> list[Violation]:
    table = shipped(rule.data)
    smddp = manifest.stages.get("smddp")
    known = _shipped(table, smddp["version"]) if smddp else None
    cuda = image_cuda(manifest)
    if smddp is None or known is None or cuda is None or str(cuda) == known.cuda:
        return []
    return [rule.violation(
        "image.cuda",
        f"SMDDP {smddp['version']} was shipped for CUDA {known.cuda}, but the image's CUDA "
        f"is {cuda}.", wanted=known.cuda, cuda=str(cuda))]


def _wheel(manifest: Manifest) -> tuple[Version, frozenset[Tag]] | None:
    smddp = manifest.stages.get("smddp")
    if smddp is None:
        return None
    try:
        _, version, _, tags = parse_wheel_filename(filename_of(str(smddp["url"])))
    except InvalidWheelFilename:
        return None
    return version, tags


def _python_of(tag: Tag) -> str | None:
    match = CPYTHON.fullmatch(tag.interpreter)
    return f"{match[1]}.{match[2]}" if match else None


def _shipped(table: Mapping[str, Shipped], version: object) -> Shipped | None:
    parsed = numeric(version)
    return table.get(str(parsed)) if parsed is not None else None


RULES = (
    Rule(id="smddp-wheel", judge=_smddp_wheel, data=DATA),
    Rule(id="smddp-python", judge=_smddp_python, data=DATA),
    Rule(id="smddp-pytorch", judge=_smddp_pytorch, data=DATA),
    Rule(id="smddp-cuda", judge=_smddp_cuda, data=DATA),
    Rule(id="smddp-no-pytorch-2-6", judge=_smddp_no_pytorch_2_6, data=DATA),
)

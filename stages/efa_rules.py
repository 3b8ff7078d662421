"""The efa stage's compatibility rule, and what the data knows of EFA installer releases
(which libfabric each bundles, from which one it ships aws-ofi-nccl itself): the efa stage's
smoke checks and the aws-ofi-nccl rules read it too. The facts are data in
stages/efa_rules.toml."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.version import Version

from imageforge.stageapi import (
    Floor,
    Manifest,
    Registry,
    Rule,
    Violation,
    data_of,
    floor,
    floors,
    minor,
    numeric,
    read,
    stage_version,
)

DATA = Path(__file__).with_name("efa_rules.toml")
PLUGIN = "aws-ofi-nccl"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Installers:
    """stages/efa_rules.toml, parsed."""

    # Installer version (X.Y: every X.Y.Z; X.Y.Z: that release) -> the libfabric it bundles.
    libfabric: Mapping[str, Version]
    # The first installer that ships aws-ofi-nccl itself.
    bundles_plugin_from: Version
    # The libfabric each aws-ofi-nccl release needs (without --enable-platform-aws).
    libfabric_min: Sequence[Floor]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EfaInstaller:
    version: str
    libfabric: Version
    bundles_plugin: bool


def _parse(raw: Mapping[str, Any]) -> Installers:
    return Installers(
        libfabric={str(k): Version(v) for k, v in raw["efa"]["libfabric"].items()},
        bundles_plugin_from=Version(raw["efa"]["bundles_plugin_from"]),
        libfabric_min=floors(raw["aws-ofi-nccl"]["libfabric_min"], over="plugin"),
    )


def installers(path: Path = DATA) -> Installers:
    return read(path, _parse)


def installers_in(registry: Registry) -> Installers | None:
    """The efa stage's facts as the registry has them (None: it has no efa rules)."""
    path = data_of(registry, "efa")
    return installers(path) if path is not None else None


def known_efa(version: str, *, path: Path = DATA) -> EfaInstaller | None:
    """What the data knows about an EFA installer release, or None when it knows nothing."""
    data = installers(path)
    libfabric = bundled_libfabric(data, version)
    parsed = numeric(version)
    if libfabric is None or parsed is None:
        return None
    return EfaInstaller(version=version, libfabric=libfabric,
                        bundles_plugin=parsed >= data.bundles_plugin_from)


def bundled_libfabric(data: Installers, version: object) -> Version | None:
    parsed = numeric(version)
    if parsed is None:
        return None
    return data.libfabric.get(str(parsed)) or data.libfabric.get(minor(parsed))


def image_libfabric(manifest: Manifest, data: Installers) -> Version | None:
    efa = manifest.stages.get("efa")
    return bundled_libfabric(data, efa.get("version")) if efa else None


def installer_with(data: Installers, minimum: Version) -> str:
    """The oldest EFA installer the data knows that bundles libfabric >= `minimum`."""
    fitting = [k for k, libfabric in data.libfabric.items() if libfabric >= minimum]
    if not fitting:
        return "a newer installer"
    oldest = min(fitting, key=Version)
    return f"EFA {oldest}" if oldest.count(".") == 2 else f"EFA {oldest}.x"


def _plugin_libfabric(manifest: Manifest, rule: Rule, _registry: Registry) -> list[Violation]:
    data = installers(rule.data)
    plugin = stage_version(manifest, PLUGIN)
    libfabric = image_libfabric(manifest, data)
    minimum = floor(data.libfabric_min, plugin)
    if libfabric is None or minimum is None or libfabric >= minimum:
        return []
    return [rule.violation(
        "stages.efa.version",
        f"EFA installer {manifest.stages['efa']['version']} bundles libfabric {libfabric}, but "
        f"aws-ofi-nccl {manifest.stages[PLUGIN]['version']} needs libfabric >= {minimum}.",
        minimum=str(minimum), installer=installer_with(data, minimum),
        libfabric=str(libfabric))]


RULES = (Rule(id="plugin-libfabric", judge=_plugin_libfabric, data=DATA),)

"""The aws-ofi-nccl stage's compatibility rules and its `invoke check` note: configure flags
a release does not have, the libfabric --enable-platform-aws needs, the NCCL each release
works with, and the plugin the EFA installer may already ship. The facts are data in
stages/aws_ofi_nccl_rules.toml; what each EFA installer bundles is the efa stage's
(stages/efa_rules.py), read through the registry."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.version import Version

from imageforge.stageapi import (
    Floor,
    Manifest,
    Note,
    Registry,
    Rule,
    Violation,
    floor,
    floors,
    read,
    stage_version,
)
from stages.efa_rules import image_libfabric, installer_with, installers_in

DATA = Path(__file__).with_name("aws_ofi_nccl_rules.toml")
PLUGIN = "aws-ofi-nccl"
PLATFORM_AWS = "--enable-platform-aws"
DISABLE_TESTS = "--disable-tests"
WITH_NCCL = "--with-nccl"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Facts:
    """stages/aws_ofi_nccl_rules.toml, parsed."""

    flag_since: Mapping[str, Version]
    with_nccl_unneeded_from: Version
    platform_aws_libfabric_min: Sequence[Floor]
    nccl_min: Sequence[Floor]


def _parse(raw: Mapping[str, Any]) -> Facts:
    plugin = raw["aws-ofi-nccl"]
    return Facts(
        flag_since={flag: Version(v) for flag, v in plugin["flag_since"].items()},
        with_nccl_unneeded_from=Version(plugin["with_nccl_unneeded_from"]),
        platform_aws_libfabric_min=floors(plugin["platform_aws_libfabric_min"], over="plugin"),
        nccl_min=floors(plugin["nccl_min"], over="plugin"),
    )


def facts(path: Path = DATA) -> Facts:
    return read(path, _parse)


def _plugin_platform_aws(manifest: Manifest, rule: Rule, registry: Registry) -> list[Violation]:
    data, installers = facts(rule.data), installers_in(registry)
    plugin = stage_version(manifest, PLUGIN)
    if plugin is None or PLATFORM_AWS not in _plugin_flags(manifest):
        return []
    name = manifest.stages[PLUGIN]["version"]
    since = data.flag_since[PLATFORM_AWS]
    if plugin < since:
        return [rule.violation(
            "stages.aws-ofi-nccl.configure_flags",
            f"aws-ofi-nccl {name} has no {PLATFORM_AWS}; the option exists from {since}.",
            action=f"drop {PLATFORM_AWS} from stages.aws-ofi-nccl.configure_flags, or use "
                   f"aws-ofi-nccl {since} or newer")]
    minimum = floor(data.platform_aws_libfabric_min, plugin)
    if installers is None or minimum is None:
        return []
    libfabric = image_libfabric(manifest, installers)
    if libfabric is None or libfabric >= minimum:
        return []
    general = floor(installers.libfabric_min, plugin)
    if general is not None and libfabric < general:
        return []  # plugin-libfabric (the efa stage's) already reports this installer
    return [rule.violation(
        "stages.efa.version",
        f"aws-ofi-nccl {name} with {PLATFORM_AWS} needs libfabric >= {minimum}, but EFA "
        f"installer {manifest.stages['efa']['version']} bundles libfabric {libfabric}.",
        action=f"use an EFA installer that bundles libfabric >= {minimum} (e.g. "
               f"{installer_with(installers, minimum)}), or build without {PLATFORM_AWS}")]


def _plugin_disable_tests(manifest: Manifest, rule: Rule, _registry: Registry) -> list[Violation]:
    data = facts(rule.data)
    plugin = stage_version(manifest, PLUGIN)
    since = data.flag_since[DISABLE_TESTS]
    if plugin is None or plugin >= since or DISABLE_TESTS not in _plugin_flags(manifest):
        return []
    return [rule.violation(
        "stages.aws-ofi-nccl.configure_flags",
        f"aws-ofi-nccl {manifest.stages[PLUGIN]['version']} has no {DISABLE_TESTS} (it exists "
        f"from {since}); its configure ignores the flag and still builds the MPI tests.")]


def _plugin_nccl(manifest: Manifest, rule: Rule, _registry: Registry) -> list[Violation]:
    data = facts(rule.data)
    nccl = stage_version(manifest, "nccl")
    minimum = floor(data.nccl_min, stage_version(manifest, PLUGIN))
    if nccl is None or minimum is None or nccl >= minimum:
        return []
    return [rule.violation(
        "stages.nccl.version",
        f"aws-ofi-nccl {manifest.stages[PLUGIN]['version']} works with NCCL {minimum} and "
        f"newer, but stages.nccl.version is {manifest.stages['nccl']['version']}.",
        minimum=str(minimum))]


def _efa_bundled_plugin(manifest: Manifest, rule: Rule, registry: Registry) -> list[Violation]:
    installers = installers_in(registry)
    efa = stage_version(manifest, "efa")
    plugin = manifest.stages.get(PLUGIN)
    if installers is None or efa is None or plugin is None:
        return []
    if (efa < installers.bundles_plugin_from or plugin.get("build_despite_bundled")
            or plugin.get("provider") == "efa"):
        return []
    return [rule.violation(
        "stages.aws-ofi-nccl",
        f"EFA installer {manifest.stages['efa']['version']} already installs aws-ofi-nccl at "
        f"/opt/amazon/ofi-nccl, and [stages.aws-ofi-nccl] would build {plugin['version']} too.",
        plugin=f"aws-ofi-nccl {plugin['version']}")]


def _plugin_from_efa(manifest: Manifest, rule: Rule, registry: Registry) -> list[Violation]:
    installers = installers_in(registry)
    efa = stage_version(manifest, "efa")
    plugin = manifest.stages.get(PLUGIN)
    if installers is None or efa is None or plugin is None or plugin.get("provider") != "efa":
        return []
    if efa >= installers.bundles_plugin_from:
        return []
    return [rule.violation(
        "stages.aws-ofi-nccl.provider",
        f"stages.aws-ofi-nccl.provider is \"efa\", but EFA installer "
        f"{manifest.stages['efa']['version']} ships no aws-ofi-nccl (installers do from "
        f"{installers.bundles_plugin_from}).",
        plugin=f"aws-ofi-nccl {plugin['version']}")]


def _with_nccl_note(manifest: Manifest, note: Note, _registry: Registry) -> list[str]:
    data = facts(note.data)
    plugin = stage_version(manifest, PLUGIN)
    if plugin is None or plugin < data.with_nccl_unneeded_from:
        return []
    if WITH_NCCL not in _plugin_flags(manifest):
        return []
    return [f"aws-ofi-nccl {manifest.stages[PLUGIN]['version']} serves every NCCL from one "
            f"build (from {data.with_nccl_unneeded_from}), so {WITH_NCCL} in "
            "stages.aws-ofi-nccl.configure_flags is not needed."]


def _plugin_flags(manifest: Manifest) -> set[str]:
    plugin = manifest.stages.get(PLUGIN)
    flags = (plugin.get("configure_flags") or []) if plugin else []
    return {str(flag).split("=", 1)[0] for flag in flags}


RULES = (
    Rule(id="plugin-platform-aws", judge=_plugin_platform_aws, data=DATA),
    Rule(id="plugin-disable-tests", judge=_plugin_disable_tests, data=DATA),
    Rule(id="plugin-nccl", judge=_plugin_nccl, data=DATA),
    Rule(id="efa-bundled-plugin", judge=_efa_bundled_plugin, data=DATA),
    Rule(id="plugin-from-efa", judge=_plugin_from_efa, data=DATA),
    Note(judge=_with_nccl_note, data=DATA),
)

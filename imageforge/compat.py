"""Compatibility rules: version combinations that are known not to work.

The facts (version tables, each rule's source and fix hint) are data in manifests/compat.toml;
this module holds one small function per rule. `check` runs them all and returns every
violation, so a manifest is fixed in one pass rather than one error at a time. Rules only judge
versions their data knows: an EFA installer missing from the table is not guessed at.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from imageforge.errors import ManifestError
from imageforge.manifest import Manifest
from imageforge.ncclpin import NcclPin
from imageforge.stage import filename_of

RULES_PATH = Path(__file__).resolve().parent.parent / "manifests" / "compat.toml"

NUMERIC = re.compile(r"\d+(?:\.\d+)*")
CUDA_BASE = re.compile(r"(?:^|/)nvidia/cuda:(\d+)\.(\d+)(?:\.\d+)*-")
SMDDP_PYTORCH = re.compile(r"/pytorch/([^/]+)/cu\d+/")
CPYTHON = re.compile(r"cp(\d)(\d+)")
PLATFORM_AWS = "--enable-platform-aws"
DISABLE_TESTS = "--disable-tests"
WITH_NCCL = "--with-nccl"
PLUGIN = "aws-ofi-nccl"


@dataclasses.dataclass(frozen=True)
class Violation:
    """One broken rule: `key` is the manifest key to change."""

    rule: str
    key: str
    message: str
    source: str
    fix: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rule:
    """A rule's citation and fix hint; its description in compat.toml is for readers."""

    id: str
    source: str
    fix: str

    def violation(self, key: str, message: str, **fix: str) -> Violation:
        return Violation(self.id, key, message, self.source, self.fix.format(**fix))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Floor:
    """A minimum version that holds for a range of aws-ofi-nccl releases."""

    plugin: SpecifierSet
    minimum: Version


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArchSupport:
    since: Version
    until: Version | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shipped:
    """What an SMDDP release was shipped with (the known-good table)."""

    pytorch: str
    cuda: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class EfaInstaller:
    version: str
    libfabric: Version
    bundles_plugin: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Data:
    """manifests/compat.toml, parsed."""

    rules: Mapping[str, Rule]
    efa_libfabric: Mapping[str, Version]
    efa_bundles_plugin_from: Version
    flag_since: Mapping[str, Version]
    with_nccl_unneeded_from: Version
    libfabric_min: Sequence[Floor]
    platform_aws_libfabric_min: Sequence[Floor]
    nccl_min: Sequence[Floor]
    torchvision: Mapping[str, str]
    cuda_arch: Mapping[str, ArchSupport]
    smddp: Mapping[str, Shipped]


def check(manifest: Manifest, *, rules_path: Path = RULES_PATH) -> list[Violation]:
    """Every violated rule of `manifest` (rules needing PyTorch's NCCL pin: `nccl_pin_rule`)."""
    data = _load(rules_path)
    return [found for rule in RULES for found in rule(manifest, data)]


def rule_ids(*, rules_path: Path = RULES_PATH) -> list[str]:
    """The id of every rule, as a manifest names it in [waive]."""
    return list(_load(rules_path).rules)


def nccl_pin_rule(manifest: Manifest, pin: NcclPin | None, *,
                  rules_path: Path = RULES_PATH) -> list[Violation]:
    """An explicit NCCL version that is not the one PyTorch pins (`pin`, when it is known)."""
    nccl = manifest.stages.get("nccl")
    if pin is None or nccl is None:
        return []
    version = str(nccl["version"])
    if version == "auto" or numeric(version) == numeric(pin.version):
        return []
    rule = _load(rules_path).rules["nccl-pytorch-pin"]
    return [rule.violation(
        "stages.nccl.version",
        f"stages.nccl.version {version} differs from NCCL {pin.version}, which "
        f"{_pytorch_name(manifest)} pins ({pin_origin(pin)}).",
        pinned=pin.version, version=version)]


def pin_origin(pin: NcclPin) -> str:
    """Where PyTorch's NCCL pin was read, e.g. "submodule third_party/nccl/nccl at 1a2b3c4d5e6f"."""
    evidence = pin.evidence
    if evidence.get("method") == "submodule":
        return f"submodule {evidence.get('path')} at {pin.commit[:12]}"
    return f"{evidence.get('path')}: {evidence.get('pin')}"


def notes(manifest: Manifest, *, rules_path: Path = RULES_PATH) -> list[str]:
    """Findings worth a line in `invoke check` that are not violations."""
    data = _load(rules_path)
    plugin = stage_version(manifest, PLUGIN)
    if plugin is None or plugin < data.with_nccl_unneeded_from:
        return []
    if WITH_NCCL not in _plugin_flags(manifest):
        return []
    return [f"aws-ofi-nccl {manifest.stages[PLUGIN]['version']} serves every NCCL from one "
            f"build (from {data.with_nccl_unneeded_from}), so {WITH_NCCL} in "
            "stages.aws-ofi-nccl.configure_flags is not needed."]


def known_efa(version: str, *, rules_path: Path = RULES_PATH) -> EfaInstaller | None:
    """What the data knows about an EFA installer release, or None when it knows nothing."""
    data = _load(rules_path)
    libfabric = _bundled_libfabric(data, version)
    parsed = numeric(version)
    if libfabric is None or parsed is None:
        return None
    return EfaInstaller(version=version, libfabric=libfabric,
                        bundles_plugin=parsed >= data.efa_bundles_plugin_from)


def format_violations(violations: Sequence[Violation], *, manifest: Path) -> str:
    """The report `invoke check` prints: one block per violation with its fix and source."""
    if not violations:
        return f"{manifest}: no compatibility problems."
    lines = [f"{manifest}: {len(violations)} compatibility problem(s):"]
    for found in violations:
        lines += [f"  [{found.rule}] {found.key}: {found.message}",
                  f"      fix: {found.fix}.",
                  f"      source: {found.source}"]
    return "\n".join(lines)


def numeric(version: object) -> Version | None:
    """The numeric part of a version ("1.1.3-aws" -> 1.1.3), or None when it has none."""
    match = NUMERIC.match(str(version)) if version is not None else None
    return Version(match.group()) if match else None


def stage_version(manifest: Manifest, stage: str) -> Version | None:
    values = manifest.stages.get(stage)
    return numeric(values.get("version")) if values else None


def image_cuda(manifest: Manifest) -> Version | None:
    """The image's CUDA as major.minor: image.cuda, else the nvidia/cuda base image tag's."""
    declared = numeric(manifest.image.get("cuda"))
    if declared is not None:
        return Version(_minor(declared))
    match = CUDA_BASE.search(str(manifest.image["base"]))
    return Version(f"{match[1]}.{match[2]}") if match else None


# ---- the rules -------------------------------------------------------------------------------


def _plugin_libfabric(manifest: Manifest, data: Data) -> list[Violation]:
    plugin = stage_version(manifest, PLUGIN)
    libfabric = _image_libfabric(manifest, data)
    minimum = _floor(data.libfabric_min, plugin)
    if libfabric is None or minimum is None or libfabric >= minimum:
        return []
    return [data.rules["plugin-libfabric"].violation(
        "stages.efa.version",
        f"EFA installer {manifest.stages['efa']['version']} bundles libfabric {libfabric}, but "
        f"aws-ofi-nccl {manifest.stages[PLUGIN]['version']} needs libfabric >= {minimum}.",
        minimum=str(minimum), installer=_installer_with(data, minimum),
        libfabric=str(libfabric))]


def _plugin_platform_aws(manifest: Manifest, data: Data) -> list[Violation]:
    plugin = stage_version(manifest, PLUGIN)
    if plugin is None or PLATFORM_AWS not in _plugin_flags(manifest):
        return []
    rule = data.rules["plugin-platform-aws"]
    name = manifest.stages[PLUGIN]["version"]
    since = data.flag_since[PLATFORM_AWS]
    if plugin < since:
        return [rule.violation(
            "stages.aws-ofi-nccl.configure_flags",
            f"aws-ofi-nccl {name} has no {PLATFORM_AWS}; the option exists from {since}.",
            action=f"drop {PLATFORM_AWS} from stages.aws-ofi-nccl.configure_flags, or use "
                   f"aws-ofi-nccl {since} or newer")]
    libfabric = _image_libfabric(manifest, data)
    minimum = _floor(data.platform_aws_libfabric_min, plugin)
    if libfabric is None or minimum is None or libfabric >= minimum:
        return []
    general = _floor(data.libfabric_min, plugin)
    if general is not None and libfabric < general:
        return []  # plugin-libfabric already reports this installer
    return [rule.violation(
        "stages.efa.version",
        f"aws-ofi-nccl {name} with {PLATFORM_AWS} needs libfabric >= {minimum}, but EFA "
        f"installer {manifest.stages['efa']['version']} bundles libfabric {libfabric}.",
        action=f"use an EFA installer that bundles libfabric >= {minimum} (e.g. "
               f"{_installer_with(data, minimum)}), or build without {PLATFORM_AWS}")]


def _plugin_disable_tests(manifest: Manifest, data: Data) -> list[Violation]:
    plugin = stage_version(manifest, PLUGIN)
    since = data.flag_since[DISABLE_TESTS]
    if plugin is None or plugin >= since or DISABLE_TESTS not in _plugin_flags(manifest):
        return []
    return [data.rules["plugin-disable-tests"].violation(
        "stages.aws-ofi-nccl.configure_flags",
        f"aws-ofi-nccl {manifest.stages[PLUGIN]['version']} has no {DISABLE_TESTS} (it exists "
        f"from {since}); its configure ignores the flag and still builds the MPI tests.")]


def _plugin_nccl(manifest: Manifest, data: Data) -> list[Violation]:
    nccl = stage_version(manifest, "nccl")
    minimum = _floor(data.nccl_min, stage_version(manifest, PLUGIN))
    if nccl is None or minimum is None or nccl >= minimum:
        return []
    return [data.rules["plugin-nccl"].violation(
        "stages.nccl.version",
        f"aws-ofi-nccl {manifest.stages[PLUGIN]['version']} works with NCCL {minimum} and "
        f"newer, but stages.nccl.version is {manifest.stages['nccl']['version']}.",
        minimum=str(minimum))]


def _efa_bundled_plugin(manifest: Manifest, data: Data) -> list[Violation]:
    efa = stage_version(manifest, "efa")
    plugin = manifest.stages.get(PLUGIN)
    if efa is None or plugin is None or efa < data.efa_bundles_plugin_from:
        return []
    if plugin.get("build_despite_bundled"):
        return []
    return [data.rules["efa-bundled-plugin"].violation(
        "stages.aws-ofi-nccl",
        f"EFA installer {manifest.stages['efa']['version']} already installs aws-ofi-nccl at "
        f"/opt/amazon/ofi-nccl, and [stages.aws-ofi-nccl] would build {plugin['version']} too.",
        plugin=f"aws-ofi-nccl {plugin['version']}")]


def _torchvision_pytorch(manifest: Manifest, data: Data) -> list[Violation]:
    vision = stage_version(manifest, "torchvision")
    torch = stage_version(manifest, "pytorch")
    if vision is None or torch is None:
        return []
    built_for = data.torchvision.get(_minor(vision))
    wanted = {pt: tv for tv, pt in data.torchvision.items()}.get(_minor(torch))
    if built_for == _minor(torch) or (built_for is None and wanted is None):
        return []
    name = manifest.stages["torchvision"]["version"]
    pytorch = manifest.stages["pytorch"]["version"]
    if built_for is not None:
        message = (f"torchvision {name} is built for PyTorch {built_for}, but "
                   f"stages.pytorch.version is {pytorch}.")
    else:
        message = f"torchvision {name} is not the release for PyTorch {pytorch} ({wanted}.x is)."
    action = (f"use torchvision {wanted}.x with PyTorch {_minor(torch)}" if wanted else
              f"use the torchvision release for PyTorch {_minor(torch)}, or PyTorch "
              f"{built_for} with torchvision {name}")
    return [data.rules["torchvision-pytorch"].violation(
        "stages.torchvision.version", message, action=action)]


def _smddp_wheel(manifest: Manifest, data: Data) -> list[Violation]:
    smddp = manifest.stages.get("smddp")
    if smddp is None:
        return []
    rule = data.rules["smddp-wheel"]
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


def _smddp_python(manifest: Manifest, data: Data) -> list[Violation]:
    wheel = _wheel(manifest)
    python = str(manifest.image["python"])
    if wheel is None:
        return []
    pythons = sorted({p for p in (_python_of(tag) for tag in wheel[1]) if p})
    if not pythons or python in pythons:
        return []
    filename = filename_of(str(manifest.stages["smddp"]["url"]))
    return [data.rules["smddp-python"].violation(
        "image.python",
        f"the SMDDP wheel {filename} is for Python {', '.join(pythons)}, but image.python is "
        f"{python}.", python=python, tag=python.replace(".", ""), wheel_python=pythons[0])]


def _smddp_pytorch(manifest: Manifest, data: Data) -> list[Violation]:
    smddp = manifest.stages.get("smddp")
    torch = manifest.stages.get("pytorch")
    if smddp is None or torch is None:
        return []
    segment = SMDDP_PYTORCH.search(str(smddp["url"]))
    shipped = _shipped(data, smddp["version"])
    if segment:
        wanted, where = segment[1], f"its URL's /pytorch/{segment[1]}/ segment"
    elif shipped:
        wanted, where = shipped.pytorch, f"SMDDP {smddp['version']} shipped with it"
    else:
        return []
    if numeric(wanted) == numeric(torch["version"]):
        return []
    return [data.rules["smddp-pytorch"].violation(
        "stages.pytorch.version",
        f"the SMDDP wheel is built for PyTorch {wanted} ({where}), but stages.pytorch.version "
        f"is {torch['version']}.", wanted=wanted, pytorch=str(torch["version"]))]


def _smddp_cuda(manifest: Manifest, data: Data) -> list[Violation]:
    smddp = manifest.stages.get("smddp")
    shipped = _shipped(data, smddp["version"]) if smddp else None
    cuda = image_cuda(manifest)
    if smddp is None or shipped is None or cuda is None or str(cuda) == shipped.cuda:
        return []
    return [data.rules["smddp-cuda"].violation(
        "image.cuda",
        f"SMDDP {smddp['version']} was shipped for CUDA {shipped.cuda}, but the image's CUDA "
        f"is {cuda}.", wanted=shipped.cuda, cuda=str(cuda))]


def _cuda_arch(manifest: Manifest, data: Data) -> list[Violation]:
    cuda = image_cuda(manifest)
    if cuda is None:
        return []
    return [found for key, archs in _arch_lists(manifest) for arch in archs
            for found in _arch_problem(data, cuda, key, arch.split("+")[0])]


def _arch_problem(data: Data, cuda: Version, key: str, arch: str) -> list[Violation]:
    rule = data.rules["cuda-arch"]
    support = data.cuda_arch.get(arch)
    sm = "sm_" + arch.replace(".", "")
    if support is None:
        return [rule.violation(key, f"{arch} in {key} is not a CUDA compute capability.",
                               action=f"use one of {', '.join(data.cuda_arch)}")]
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


def _ptx_arch(manifest: Manifest, data: Data) -> list[Violation]:
    torch = manifest.stages.get("pytorch")
    ptx = torch.get("ptx_arch") if torch else None
    if not ptx:
        return []
    listed = [arch.split("+")[0] for _, archs in _arch_lists(manifest) for arch in archs]
    if str(ptx).split("+")[0] in listed:
        return []
    shown = ", ".join(dict.fromkeys(listed)) or "none"
    return [data.rules["ptx-arch"].violation(
        "stages.pytorch.ptx_arch",
        f"stages.pytorch.ptx_arch {ptx} is not in the arch list ({shown}), so no PTX would be "
        "embedded.", archs=shown, arch=str(ptx))]


def _base_cuda(manifest: Manifest, data: Data) -> list[Violation]:
    base = str(manifest.image["base"])
    match = CUDA_BASE.search(base)
    declared = numeric(manifest.image.get("cuda"))
    if match is None or declared is None:
        return []
    base_cuda = f"{match[1]}.{match[2]}"
    if _minor(declared) == base_cuda:
        return []
    return [data.rules["base-cuda"].violation(
        "image.cuda",
        f"image.base {base} is CUDA {base_cuda}, but image.cuda is {manifest.image['cuda']}.",
        base=base_cuda, cuda=_minor(declared))]


RULES: tuple[Callable[[Manifest, Data], list[Violation]], ...] = (
    _base_cuda, _cuda_arch, _ptx_arch, _plugin_libfabric, _plugin_platform_aws,
    _plugin_disable_tests, _plugin_nccl, _efa_bundled_plugin, _torchvision_pytorch,
    _smddp_wheel, _smddp_python, _smddp_pytorch, _smddp_cuda,
)


# ---- helpers --------------------------------------------------------------------------------


def _minor(version: Version) -> str:
    return f"{version.major}.{version.minor}"


def _floor(floors: Sequence[Floor], plugin: Version | None) -> Version | None:
    if plugin is None:
        return None
    return next((f.minimum for f in floors if f.plugin.contains(plugin)), None)


def _plugin_flags(manifest: Manifest) -> set[str]:
    plugin = manifest.stages.get(PLUGIN)
    flags = (plugin.get("configure_flags") or []) if plugin else []
    return {str(flag).split("=", 1)[0] for flag in flags}


def _bundled_libfabric(data: Data, version: object) -> Version | None:
    parsed = numeric(version)
    if parsed is None:
        return None
    return data.efa_libfabric.get(str(parsed)) or data.efa_libfabric.get(_minor(parsed))


def _image_libfabric(manifest: Manifest, data: Data) -> Version | None:
    efa = manifest.stages.get("efa")
    return _bundled_libfabric(data, efa.get("version")) if efa else None


def _installer_with(data: Data, minimum: Version) -> str:
    """The oldest EFA installer the data knows that bundles libfabric >= `minimum`."""
    fitting = [k for k, libfabric in data.efa_libfabric.items() if libfabric >= minimum]
    if not fitting:
        return "a newer installer"
    oldest = min(fitting, key=Version)
    return f"EFA {oldest}" if oldest.count(".") == 2 else f"EFA {oldest}.x"


def _arch_lists(manifest: Manifest) -> list[tuple[str, Sequence[str]]]:
    lists: list[tuple[str, Sequence[str]]] = [("image.cuda_arch", manifest.image["cuda_arch"])]
    torch = manifest.stages.get("pytorch")
    if torch:
        lists.append(("stages.pytorch.extra_cuda_arch", torch.get("extra_cuda_arch") or []))
    return lists


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


def _shipped(data: Data, version: object) -> Shipped | None:
    parsed = numeric(version)
    return data.smddp.get(str(parsed)) if parsed is not None else None


def _pytorch_name(manifest: Manifest) -> str:
    torch = manifest.stages.get("pytorch")
    return f"PyTorch {torch['version']}" if torch else "PyTorch"


# ---- loading the data -----------------------------------------------------------------------


@functools.cache
def _load(path: Path) -> Data:
    try:
        return _parse(tomllib.loads(path.read_text(encoding="utf-8")))
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"{path}: unusable compatibility data ({type(exc).__name__}: {exc}); "
                            "fix that entry or restore the file from git.") from None


def _parse(raw: Mapping[str, Any]) -> Data:
    plugin = raw["aws-ofi-nccl"]
    return Data(
        rules={rid: Rule(id=rid, source=str(r["source"]), fix=str(r["fix"]))
               for rid, r in raw["rules"].items()},
        efa_libfabric={str(k): Version(v) for k, v in raw["efa"]["libfabric"].items()},
        efa_bundles_plugin_from=Version(raw["efa"]["bundles_plugin_from"]),
        flag_since={flag: Version(v) for flag, v in plugin["flag_since"].items()},
        with_nccl_unneeded_from=Version(plugin["with_nccl_unneeded_from"]),
        libfabric_min=_floors(plugin["libfabric_min"]),
        platform_aws_libfabric_min=_floors(plugin["platform_aws_libfabric_min"]),
        nccl_min=_floors(plugin["nccl_min"]),
        torchvision={str(k): str(v) for k, v in raw["torchvision"].items()},
        cuda_arch={str(arch): ArchSupport(since=Version(s["since"]),
                                          until=Version(s["until"]) if "until" in s else None)
                   for arch, s in raw["cuda_arch"].items()},
        smddp={str(row["smddp"]): Shipped(pytorch=str(row["pytorch"]), cuda=str(row["cuda"]))
               for row in raw["known_good"]},
    )


def _floors(rows: Sequence[Mapping[str, str]]) -> list[Floor]:
    return [Floor(plugin=SpecifierSet(row["plugin"]), minimum=Version(row["minimum"]))
            for row in rows]

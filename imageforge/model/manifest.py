"""Load, override and validate a manifest: a TOML file pinning one image configuration.

Every error names the file, the dotted key (and its line when it can be found), says what
is allowed and suggests the closest known key for a typo.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from imageforge.errors import ManifestError
from imageforge.model import inherit, tomlfile
from imageforge.model.stage import Field, Stage
from imageforge.model.validate import ALLOWED, problem
from imageforge.textsafe import escaped, redact_urls, shown

IMAGE_FIELDS: dict[str, Field] = {
    "name": Field(kind="name", help="image repository name used for tags"),
    "base": Field(kind="image", help="base image reference (required unless extends)"),
    "extends": Field(kind="image", help="a prebuilt image to build on instead of base: only "
                                        "the stages it lacks are built"),
    "provides": Field(kind="names", help="stages the extends image already has (default: "
                                         "read from its labels by `invoke lock`)"),
    "base_digest": Field(kind="digest", locked=True, help="base image digest (lock)"),
    "base_image_id": Field(kind="digest", locked=True,
                           help="local image ID of an extended image no registry has (lock)"),
    "platform": Field(kind="text", default="linux/amd64",
                      choices=("linux/amd64", "linux/arm64"), help="target platform"),
    "cuda": Field(kind="cuda", help="CUDA version of the base image, e.g. 11.3"),
    "cuda_home": Field(kind="path", default="/usr/local/cuda", help="CUDA toolkit root"),
    "cuda_arch": Field(kind="arch_list", required=True,
                       help="GPU archs: NVCC_GENCODE and TORCH_CUDA_ARCH_LIST come from it"),
    "python": Field(kind="python", required=True, help="Python major.minor, e.g. 3.8"),
    "apt": Field(kind="bool", default=True,
                 help="install stages' apt packages (false when the base image has them)"),
}

# `[waive] <rule id> = "<reason>"`: the one way a manifest accepts a known incompatibility.
WAIVER_FIELD = Field(kind="text", help="why the manifest accepts a violation of this rule")
_RULE_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
TOP_LEVEL = ("image", "stages", "waive")  # and `inherit`, read before validation

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
# Up to the 4300 digits int() reads (sys.int_info.default_max_str_digits); validation says
# what a key allows.
_WHOLE_NUMBER = re.compile(r"[0-9]{1,4300}")
_TEMPLATED = ("url", "repo", "ref", "build_version")
# Pins of a stage's version-templated source: they belong to one version only.
_VERSION_PINS = ("sha256", "commit")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Manifest:
    """A validated manifest with defaults filled in and templates substituted."""

    path: Path
    image: Mapping[str, Any]
    stages: Mapping[str, Mapping[str, Any]]
    # The effective document (file + overrides) before defaults, for the manifest digest.
    document: Mapping[str, Any]

    # Stage tables the lock has nothing to resolve for (the user's code): outside the digest,
    # so editing them never makes the lock stale.
    unlocked: frozenset[str] = frozenset()
    # [waive]: rule id -> the reason the manifest accepts that rule's violations.
    waivers: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def digest(self) -> str:
        # A waiver changes what is accepted, never what is resolved: it leaves the lock current.
        document = {k: v for k, v in self.document.items() if k != "waive"}
        stages = document.get("stages")
        if isinstance(stages, dict) and self.unlocked & set(stages):
            document["stages"] = {k: v for k, v in stages.items() if k not in self.unlocked}
        canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()

    def has_stage(self, name: str) -> bool:
        return name in self.stages


def load(path: Path, overrides: Sequence[str] = (), *, registry: Mapping[str, Stage]) -> Manifest:
    """Read `path`, apply `--set K=V` overrides, validate everything, fill defaults."""
    document, where, _ = _effective(path, overrides, registry)
    return _validate(document, where, registry)


def _effective(path: Path, overrides: Sequence[str], registry: Mapping[str, Stage]
               ) -> tuple[dict[str, Any], _Locator, inherit.Effective]:
    """The document as read (inherited tables merged, --set applied, not yet validated) and
    where each value comes from."""
    text = _read(path)
    try:
        document = tomlfile.parse(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{escaped(str(path), None)}: invalid TOML: {exc}; fix the syntax "
                            "there.") from None
    effective = inherit.read(path, text, document)
    where = _Locator(path, text, {}, effective.origins)
    for override in overrides:
        dotted = _apply_override(effective.document, override, registry)
        where.overrides[dotted] = _shown_override(override)
    return effective.document, where, effective


def refuse_moved_pins(path: Path, overrides: Sequence[str], *,
                      registry: Mapping[str, Stage]) -> None:
    """For the commands that fetch (build, fetch): refuse a --set of a version that moves a
    source (a url, repo or ref naming `{version}`) away from the sha256 or commit the manifest
    file pins for it. The download would fail as a checksum mismatch blamed on upstream, or git
    would check out the old commit. A new url or ref alone may be a mirror of the same bytes or
    another name of the same commit; commands that download nothing (check, plan, render)
    still show such a manifest."""
    document, where, _ = _effective(path, overrides, registry)
    for name, table in document.get("stages", {}).items():
        stage = registry.get(name)
        if stage is None or not isinstance(table, dict):
            continue
        for key, field in stage.fields.items():
            pin = field.locates
            if not pin or f"stages.{name}.{pin}" in where.overrides or table.get(pin) is None:
                continue
            location = table.get(key, field.default)
            if "{version" in str(location) and f"stages.{name}.version" in where.overrides:
                given = where.overrides[f"stages.{name}.version"]
                raise ManifestError(
                    f"--set {given} moves stages.{name}.{key}, but {where(f'stages.{name}.{pin}')}"
                    f" pins the {pin} of the old one; also --set stages.{name}.{pin}=<the new "
                    f"{'file' if pin == 'sha256' else 'ref'}'s {pin}>, or remove that pin "
                    "from the manifest and run `invoke lock`.")


def show(path: Path, overrides: Sequence[str] = (), *,
         registry: Mapping[str, Stage]) -> str:
    """The effective manifest (inherited tables merged, --set applied) as TOML, each value
    with the file and line (or the --set) it comes from. Validated first."""
    # Read once, as load reads it: a manifest piped in (--manifest /dev/stdin) has no second
    # reading.
    document, where, effective = _effective(path, overrides, registry)
    _validate(copy.deepcopy(document), where, registry)

    def origin_of(dotted: str) -> str:
        if dotted in where.overrides:
            return f"--set {where.overrides[dotted]}"
        origin = effective.origins.get(dotted)
        file = _Locator(origin.path, origin.text, {}) if origin else where
        line = file._line(dotted)
        shown_path = escaped(str(file.path), None)
        return f"{shown_path}:{line}" if line else shown_path

    chain = " -> ".join(escaped(str(p), None) for p in effective.chain)
    lines = [f"# effective manifest: {chain}"]
    waive = document.get("waive", {})
    tables = [("image", document.get("image", {}))]
    tables += [(f"stages.{name}", table) for name, table in document.get("stages", {}).items()]
    tables += [("waive", waive)] if waive else []
    for name, table in tables:
        lines += ["", f"[{name}]"]
        for key, value in table.items():
            # Shown, not built from: a password in a URL stays out of the terminal here too.
            assignment = f"{key} = {redact_urls(json.dumps(value))}"
            lines.append(f"{assignment:<48} # {origin_of(f'{name}.{key}')}")
    return "\n".join(lines)


def template(manifest: Manifest, stage: Stage, key: str) -> Any:
    """stages.<name>.<key> as written (or defaulted), before `{version}` is substituted."""
    table = manifest.document.get("stages", {}).get(stage.name, {})
    return table.get(key, stage.fields[key].default)


def with_versions(manifest: Manifest, versions: Mapping[str, str], *,
                  registry: Mapping[str, Stage]) -> Manifest:
    """`manifest` with some stages moved to other versions (what `lock --upgrade` chose).

    Templates are filled in anew and the manifest's pins of the old version are dropped, for
    the lock to supply. The digest stays that of the file + overrides: the lock belongs to it.
    """
    if not versions:
        return manifest
    document = copy.deepcopy(dict(manifest.document))
    for name, version in versions.items():
        table = document.setdefault("stages", {}).setdefault(name, {})
        table["version"] = version
        for key in _VERSION_PINS:
            table.pop(key, None)
    moved = _validate(document, _Locator(manifest.path, "", {}), registry)
    return dataclasses.replace(moved, document=manifest.document)


def _read(path: Path) -> str:
    try:
        return tomlfile.read_text(path, what="manifest")
    except FileNotFoundError:
        raise ManifestError(
            f"{escaped(str(path), None)}: no such manifest; pass --manifest with one of "
            "manifests/*.toml.") from None


@dataclasses.dataclass(frozen=True)
class _Locator:
    """Finds the line of a dotted key in the manifest text, for error messages."""

    path: Path
    text: str
    # dotted key -> the --set that gave it its value; errors about it name the --set.
    overrides: dict[str, str]
    # dotted key -> the inherited manifest that set it (inherit = "..."); errors name that file.
    origins: dict[str, inherit.Origin] = dataclasses.field(default_factory=dict)

    def __call__(self, dotted: str) -> str:
        # The file's path and its keys (a quoted TOML key may hold any character) as text
        # safe to print; the overrides are kept that way already.
        path, key = escaped(str(self.path), None), escaped(dotted)
        if dotted in self.overrides:
            return f"--set {self.overrides[dotted]} (over {path})"
        origin = self.origins.get(dotted)
        if origin is not None and origin.path.resolve() != self.path.resolve():
            other = _Locator(origin.path, origin.text, {})
            return other(dotted) + f" (inherited by {path})"
        line = self._line(dotted)
        made_by = [o for k, o in self.overrides.items() if k.startswith(dotted + ".")]
        if line is None and made_by:
            # A table the file does not have, created by an override.
            return f"--set {made_by[0]} (over {path}): {key}"
        return f"{path}: {key}" + (f" (line {line})" if line else "")

    def _line(self, dotted: str) -> int | None:
        parts = dotted.split(".")
        table, key = (parts[:-1], parts[-1]) if len(parts) > 1 else ([], parts[0])
        current: list[str] = []
        headers = {".".join(parts): None}
        for number, raw in enumerate(self.text.splitlines(), start=1):
            line = raw.strip()
            header = re.fullmatch(r"\[\s*([^\[\]]+?)\s*\]", line)
            if header:
                current = [p.strip().strip('"') for p in header.group(1).split(".")]
                if ".".join(current) in headers:
                    return number
                continue
            assignment = re.match(r'"?([A-Za-z0-9_-]+)"?\s*=', line)
            if assignment and current == table and assignment.group(1) == key:
                return number
        return None


def _suggest(word: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


def _shown_override(override: str) -> str:
    """A `--set KEY=VALUE` as messages show it: key and value each escaped and cut short."""
    key, sep, value = override.partition("=")
    return escaped(key) + sep + escaped(value)


def _override_error(override: str, why: str) -> ManifestError:
    return ManifestError(f"--set {_shown_override(override)}: {why}")


def _apply_override(document: dict[str, Any], override: str, registry: Mapping[str, Stage]) -> str:
    """Set the value `override` names in `document`; returns its dotted key."""
    key, sep, raw = override.partition("=")
    parts = key.strip().split(".")
    if not sep or not key.strip():
        raise _override_error(override, "expected KEY=VALUE, e.g. stages.nccl.version=2.18.6.")
    field = _field_for(parts, registry, lambda why: _override_error(override, why))
    value = _parse_override_value(raw, field, lambda why: _override_error(override, why))
    target = document
    for part in parts[:-1]:
        node = target.setdefault(part, {})
        if not isinstance(node, dict):
            raise _override_error(override, f"{part} is not a table in the manifest.")
        target = node
    target[parts[-1]] = value
    return ".".join(parts)


def _field_for(parts: Sequence[str], registry: Mapping[str, Stage], fail: Any) -> Field:
    """The Field a dotted key names (image.X or stages.S.X); `fail(why)` builds the error."""
    if len(parts) == 2 and parts[0] == "image":
        if parts[1] in IMAGE_FIELDS:
            return IMAGE_FIELDS[parts[1]]
        raise fail(f"unknown key; {_suggest(parts[1], list(IMAGE_FIELDS))}"
                   f"image keys are: {', '.join(IMAGE_FIELDS)}.")
    if len(parts) == 2 and parts[0] == "waive":
        return WAIVER_FIELD
    if len(parts) == 3 and parts[0] == "stages":
        stage = registry.get(parts[1])
        if stage is None:
            raise fail(f"unknown stage {shown(parts[1])}; {_suggest(parts[1], list(registry))}"
                       f"stages are: {', '.join(registry)}.")
        if parts[2] in stage.fields:
            return stage.fields[parts[2]]
        raise fail(f"unknown key; {_suggest(parts[2], list(stage.fields))}"
                   f"keys of stages.{parts[1]} are: {', '.join(stage.fields) or 'none'}.")
    raise fail("keys look like image.<key>, stages.<stage>.<key> or waive.<rule id>.")


def _parse_override_value(raw: str, field: Field, fail: Any) -> Any:
    raw = raw.strip()
    if field.kind == "bool":
        if raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise fail(f"expected {ALLOWED['bool']}.")
    if field.kind in ("int", "jobs"):
        # ASCII digits, not str.isdigit: int() refuses '²'.
        if _WHOLE_NUMBER.fullmatch(raw):
            return int(raw)
        raise fail(f"expected {ALLOWED[field.kind]}.")
    if field.kind in ("arch_list", "packages", "flags", "args", "names"):
        if raw.startswith("["):
            try:
                return tomlfile.parse(f"v = {raw}")["v"]
            except tomllib.TOMLDecodeError:
                raise fail(f"not a valid list; expected {ALLOWED[field.kind]}.") from None
        return [item.strip() for item in raw.split(",") if item.strip()]
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        raw = raw[1:-1]
    return raw


def _validate(document: dict[str, Any], where: _Locator, registry: Mapping[str, Stage]) -> Manifest:
    unknown = sorted(set(document) - set(TOP_LEVEL))
    if unknown:
        raise ManifestError(f"{where(unknown[0])}: unknown top-level key; "
                            f"{_suggest(unknown[0], TOP_LEVEL)}"
                            "a manifest has only `inherit`, [image], [stages.<name>] and [waive] "
                            "tables.")
    image = _validate_table(document.get("image"), "image", IMAGE_FIELDS, where)
    raw_stages = document.get("stages", {})
    if not isinstance(raw_stages, dict):
        raise ManifestError(f"{where('stages')}: expected [stages.<name>] tables.")
    stages: dict[str, Mapping[str, Any]] = {}
    for name, table in raw_stages.items():
        stage = registry.get(name)
        if stage is None:
            raise ManifestError(f"{where('stages.' + name)}: unknown stage; "
                                f"{_suggest(name, list(registry))}"
                                f"stages are: {', '.join(registry)}.")
        values = _validate_table(table, f"stages.{name}", stage.fields, where)
        stages[name] = _substitute(values, f"stages.{name}", stage.fields, where)
    _check_same_as(image, stages, registry, where)
    _check_base(image, where)
    unlocked = frozenset(name for name, stage in registry.items() if not stage.locked)
    return Manifest(path=where.path, image=image, stages=stages, document=document,
                    unlocked=unlocked, waivers=_waivers(document.get("waive"), where))


def _waivers(table: Any, where: _Locator) -> dict[str, str]:
    """[waive]: which rule ids are known is compat's business; here only the shape."""
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ManifestError(f"{where('waive')}: expected a table [waive] of "
                            '<rule id> = "<reason>".')
    for rule, reason in table.items():
        dotted = f"waive.{rule}"
        if not _RULE_ID.fullmatch(rule):
            raise ManifestError(f"{where(dotted)}: {shown(rule)} is not a rule id; use the id in "
                                "brackets that `invoke check` prints, e.g. torchvision-pytorch.")
        if not isinstance(reason, str) or not reason.strip():
            raise ManifestError(f"{where(dotted)}: a waiver needs its reason; write "
                                f'{rule} = "<why this combination is accepted>".')
        _checked(reason, WAIVER_FIELD, dotted, where)
    return dict(table)


def _check_base(image: dict[str, Any], where: _Locator) -> None:
    """`extends` is the base of every stage; exactly one of the two names it."""
    if image.get("extends") and image.get("base"):
        raise ManifestError(f"{where('image.extends')}: set image.base or image.extends, "
                            "not both (stages build FROM the extended image).")
    if image.get("extends"):
        image["base"] = image["extends"]
    elif not image.get("base"):
        raise ManifestError(f"{where('image')}: missing required key 'base' (base image "
                            "reference); add `base = ...` (or `extends = ...`) to [image].")
    elif image.get("provides") is not None:
        raise ManifestError(f"{where('image.provides')}: only an image that extends another "
                            "provides stages; add image.extends or drop image.provides.")


def _validate_table(table: Any, dotted: str, fields: Mapping[str, Field], where: _Locator
                    ) -> dict[str, Any]:
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise ManifestError(f"{where(dotted)}: expected a table [{dotted}].")
    for key in table:
        if key not in fields:
            raise ManifestError(
                f"{where(f'{dotted}.{key}')}: unknown key; {_suggest(key, list(fields))}"
                f"keys of [{dotted}] are: {', '.join(fields) or 'none'}.")
    values: dict[str, Any] = {}
    for key, field in fields.items():
        if key not in table:
            if field.required:
                raise ManifestError(f"{where(dotted)}: missing required key {key!r} "
                                    f"({field.help}); add `{key} = ...` to [{dotted}].")
            values[key] = field.default
            continue
        values[key] = _checked(table[key], field, f"{dotted}.{key}", where)
    return values


def _checked(value: Any, field: Field, dotted: str, where: _Locator) -> Any:
    if field.choices:
        if value in field.choices:
            return value
        raise ManifestError(f"{where(dotted)}: {shown(value)} is not allowed; "
                            f"choose one of {', '.join(field.choices)}.")
    if isinstance(value, str) and value in field.literals:
        return value
    # Templates are checked after substitution, where the placeholders are known.
    probe = _PLACEHOLDER.sub("x", value) if isinstance(value, str) else value
    why = problem(field.kind, probe)
    if why:
        also = f" (or {', '.join(map(repr, field.literals))})" if field.literals else ""
        raise ManifestError(f"{where(dotted)}: {why}{also}.")
    return value


def _substitute(values: dict[str, Any], dotted: str, fields: Mapping[str, Field],
                where: _Locator) -> dict[str, Any]:
    """Fill `{version}` and `{version_underscored}` into URL, repo and ref templates."""
    version = str(values.get("version") or "")
    names = {"version": version, "version_underscored": version.replace(".", "_")}
    out = dict(values)
    for key in _TEMPLATED:
        value = values.get(key)
        if not isinstance(value, str):
            continue
        unknown = [m for m in _PLACEHOLDER.findall(value) if m not in names]
        if unknown:
            raise ManifestError(f"{where(f'{dotted}.{key}')}: unknown placeholder "
                                f"{{{unknown[0]}}}; use {{version}} or {{version_underscored}}.")
        out[key] = _PLACEHOLDER.sub(lambda m: names[m.group(1)], value)
        why = problem(fields[key].kind, out[key])
        if why:
            raise ManifestError(f"{where(f'{dotted}.{key}')}: after substitution, {why}.")
    return out


def _check_same_as(image: Mapping[str, Any], stages: dict[str, Mapping[str, Any]],
                   registry: Mapping[str, Stage], where: _Locator) -> None:
    """Fields that must equal an [image] key (Field.same_as) get its value when not given."""
    for name, table in list(stages.items()):
        for key, field in registry[name].fields.items():
            if not field.same_as:
                continue
            value = table.get(key) or image[field.same_as]
            if value != image[field.same_as]:
                raise ManifestError(f"{where(f'stages.{name}.{key}')}: {shown(value)} differs "
                                    f"from image.{field.same_as} {shown(image[field.same_as])}; "
                                    "make them equal.")
            stages[name] = {**stages[name], key: value}


def manifest_label(path: Path) -> str:
    """The manifest path as written in reports: relative to the project when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)

"""Hostile manifest values and --set overrides: never a traceback, every refusal names the
key, and nothing accepted can add a Dockerfile instruction or a shell command."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from imageforge.app.project import dockerfile
from imageforge.errors import FatalError, ManifestError
from imageforge.model.manifest import IMAGE_FIELDS, WAIVER_FIELD, Manifest, load
from imageforge.planning.plan import make_plan
from stages import STAGES
from tests.dockerfile_shape import ParseError, parse

ROOT = Path(__file__).resolve().parents[2]
SMDDP = ROOT / "manifests/smddp.toml"
KEYS = [f"image.{k}" for k in IMAGE_FIELDS] + [
    f"stages.{name}.{key}" for name, stage in STAGES.items() for key in stage.fields]
NASTY = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["1.0; curl x | sh", "1.0\nRUN evil", "$(id)", "`id`", "-rf", "--help",
                     "a' b", 'a" b', "${PATH}", "\\", "../../etc", "[\"x\", 1]", "true",
                     "1.0\r\nRUN x", "v1 && rm -rf /", "x\x00y", "1.0\rRUN x",
                     "x\nEOF\nRUN evil", "x\n\nRUN evil", "x\u2028RUN evil"]),
)
TEXT_KEYS = [f"image.{k}" for k, f in IMAGE_FIELDS.items() if f.kind == "text"] + [
    f"stages.{name}.{key}" for name, stage in STAGES.items()
    for key, f in stage.fields.items() if f.kind == "text"] + ["waive.smddp-cuda"]
# Inside the value: --set strips a value's ends, so a break there is no break.
LINE_BREAKS = ["a\nRUN evil", "a\rRUN evil", "a\r\nRUN evil", "a\nEOF\nRUN evil",
               "a\n\nENTRYPOINT x"]


def instructions(loaded: Manifest) -> list[str]:
    """The instruction keywords of the smddp Dockerfile, in order."""
    return [ins.keyword for ins in parse(dockerfile(make_plan(loaded, "smddp", STAGES)))]


BASELINE = instructions(load(SMDDP, (), registry=STAGES))


def twin(value: str) -> str:
    """The value with everything but letters, digits, whitespace and commas made an 'x', and
    every whitespace character a space: the same number of list items (a list value is split
    at any whitespace, "\x1f" included), no line break, nothing a shell or Dockerfile reads."""
    return "".join(" " if c.isspace() else
                   c if (c.isascii() and c.isalnum()) or c == "," else "x" for c in value)


def twin_instructions(key: str, value: str) -> list[str] | None:
    try:
        return instructions(load(SMDDP, (f"{key}={twin(value)}",), registry=STAGES))
    except FatalError:
        return None


def test_every_text_field_is_known() -> None:
    assert WAIVER_FIELD.kind == "text"
    assert {"image.platform", "stages.pytorch.nvcc_flags"} <= set(TEXT_KEYS)


@pytest.mark.parametrize("value", LINE_BREAKS)
@pytest.mark.parametrize("key", TEXT_KEYS)
def test_a_line_break_in_any_text_field_is_refused_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ManifestError) as refused:
        load(SMDDP, (f"{key}={value}",), registry=STAGES)
    assert key in str(refused.value)


@pytest.mark.parametrize("value", ["linux/amd64\\nRUN evil", "linux/amd64\\rRUN evil"])
def test_a_line_break_written_in_the_file_is_refused_too(tmp_path: Path, value: str) -> None:
    manifest = tmp_path / "smddp.toml"
    manifest.write_text(SMDDP.read_text().replace("[image]\n", f'[image]\nplatform = "{value}"\n',
                                                  1))
    with pytest.raises(ManifestError, match=r"image\.platform"):
        load(manifest, (), registry=STAGES)


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(KEYS), value=NASTY)
# Found by hypothesis: a lone unit separator is whitespace, so the list is empty and the
# stage drops its install step, which the twin must do too.
@example(key="stages.pytorch.build_packages", value="\x1f")
def test_any_set_value_is_accepted_safely_or_refused_naming_the_key(key: str,
                                                                    value: str) -> None:
    refused: ManifestError | None = None
    try:
        loaded = load(SMDDP, (f"{key}={value}",), registry=STAGES)
    except ManifestError as exc:
        refused = exc
    if refused is not None:
        assert key in str(refused) or "expected KEY=VALUE" in str(refused)
        return
    try:
        plan = make_plan(loaded, "smddp", STAGES)
    except FatalError:
        return
    # An accepted value may change words inside an instruction, never the instructions: the
    # Dockerfile has the instructions, in order, that it has without the value or with its
    # harmless twin (a field that is set or emptied may add or drop its own step).
    try:
        shape = instructions(loaded)
    except ParseError as exc:
        raise AssertionError(f"{key}={value!r} broke the Dockerfile: {exc}") from None
    assert shape in (BASELINE, twin_instructions(key, value)), (key, value)
    for stage in plan.stages:
        assert "\r" not in stage.recipe
        assert "\x00" not in stage.recipe

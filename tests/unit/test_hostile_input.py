"""Hostile manifest values and --set overrides: never a traceback, every refusal names the
key, and nothing accepted can add a Dockerfile instruction or a shell command."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from imageforge.errors import FatalError, ManifestError
from imageforge.manifest import IMAGE_FIELDS, load
from imageforge.plan import make_plan
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
SMDDP = ROOT / "manifests/smddp.toml"
KEYS = [f"image.{k}" for k in IMAGE_FIELDS] + [
    f"stages.{name}.{key}" for name, stage in STAGES.items() for key in stage.fields]
NASTY = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["1.0; curl x | sh", "1.0\nRUN evil", "$(id)", "`id`", "-rf", "--help",
                     "a' b", 'a" b', "${PATH}", "\\", "../../etc", "[\"x\", 1]", "true",
                     "1.0\r\nRUN x", "v1 && rm -rf /", "x\x00y"]),
)


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(KEYS), value=NASTY)
def test_any_set_value_is_accepted_safely_or_refused_naming_the_key(key: str,
                                                                    value: str) -> None:
    try:
        loaded = load(SMDDP, (f"{key}={value}",), registry=STAGES)
    except ManifestError as exc:
        assert key in str(exc) or "expected KEY=VALUE" in str(exc)
        return
    try:
        plan = make_plan(loaded, "smddp", STAGES)
    except FatalError:
        return
    for stage in plan.stages:
        # A heredoc's body is a file's text, not instructions: its end marker closes it.
        ending = None
        for line in stage.recipe.splitlines():
            if ending is not None:
                ending = None if line == ending else ending
                continue
            if "<<'EOF'" in line:
                ending = "EOF"
            first = line.split(" ", 1)[0]
            # Every line is an instruction we wrote or a continuation of one.
            assert first in ("FROM", "RUN", "COPY", "ENV", "ENTRYPOINT", "") \
                or line.startswith("    "), line
        assert "\r" not in stage.recipe and "\x00" not in stage.recipe

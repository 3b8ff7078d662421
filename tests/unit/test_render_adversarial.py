"""Adversarial rendering: every stage of every manifest, rendered with hostile values that
validation accepts on each string and list field, has the Dockerfile shape of a harmless
twin value (tests/dockerfile_shape.py): no value adds an instruction, a shell command, a
word, a redirection or a substitution."""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from imageforge.app.project import dockerfile
from imageforge.errors import FatalError
from imageforge.model import validate
from imageforge.model.inputs import defined_targets
from imageforge.model.manifest import IMAGE_FIELDS, load
from imageforge.model.stage import Field
from imageforge.planning.plan import make_plan
from stages import STAGES
from tests.dockerfile_shape import ParseError, parse, shape, shell_shape

ROOT = Path(__file__).resolve().parents[2]
CODE = Path(__file__).resolve().parent / "data" / "train"
# The code stage joins the images whose manifests build smddp, so every stage is rendered.
WITH_CODE = (f"stages.code.dir={CODE}", "stages.code.program=train.py")
MANIFESTS: dict[str, tuple[str, ...]] = {
    "smddp.toml": WITH_CODE,
    "pt25-cu124.toml": WITH_CODE,
    "efa-nccl.toml": (),
    # "auto" needs the lock, which an override makes stale: pin what the lock says.
    "sample.toml": (*WITH_CODE, "stages.nccl.version=2.10.3"),
}
# What sh reads specially outside quotes, and the line breaks that end a Dockerfile
# instruction inside quotes too; a twin has none of it.
SPECIAL = set(" \t\n\r\v\f;&|()<>$`'\"\\*?[]#~{}!")
# Values that reach no Dockerfile text at all (a build context path).
NOT_RENDERED = {"host_path"}
# Hostile values that validation accepts, by kind (and, for text, the line breaks it must
# refuse: accepted, they would end an instruction); the generated ones come on top.
NASTY: dict[str, list[Any]] = {
    "url": ["https://h/a;b&c(d)*e!f#g?x=[1]", "file:///x/{version}&y=(z)", "a/b{c}d@e"],
    "repo": ["https://h/r.git#;(x)", "file://h/!*?", "sub/dir@{version}"],
    "ref": ["v{version}+x-1", "a/b_c.d"],
    "path": ["/a+b-c.d/", "/"],
    "version": ["1.0+x-y_z", "auto"],
    "text": ["a; b | c > d < e & f (g) {h} #i *j ?k ~l !m", " lead and trail ", "a&&b||c",
             "a\nRUN evil", "a\rRUN evil", "a\r\nRUN evil", "a\nEOF\nRUN evil"],
    "packages": [["a>=1,<2", "b[x,y]~=1.0", "c!=2", "ch::d<=3", "e==1.*"], []],
    "flags": [["--a=b,c:d", "-x", "--y=/p/q+r"]],
    "args": [["k=v,w:x", "--f=/a", "-g"]],
    "arch_list": [["7.0+PTX", "9.0"], []],
    "names": [["efa", "nccl"]],
}


def keys(manifest: str) -> list[tuple[str, Field]]:
    """(dotted key, field) for every string and list field of the stages `manifest` builds."""
    loaded = load(ROOT / "manifests" / manifest, MANIFESTS[manifest], registry=STAGES)
    names = {s.name for t in defined_targets(loaded, STAGES)
             for s in make_plan(loaded, t, STAGES).stages}
    fields = [(f"image.{k}", f) for k, f in IMAGE_FIELDS.items()]
    fields += [(f"stages.{n}.{k}", f) for n in sorted(names) for k, f in STAGES[n].fields.items()]
    return [(key, f) for key, f in fields if f.kind not in ("bool", "int", "jobs", *NOT_RENDERED)]


CASES = [(m, key, f) for m in MANIFESTS for key, f in keys(m)]


def values(field: Field) -> st.SearchStrategy[Any]:
    if field.choices:
        return st.sampled_from(field.choices)
    item = strings(field.kind)
    if field.kind in ("packages", "flags", "args", "arch_list", "names"):
        generated: st.SearchStrategy[Any] = st.lists(item, max_size=4)
    else:
        generated = item
    literals = [*field.literals, *NASTY.get(field.kind, [])]
    return st.one_of(st.sampled_from(literals), generated) if literals else generated


def strings(kind: str) -> st.SearchStrategy[str]:
    patterns = {"version": "_VERSION", "url": "_URL", "repo": "_URL", "ref": "_REF",
                "sha256": "_SHA256", "commit": "_COMMIT", "digest": "_DIGEST",
                "path": "_ABS_PATH", "image": "_IMAGE", "arch": "_ARCH", "name": "_NAME",
                "fingerprint": "_FINGERPRINT", "entry_point": "_ENTRY_POINT",
                "file_name": "_FILE_NAME", "packages": "_PACKAGE", "flags": "_FLAG",
                "args": "_ARG", "arch_list": "_ARCH", "names": "_NAME", "cuda": "_CUDA",
                "python": "_PYTHON"}
    if kind == "text":
        return st.text(alphabet=string.printable, max_size=30)
    if kind == "specifier":
        return st.from_regex(r"(~=|==|>=|<=|!=|<|>)[0-9]{1,2}(\.[0-9]{1,2}){0,2}(,<[0-9])?",
                             fullmatch=True)
    pattern: re.Pattern[str] = getattr(validate, patterns[kind])
    return st.from_regex(pattern, fullmatch=True)


def twin(value: Any) -> Any:
    """The value with everything sh treats specially made a plain letter."""
    if isinstance(value, list):
        return [twin(v) for v in value]
    return "".join("x" if c in SPECIAL else c for c in value)


def override(key: str, value: Any) -> str:
    if isinstance(value, list):
        return f"{key}=[{', '.join(json.dumps(v) for v in value)}]"
    return f"{key}={value}"


def render(manifest: str, key: str, value: Any) -> list[str] | None:
    """Every target's Dockerfile, or None when the value is refused."""
    try:
        loaded = load(ROOT / "manifests" / manifest, (*MANIFESTS[manifest], override(key, value)),
                      registry=STAGES)
        plans = [make_plan(loaded, t, STAGES) for t in defined_targets(loaded, STAGES)]
    except FatalError:
        return None
    # A target whose stages another target also renders adds nothing (smddp under code).
    names = [{s.name for s in p.stages} for p in plans]
    return [dockerfile(p) for p, own in zip(plans, names, strict=True)
            if not any(own < other for other in names)]


def same_shape(manifest: str, key: str, value: Any) -> bool | None:
    """Whether `value` renders to the shape its twin renders to; None when either is
    refused."""
    hostile = render(manifest, key, value)
    harmless = render(manifest, key, twin(value)) if hostile is not None else None
    if hostile is None or harmless is None:
        return None
    for text in hostile:
        assert "\r" not in text
        assert "\x00" not in text
    return [shape(t) for t in hostile] == [shape(t) for t in harmless]


@pytest.mark.parametrize("manifest", sorted(MANIFESTS))
def test_every_field_keeps_the_shape_with_the_known_hostile_values(manifest: str) -> None:
    tried = 0
    for key, field in keys(manifest):
        for value in [*field.choices, *field.literals, *NASTY.get(field.kind, [])]:
            same = same_shape(manifest, key, value)
            assert same is not False, (key, value)
            tried += same is not None
    assert tried >= 30


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                   HealthCheck.too_slow])
@given(data=st.data())
def test_no_generated_value_changes_the_dockerfiles_shape(data: st.DataObject) -> None:
    manifest, key, field = data.draw(st.sampled_from(CASES), label="case")
    value = data.draw(values(field), label="value")
    same = same_shape(manifest, key, value)
    assume(same is not None)
    assert same, (key, value)


def test_every_stage_is_rendered_and_every_field_tried() -> None:
    rendered = set()
    for manifest, overrides in MANIFESTS.items():
        loaded = load(ROOT / "manifests" / manifest, overrides, registry=STAGES)
        for target in defined_targets(loaded, STAGES):
            planned = make_plan(loaded, target, STAGES)
            rendered |= {s.name for s in planned.stages}
            assert parse(dockerfile(planned))  # the parser reads what we render
    assert rendered == set(STAGES)
    tried = {key for _, key, _ in CASES}
    assert {f"stages.{n}.{k}" for n, s in STAGES.items() for k, f in s.fields.items()
            if f.kind not in ("bool", "int", "jobs", *NOT_RENDERED)} <= tried


@pytest.mark.parametrize(("safe", "hostile"), [
    ("RUN tar -xf '/src/a;b'", "RUN tar -xf /src/a;b"),
    ("RUN pip install 'a>=1'", "RUN pip install a>=1"),
    ("RUN echo 'a b'", "RUN echo a b"),
    ("RUN echo '$(id)'", "RUN echo $(id)"),
    ('ENV A="x"', 'ENV A="x" B="y"'),
    ("RUN make \\\n    && echo x", "RUN make \\\n    && echo x\nRUN evil"),
    ("COPY <<'EOF' /f\nbody\nEOF", "COPY <<'EOF' /f\nbody\nEOF\nRUN evil\nEOF"),
    ("RUN echo 'a#b'", "RUN echo a #b"),
])
def test_the_shape_tells_a_quoted_value_from_an_injected_one(safe: str, hostile: str) -> None:
    try:
        different = shape(safe) != shape(hostile)
    except ParseError:
        different = True
    assert different
    assert shell_shape("echo 'a;b' \"c d\"") == shell_shape("echo 'axb' \"cxd\"")


def test_a_quoted_heredoc_marker_is_a_word_and_a_real_one_a_heredoc() -> None:
    # BuildKit matches heredocs per shell word, quotes kept: an apt package '0<<A' (once drawn
    # by the generated values) opens none, and the parse must not wait for an `A` line.
    quoted = parse("RUN apt-get install -y 0 '0<<A'\nRUN true\n")
    assert [(i.keyword, i.heredocs) for i in quoted] == [("RUN", ()), ("RUN", ())]
    real = parse("RUN python - <<'EOF'\nprint(1)\nEOF\nCOPY <<-EOT /x\n\tA\n\tEOT\n")
    assert [(i.keyword, i.heredocs) for i in real] == [("RUN", ("print(1)",)), ("COPY", ("\tA",))]

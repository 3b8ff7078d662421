"""The README's manifest reference is generated; this keeps it current."""

from __future__ import annotations

import re
from pathlib import Path

from imageforge.model.reference import END, START, markdown
from stages import STAGES

README = Path(__file__).resolve().parents[2] / "README.md"


def test_manifest_reference_in_readme_is_current() -> None:
    text = README.read_text()
    section = re.search(re.escape(START) + r"\n(.*?)" + re.escape(END), text, re.S)
    assert section is not None
    assert section.group(1) == markdown(STAGES), "run `invoke docs` and commit README.md"


def test_readme_gives_the_two_commands() -> None:
    text = README.read_text()
    assert "make demo" in text
    assert "make test" in text

"""The README as a newcomer reads it: short, its facts current (tasks, exit codes, the test
command CI runs), and every link in it and in docs/ leading somewhere."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from imageforge import errors
from imageforge.model.reference import page
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
# [text](target): the target up to its closing parenthesis, no spaces.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.S)


def test_readme_is_short_enough_to_read_to_the_end() -> None:
    assert len(README.read_text().splitlines()) < 200, "move detail into a docs/ page"


def test_readme_gives_the_two_commands() -> None:
    text = README.read_text()
    assert "make demo" in text
    assert "make test" in text


def test_ci_runs_the_test_command_the_readme_gives() -> None:
    # .ci/run promises to run exactly the README's test command.
    commands = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-1] == "make test"
    assert re.search(r"^make test\s", README.read_text(), re.M)


def test_the_manifest_reference_lives_in_the_docs_only() -> None:
    # `invoke docs` writes docs/manifest.md alone; the README links to it.
    assert "manifest-reference:start" not in README.read_text()
    assert "](docs/manifest.md)" in README.read_text()
    assert (ROOT / "docs/manifest.md").read_text() == page(STAGES), "run `invoke docs`"


def task_names() -> list[str]:
    listing = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "--list"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    # Task lines are indented by two spaces; wrapped help text by more.
    return [line.split()[0] for line in listing.splitlines() if re.match(r"^  \S", line)]


def table_rows(heading: str) -> list[list[str]]:
    """The body rows of the first table under `## heading`, as lists of stripped cells."""
    section = README.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows[2:]]


def test_the_task_table_has_one_row_per_task() -> None:
    names = [row[0].strip("`") for row in table_rows("Tasks")]
    assert sorted(names) == sorted(task_names())
    for name, meaning in ((row[0], row[1]) for row in table_rows("Tasks")):
        # One short sentence a cell: flags and details belong in docs/tasks.md.
        assert len(meaning) <= 90, f"{name}: shorten it, link docs/tasks.md for the rest"


def test_the_exit_code_table_is_every_code_the_tool_returns() -> None:
    documented = [int(row[0]) for row in table_rows("Exit codes")]
    returned = {value.return_code for value in vars(errors).values()
                if isinstance(value, type) and issubclass(value, errors.FatalError)}
    # 0 is success; 141 is tasks.py's own (EXIT_PIPE), for a reader that went away.
    assert set(documented) == returned | {0, 141}
    assert documented == sorted(documented)


def slug(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_every_relative_link_leads_to_a_file_and_heading() -> None:
    broken = []
    for source in PAGES:
        for target in LINK.findall(FENCE.sub("", source.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (source.parent / file_part).resolve() if file_part else source
            if not dest.exists():
                broken.append(f"{source.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{source.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken

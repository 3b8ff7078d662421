"""What a stage hands the engine (imageforge/model/stage.py): the file name a download is saved
under whatever its query, fragment or sourceforge-style tail, and the git source of a stage."""

from __future__ import annotations

import pytest

from imageforge.model.sourcetypes import GitSource
from imageforge.model.stage import filename_of, git_source


@pytest.mark.parametrize(("url", "name"), [
    # Only the first '?' starts the query and only the first '#' the fragment.
    ("https://h/a/file.tgz?sig=a?b", "file.tgz"),
    ("https://h/a/file.tgz#one#two", "file.tgz"),
    ("https://h/a/file.tgz?q=1#f?g#h", "file.tgz"),
    # A trailing /download names the segment before it, also when that is the first one.
    ("p-1.0.tar.gz/download", "p-1.0.tar.gz"),
    ("/mirror/download", "mirror"),
    ("https://h/a/dirX//", "dirX"),
])
def test_filename_of_takes_the_last_segment_before_query_and_fragment(url: str,
                                                                      name: str) -> None:
    assert filename_of(url) == name


def test_git_source_names_the_stage_and_takes_its_pins() -> None:
    inputs = {"repo": "https://h/nccl.git", "ref": "v2.10.3-1", "commit": "c" * 40}
    assert git_source("nccl", inputs) == GitSource(
        name="src-nccl", repo="https://h/nccl.git", ref="v2.10.3-1", commit="c" * 40,
        submodules=False)
    assert git_source("nccl", inputs).submodules is False
    assert git_source("pytorch", {"repo": "r", "ref": "main"}, submodules=True) == GitSource(
        name="src-pytorch", repo="r", ref="main", commit=None, submodules=True)
    only = git_source("x", inputs, submodules=("third_party/a", "third_party/b"))
    assert only.submodules == ("third_party/a", "third_party/b")

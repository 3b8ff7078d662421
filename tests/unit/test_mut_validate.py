"""Every branch of the manifest value checks (imageforge/model/validate.py), with the exact message
a refused value gets."""

from __future__ import annotations

import re
from typing import Any

import pytest

from imageforge.model.validate import ALLOWED, MAX_JOBS, Kind, _full, problem


@pytest.mark.parametrize(("kind", "value"), [
    ("bool", True), ("bool", False), ("int", 0), ("int", 12),
    ("arch_list", []), ("arch_list", ["7.0", "9.0+PTX"]), ("packages", ["numpy", "a[x]==1.0"]),
    ("flags", ["-g", "--skip-kmod"]), ("args", ["threading=multi"]), ("names", ["efa"]),
    ("url", "https://h/x.tgz"), ("url", "file:///srv/x"), ("url", "mirror/x.tgz"),
    ("repo", "./nccl"), ("repo", "XX-XX/nccl"), ("url", "X-1.0.tgz"),
    ("path", "/opt/x"), ("path", "/"), ("path", "/a/..b/c"),
    ("ref", "v2.10.3-1"), ("ref", "release/1.x"), ("ref", "a.b"),
    ("specifier", "~=1.14"), ("specifier", ">=2.10,<2.12"),
    ("fingerprint", "ABCD " * 10), ("fingerprint", "a" * 40),
    ("text", "a plain line, with (punctuation)!"), ("text", ""),
    ("version", "2.10.3"), ("sha256", "0" * 64), ("commit", "f" * 40),
    ("digest", "sha256:" + "0" * 64), ("image", "nvidia/cuda:11.3.1"),
    ("entry_point", "pkg.mod:main"), ("host_path", "~/code"), ("file_name", "src/train.py"),
    ("name", "my-image"), ("arch", "8.0"),
])
def test_valid_values_have_no_problem(kind: Kind, value: Any) -> None:
    assert problem(kind, value) is None


@pytest.mark.parametrize(("kind", "value"), [
    ("bool", 1), ("bool", "true"), ("int", -1), ("int", True), ("int", "3"), ("int", 1.0),
    ("arch_list", "7.0"), ("arch_list", ["7.0", 8]), ("names", None),
])
def test_values_of_the_wrong_type_get_the_allowed_shape(kind: Kind, value: Any) -> None:
    assert problem(kind, value) == f"expected {ALLOWED[kind]}"


@pytest.mark.parametrize(("kind", "value", "bad"), [
    ("arch_list", ["7.0", "x", "y"], "x"), ("packages", ["ok", "bad pkg"], "bad pkg"),
    ("flags", ["nodash"], "nodash"), ("args", ["-"], "-"), ("names", ["UP"], "UP"),
])
def test_a_bad_list_item_is_named(kind: Kind, value: Any, bad: str) -> None:
    assert problem(kind, value) == f"{bad!r} is not allowed: expected {ALLOWED[kind]}"


@pytest.mark.parametrize("kind", ["version", "url", "text", "path"])
def test_a_non_string_is_refused_as_such(kind: Kind) -> None:
    assert problem(kind, 3) == f"expected a string: {ALLOWED[kind]}"
    assert problem(kind, ["x"]) == f"expected a string: {ALLOWED[kind]}"


@pytest.mark.parametrize(("kind", "value"), [
    ("url", "-rf"), ("url", "--upload-pack=x"), ("repo", "-x/y"), ("url", "https://h/$x"),
    ("path", "relative/x"), ("path", "/a/../b"), ("path", "/.."),
    ("ref", "v1..v2"), ("ref", "refs/heads/x.lock"), ("ref", "branch/"), ("ref", "-x"),
    ("specifier", "not a spec"), ("specifier", ""), ("specifier", "  "),
    ("fingerprint", "ABCD" * 9), ("fingerprint", "G" * 40),
    ("text", 'say "hi"'), ("text", "it's"), ("text", "back\\slash"), ("text", "$HOME"),
    ("text", "`id`"), ("text", "two\nlines"), ("text", "tab\there"),
    ("version", "-1"), ("name", "Upper"),
])
def test_invalid_strings_are_quoted_in_the_problem(kind: Kind, value: str) -> None:
    assert problem(kind, value) == f"{value!r} is not allowed: expected {ALLOWED[kind]}"


def test_full_matches_the_whole_value_only() -> None:
    """Called here: validate builds its checks with _full once, when imported."""
    check = _full(re.compile(r"a+"))
    assert check("aaa") is True
    assert check("aab") is False
    assert check("") is False


@pytest.mark.parametrize("jobs", [1, 2, MAX_JOBS - 1, MAX_JOBS])
def test_jobs_from_1_to_the_limit_are_allowed(jobs: int) -> None:
    assert problem("jobs", jobs) is None


@pytest.mark.parametrize("jobs", [0, -1, MAX_JOBS + 1, True, 2.0, "4"])
def test_jobs_outside_1_to_the_limit_or_not_whole_are_named(jobs: Any) -> None:
    assert problem("jobs", jobs) == (
        f"{jobs!r} is not allowed: expected a whole number of parallel jobs from 1 to "
        f"{MAX_JOBS}")

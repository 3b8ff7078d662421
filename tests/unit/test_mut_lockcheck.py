"""imageforge/sources/lockcheck.py in process: which pin key of a lock entry is named and why,
for each key's form, the keys each section cannot be without, a pip set's every rule and the
source_date_epoch. tests/unit/test_lock_values.py runs bad locks through `invoke`."""

from __future__ import annotations

from typing import Any

import pytest

from imageforge.sources.lockcheck import epoch_problem, problem

SHA = "a" * 64
COMMIT = "b" * 40
HASH = "sha256:" + "c" * 64


def package(**changes: Any) -> dict[str, Any]:
    return {"name": "cuda-bindings", "version": "13.0.1", "hashes": [HASH], **changes}


def test_a_pin_of_good_values_has_no_problem() -> None:
    pin = {"sha256": SHA, "commit": COMMIT, "digest": "sha256:" + SHA, "version": "2.28.9",
           "to": "1.1.3-aws", "wheel_url": "https://example.com/x.whl",
           "packages": [package(), package(name="torch", version="2.11.0+cu130")],
           "provides": ["nccl", "efa"], "evidence": "$(free text)", "source": "anything"}
    assert problem(pin, "stages") is None
    assert problem({"packages": []}, "pip") is None
    assert problem({"to": "1.0"}, "upgraded") is None
    assert problem({"provides": []}, "extends") is None


@pytest.mark.parametrize(("key", "value", "why"), [
    ("sha256", "x", "'x' is not allowed: expected 64 lowercase hex digits"),
    ("commit", "main", "'main' is not allowed: expected a full 40-hex-digit git commit SHA"),
    ("digest", "sha256:nothex",
     "'sha256:nothex' is not allowed: expected an image digest 'sha256:<64 hex digits>'"),
    ("version", "1.0; x", "'1.0; x' is not allowed: expected letters, digits and . _ + - "
                          "(e.g. 2.10.3 or 1.1.3-aws)"),
    ("to", "1.0; x", "'1.0; x' is not allowed: expected letters, digits and . _ + - "
                     "(e.g. 2.10.3 or 1.1.3-aws)"),
    ("wheel_url", "ftp://x", "'ftp://x' is not allowed: expected an https://, http:// or "
                             "file:// URL or a plain path, without quotes, spaces or $"),
    ("provides", ["nccl", "A B"], "expected a list of stage names"),
    ("provides", "nccl", "expected a list of stage names"),
    ("packages", "torch==2.11.0", "expected a list of {name, version, hashes} tables"),
])
def test_each_pin_key_is_checked_in_its_own_form(key: str, value: Any, why: str) -> None:
    assert problem({key: value}, "stages") == (key, why)


def test_a_base_without_a_digest_is_allowed() -> None:
    # A base image named by tag only records digest null.
    assert problem({"digest": None}, "base") is None


def test_the_first_bad_key_in_check_order_is_named() -> None:
    assert problem({"version": "x y", "sha256": "x"}, "stages") == (
        "sha256", "'x' is not allowed: expected 64 lowercase hex digits")


@pytest.mark.parametrize(("section", "key"), [("pip", "packages"), ("upgraded", "to"),
                                              ("extends", "provides")])
def test_a_section_entry_without_its_key_is_named_missing(section: str, key: str) -> None:
    # Missing comes first, whatever else is wrong.
    assert problem({"sha256": "x"}, section) == (key, "missing")


def test_other_sections_require_nothing() -> None:
    assert problem({}, "stages") is None
    assert problem({}, "base") is None


@pytest.mark.parametrize(("packages", "why"), [
    (["torch"], "'torch' is not a {name, version, hashes} table"),
    ([{"name": "x" * 100}], "{'name': '" + "x" * 50 + " is not a {name, version, hashes} "
                                                      "table"),
    ([package(extra=1)], "{'name': 'cuda-bindings', 'version': '13.0.1', 'hashes': ['s is "
                         "not a {name, version, hashes} table"),
    ([{"name": "torch", "version": "1"}], "{'name': 'torch', 'version': '1'} is not a "
                                          "{name, version, hashes} table"),
    ([package(name=7)], "package name 7 is not allowed"),
    ([package(name="x; id")], "package name 'x; id' is not allowed"),
    ([package(name="-x")], "package name '-x' is not allowed"),
    ([package(name="x" * 129)], "package name '" + "x" * 59 + " is not allowed"),
    ([package(version=13)], "cuda-bindings: version 13 is not an exact PEP 440 version"),
    ([package(version="13 --index-url http://evil")],
     "cuda-bindings: version '13 --index-url http://evil' is not an exact PEP 440 version"),
    # PEP 440 would take it (it strips the blanks); the lock's version form does not.
    ([package(version=" 13.0.1\n")],
     "cuda-bindings: version ' 13.0.1\\n' is not an exact PEP 440 version"),
    ([package(version="1.1.3-aws-x")],
     "cuda-bindings: version '1.1.3-aws-x' is not an exact PEP 440 version"),
    ([package(hashes=HASH)],
     "cuda-bindings: hashes must be a non-empty list of 'sha256:<64 hex digits>'"),
    ([package(hashes=[])],
     "cuda-bindings: hashes must be a non-empty list of 'sha256:<64 hex digits>'"),
    ([package(hashes=[HASH, 7])],
     "cuda-bindings: hashes must be a non-empty list of 'sha256:<64 hex digits>'"),
    ([package(hashes=[HASH, "sha256:" + "C" * 64])],
     "cuda-bindings: hashes must be a non-empty list of 'sha256:<64 hex digits>'"),
    ([package(), package(name="torch", hashes=[])],
     "torch: hashes must be a non-empty list of 'sha256:<64 hex digits>'"),
])
def test_each_rule_of_a_pip_set_names_the_package(packages: list[Any], why: str) -> None:
    assert problem({"packages": packages}, "pip") == ("packages", why)


def test_a_long_package_name_is_allowed_up_to_128_characters() -> None:
    assert problem({"packages": [package(name="x" * 128)]}, "pip") is None


@pytest.mark.parametrize("value", [None, 0, 1_700_000_000])
def test_a_whole_number_of_seconds_or_none_is_an_epoch(value: int | None) -> None:
    assert epoch_problem(value) is None


@pytest.mark.parametrize(("value", "shown"), [
    (-1, "-1"), (True, "True"), (1.5, "1.5"), ("yesterday", "'yesterday'"),
    ("9" * 50, "'" + "9" * 39)])
def test_anything_else_is_not_an_epoch(value: Any, shown: str) -> None:
    assert epoch_problem(value) == f"source_date_epoch {shown} is not a whole number of seconds"

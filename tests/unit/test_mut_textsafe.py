"""How values are written into messages (imageforge/textsafe.py): a value exactly as long as
the limit is kept whole, and characters beyond the Basic Multilingual Plane that are not
printable are written as eight-digit escapes."""

from __future__ import annotations

from imageforge import textsafe


def test_a_value_exactly_as_long_as_the_limit_is_not_cut() -> None:
    assert textsafe.escaped("x" * textsafe.MAX_SHOWN) == "x" * textsafe.MAX_SHOWN
    assert textsafe.escaped("x" * (textsafe.MAX_SHOWN + 1)) == (
        "x" * textsafe.MAX_SHOWN + textsafe.ELLIPSIS)
    assert textsafe.shown("abcd", limit=6) == "'abcd'"
    assert textsafe.shown("abcde", limit=6) == "'abcde" + textsafe.ELLIPSIS


def test_each_unprintable_character_gets_the_escape_of_its_width() -> None:
    # A control, a line separator, an unassigned BMP code point, a tag and a private-use
    # character of the supplementary planes.
    text = "a\x7f\u2028\uffff\U000e0001\U000f0000b"
    assert textsafe.escaped(text, limit=None) == (
        "a\\x7f\\u2028\\uffff\\U000e0001\\U000f0000b")
    assert textsafe.escaped("\n\r\t\x00") == "\\n\\r\\t\\x00"


def test_the_first_characters_of_the_wider_escapes_are_printable_and_left_as_they_are() -> None:
    # U+0100 and U+10000 are where _escape's widths change; both are letters, never escaped.
    assert textsafe.escaped("\u0100\U00010000") == "\u0100\U00010000"

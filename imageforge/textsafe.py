"""Values from manifests, lock files and flags as messages show them.

A value is whatever its file or flag says: a newline in it could forge a line of output, an
escape sequence could rewrite the terminal, a megabyte of it could flood a CI log, and a URL
in it may carry a password. Messages show it through `shown` (quoted, like repr) or `escaped`
(bare, for a `--set` or a path): control characters written as escapes, long values cut
short, URL credentials replaced by ``***``. FatalError hides URL credentials once more in the
finished message, whatever brought them in.

Only the standard library is imported here: errors.py, at the bottom of every import chain,
uses it.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

# Enough for any version, path component or URL a reader needs to recognise; a longer value
# is cut there, with an ellipsis.
MAX_SHOWN = 80
ELLIPSIS = "…"
# Query parameters whose names contain one of these carry secrets (presigned URLs, tokens).
SECRET_PARAMS = ("token", "sig", "secret", "password", "credential", "key", "auth")
# A URL inside free text, up to the next whitespace (a quote inside its user info is hidden
# with the rest), less the punctuation of the sentence around it.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
_AFTER_URL = ".,;:!?)]}'\"" + ELLIPSIS
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def redact(url: str) -> str:
    """Return `url` with user info and secret-looking query values replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = "&".join(_redact_param(param) for param in parts.query.split("&"))
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_param(param: str) -> str:
    name, sep, _ = param.partition("=")
    if sep and any(part in unquote(name).lower() for part in SECRET_PARAMS):
        return f"{name}=***"
    return param


def redact_urls(text: str) -> str:
    """`text` with every URL in it redacted."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(_redact_found, text)


def _redact_found(found: re.Match[str]) -> str:
    url = found.group().rstrip(_AFTER_URL)
    return redact(url) + found.group()[len(url):]


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """`value` quoted as repr quotes it (which escapes every character that is not
    printable), URL credentials hidden, cut to `limit` characters."""
    return _cut(redact_urls(repr(value)), limit)


def escaped(text: str, limit: int | None = MAX_SHOWN) -> str:
    """`text` unquoted, each character that is not printable (controls, line separators,
    direction overrides) written as a Python escape, URL credentials hidden, and cut to `limit`
    characters (None: whole, for a path, which the system already bounds)."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escape(c) for c in text)
    text = redact_urls(text)
    return text if limit is None else _cut(text, limit)


def _escape(char: str) -> str:
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 \
        else f"\\U{code:08x}"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + ELLIPSIS

"""What an image reference or repository names, read from its text alone."""

from __future__ import annotations


def registry_host(ref: str) -> str | None:
    """The registry an image reference or repository names (its first path component when
    that looks like a host: has a dot, a port, or is localhost), if it names one."""
    first = ref.split("/", 1)[0]
    return first if "/" in ref and ("." in first or ":" in first or first == "localhost") else None

"""What a source is: a file pinned by sha256 (with the signature it must carry) or a git tree
at a locked commit. Value types only, so that stages and plans name sources without the
download cache (imageforge.sources.sources) that fetches them."""

from __future__ import annotations

from dataclasses import dataclass

from imageforge.errors import SourceError
from imageforge.textsafe import shown


@dataclass(frozen=True, kw_only=True)
class Signature:
    url: str  # the detached signature
    key_url: str  # the signer's public key
    fingerprint: str  # 40 upper-case hex digits, no spaces

    def __post_init__(self) -> None:
        object.__setattr__(self, "fingerprint", normalize(self.fingerprint))


def normalize(fingerprint: str) -> str:
    """'9c82 e37b ...' -> '9C82E37B...': gpg prints fingerprints in upper case, unspaced."""
    return fingerprint.replace(" ", "").upper()


@dataclass(frozen=True, kw_only=True)
class UrlSource:
    """A single file, pinned by sha256."""

    name: str  # context name, e.g. "src-efa"
    url: str
    sha256: str | None  # None only while locking
    filename: str  # file name inside the context dir
    # Checked before the file enters the cache (e.g. the EFA installer's .sig).
    signature: Signature | None = None
    # The key of the stage's table the lock fills with the file's sha256.
    pin_key: str = "sha256"

    def __post_init__(self) -> None:
        if self.filename in ("", ".", "..") or "/" in self.filename or "\0" in self.filename:
            raise SourceError(
                f"source {self.name} has an invalid file name {shown(self.filename)}; use a plain "
                "file name without '/'"
            )


@dataclass(frozen=True, kw_only=True)
class GitSource:
    """A git tree at a locked commit, optionally with submodules."""

    name: str
    repo: str
    ref: str  # tag/branch as written in the manifest
    commit: str | None  # locked commit SHA
    submodules: tuple[str, ...] | bool = False


Source = UrlSource | GitSource

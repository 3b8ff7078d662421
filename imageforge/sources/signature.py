"""Detached OpenPGP signatures (the EFA installer's `<url>.sig`), checked with gpg against a
pinned key fingerprint before the signed file enters the source cache.

The key is downloaded and imported into a throw-away GNUPGHOME, so nothing on this machine's
keyrings is trusted or changed. A key file may hold any number of keys: only a signature made
by the key with the pinned primary fingerprint (or one of its subkeys) passes.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from imageforge.cmd import run
from imageforge.errors import SourceError
from imageforge.model.sourcetypes import Signature
from imageforge.sources.download import download
from imageforge.textsafe import redact

if TYPE_CHECKING:
    import requests

DEFAULT_KEY_URL = "https://efa-installer.amazonaws.com/aws-efa-installer.key"


def verify(signature: Signature, file: Path, *, origin: str,
           session: requests.Session | None = None) -> None:
    """Refuse `file` (downloaded from `origin`) unless `signature` is a good signature of it
    by the pinned key."""
    # gpg's socket paths must stay short, so the keyring lives in the system temp dir.
    with tempfile.TemporaryDirectory(prefix="imageforge-gpg-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        signature_file = _fetch(signature.url, Path(tmp) / "file.sig", signature, origin,
                                "signature", session)
        key_file = _fetch(signature.key_url, Path(tmp) / "key.asc", signature, origin,
                          "signing key", session)
        _import_key(home, key_file, signature, origin)
        _check(home, signature_file, file, signature, origin)


def _fetch(url: str, dest: Path, signature: Signature, origin: str, what: str,
           session: requests.Session | None) -> Path:
    try:
        download(url, dest, sha256=None, session=session)
    except SourceError as exc:
        raise SourceError(
            f"cannot verify {redact(origin)} against key {signature.fingerprint}: its {what} "
            f"{redact(url)} is unavailable ({exc}); publish it, or fix gpg_key_url / the URL"
        ) from None
    return dest


def _gpg(home: Path, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LC_ALL": "C"}
    return run(["gpg", "--batch", "--no-tty", "--no-autostart", "--homedir", str(home), *args],
               env=env, text=True, timeout=60, error=SourceError,
               missing="signatures cannot be checked without it; install gnupg "
                       "(`make host-tools` does) and run again",
               timed_out="gpg did not finish within 60 s; check its home directory and run "
                         "again")


def _import_key(home: Path, key_file: Path, signature: Signature, origin: str) -> None:
    _gpg(home, ["--import", str(key_file)])
    listing = _gpg(home, ["--with-colons", "--fingerprint", "--list-keys"]).stdout
    primaries = _primary_fingerprints(listing)
    if signature.fingerprint not in primaries:
        found = ", ".join(primaries) or "no key"
        raise SourceError(
            f"the signing key {redact(signature.key_url)} for {redact(origin)} holds {found}, "
            f"not the pinned fingerprint {signature.fingerprint}; check gpg_fingerprint and "
            "gpg_key_url in the manifest"
        )


def _primary_fingerprints(colons: str) -> list[str]:
    """Fingerprints of primary keys in `gpg --with-colons` output (an fpr line follows pub)."""
    found, previous = [], ""
    for line in colons.splitlines():
        fields = line.split(":")
        if fields[0] == "fpr" and previous == "pub":
            found.append(fields[9])
        previous = fields[0]
    return found


def _check(home: Path, signature_file: Path, file: Path, signature: Signature,
           origin: str) -> None:
    result = _gpg(home, ["--status-fd", "1", "--verify", str(signature_file), str(file)])
    signers = [line.split()[-1] for line in result.stdout.splitlines()
               if line.startswith("[GNUPG:] VALIDSIG ")]
    if result.returncode == 0 and signature.fingerprint in signers:
        return
    raise SourceError(
        f"bad signature: {redact(signature.url)} is not a valid signature of {redact(origin)} "
        f"by key {signature.fingerprint}; the file may have been tampered with, so do not use "
        "it and check the source"
    )

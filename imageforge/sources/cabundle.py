"""Which CA bundle build steps that download trust (`invoke build --ca-bundle`).

Behind a TLS-intercepting proxy (a corporate one, or this project's CI) pip inside a build
fails unless it trusts the proxy's CA. The bundle reaches BuildKit as a secret: mounted for
the steps that download, never stored in a layer, a label, a build arg or the stage key.
"""

from __future__ import annotations

import os
from pathlib import Path

from imageforge.errors import ManifestError

# Where Debian/Ubuntu and RHEL keep the system bundle (which a proxy's CA is added to).
SYSTEM_BUNDLES = (Path("/etc/ssl/certs/ca-certificates.crt"),
                  Path("/etc/pki/tls/certs/ca-bundle.crt"))


def resolve(value: str | None, given_by: str = "--ca-bundle") -> Path | None:
    """`value` as given ("none" turns it off), by the flag or setting `given_by` that errors
    name; by default SSL_CERT_FILE, REQUESTS_CA_BUNDLE or the system bundle, whichever is set
    first."""
    if value is not None:
        return None if value.strip().lower() == "none" else _checked(Path(value), given_by)
    for variable in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(variable):
            return _checked(Path(os.environ[variable]), variable)
    return next((path for path in SYSTEM_BUNDLES if path.is_file()), None)


def _checked(path: Path, what: str) -> Path:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise ManifestError(f"{what} {path}: cannot read it ({exc.strerror}); give a PEM CA "
                            "bundle, or `none`.") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise ManifestError(f"{what} {path}: not a PEM CA bundle (no BEGIN CERTIFICATE); give "
                            "the bundle file your proxy's CA is in, or `none`.")
    return path.resolve()

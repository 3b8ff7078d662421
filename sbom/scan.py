"""A BuildKit SBOM generator (https://github.com/moby/buildkit/blob/master/docs/attestations/sbom-protocol.md)
that needs no network: it lists the Debian packages and Python distributions in the scanned
root filesystem as an SPDX 2.3 document. BuildKit runs it with BUILDKIT_SCAN_SOURCE (the
rootfs, read-only) and BUILDKIT_SCAN_DESTINATION (where <scan>.spdx.json goes)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path


def dpkg_packages(root: Path) -> list[tuple[str, str, str]]:
    status = root / "var/lib/dpkg/status"
    if not status.exists():
        return []
    found = []
    for block in status.read_text(errors="replace").split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", block, re.M))
        if "Package" in fields and "install ok installed" in fields.get("Status", ""):
            found.append((fields["Package"], fields.get("Version", ""), "deb"))
    return found


def python_distributions(root: Path) -> list[tuple[str, str, str]]:
    found = []
    for meta in root.glob("**/site-packages/*.*-info"):
        name, _, rest = meta.name.rpartition(".")[0].partition("-")
        version = rest.split("-")[0] if rest else ""
        found.append((name, version, "pypi"))
    return found


def document(root: Path, name: str) -> dict[str, object]:
    packages = sorted(set(dpkg_packages(root) + python_distributions(root)))
    spdx_packages = [
        {"SPDXID": f"SPDXRef-Package-{kind}-{hashlib.sha256((n + v).encode()).hexdigest()[:16]}",
         "name": n, "versionInfo": v, "downloadLocation": "NOASSERTION",
         "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                           "referenceLocator": f"pkg:{kind}/{n}@{v}"}]}
        for n, v, kind in packages
    ]
    return {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": name, "documentNamespace": f"https://imageforge.invalid/spdx/{name}",
        "creationInfo": {"creators": ["Tool: imageforge-sbom-scanner"],
                         "created": "1970-01-01T00:00:00Z"},
        "packages": spdx_packages,
    }


def main() -> None:
    source = Path(os.environ["BUILDKIT_SCAN_SOURCE"])
    destination = Path(os.environ["BUILDKIT_SCAN_DESTINATION"])
    destination.mkdir(parents=True, exist_ok=True)
    # BuildKit expects each file to be an in-toto statement carrying the SPDX document.
    statement = {"_type": "https://in-toto.io/Statement/v0.1",
                 "predicateType": "https://spdx.dev/Document",
                 "predicate": document(source, source.name)}
    (destination / "imageforge.spdx.json").write_text(json.dumps(statement))


if __name__ == "__main__":
    main()

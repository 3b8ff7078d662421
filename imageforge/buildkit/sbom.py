"""The SBOM generator image BuildKit runs for pushed images."""

from __future__ import annotations

from pathlib import Path

from imageforge.cmd import docker
from imageforge.errors import (
    BuildError,
)

SBOM_GENERATOR = "imageforge/sbom-scanner:1"


def ensure_sbom_generator() -> str:
    """The SBOM generator image BuildKit runs for pushed images: ours (sbom/, offline: it
    lists Debian packages and Python distributions as SPDX), built locally when absent."""
    if docker("image", "inspect", SBOM_GENERATOR).returncode != 0:
        context = Path(__file__).resolve().parents[2] / "sbom"
        result = docker("buildx", "build", "--load", "--tag", SBOM_GENERATOR, str(context),
                        timeout=600)
        if result.returncode != 0:
            last = result.stderr.decode(errors="replace").strip().splitlines()[-1:]
            raise BuildError(f"could not build the SBOM generator image {SBOM_GENERATOR}: "
                             f"{' '.join(last)}")
    return SBOM_GENERATOR

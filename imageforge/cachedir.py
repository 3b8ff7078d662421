"""The cache directory's layout (`cache_dir`, default cache/), in one place: every part of
imageforge that keeps something there names its place through these functions, so two parts
never disagree on a path and the layout can be read off this file. Standard library only:
uptodate.py reads it before anything else of the engine is imported."""

from __future__ import annotations

from pathlib import Path


def artifacts(cache_dir: Path) -> Path:
    """The artifact store (cache.artifacts.ArtifactStore owns what lies inside)."""
    return cache_dir / "artifacts"


def last_builds(cache_dir: Path) -> Path:
    """What each stage was last built from, one JSON file per stage (`invoke explain`)."""
    return artifacts(cache_dir) / "last"


def verification(cache_dir: Path, key_hex: str) -> Path:
    """The record of a rebuild that reproduced the artifact of one key."""
    return artifacts(cache_dir) / "verified" / f"{key_hex}.json"


def sources(cache_dir: Path) -> Path:
    """The source cache: downloads, git trees, their markers."""
    return cache_dir / "sources"


def local_trees(cache_dir: Path) -> Path:
    """Snapshots of the host directories given to builds (the user's code)."""
    return sources(cache_dir) / "local"


def local_images(cache_dir: Path) -> Path:
    """Image reference -> the ID of the local image it named when locked."""
    return cache_dir / "local" / "images.json"


def golden(cache_dir: Path, name: str, channel: str) -> Path:
    """The nightly's state of one golden image on one channel."""
    return cache_dir / "golden" / f"{name}-{channel}.json"


def reports(cache_dir: Path) -> Path:
    """Build and matrix reports, one timestamped JSON file each."""
    return cache_dir / "reports"


def test_record(cache_dir: Path, digest: str) -> Path:
    """The image checks' result for one image digest (what `promote` requires)."""
    return cache_dir / "tests" / f"{digest}.json"


def run_local(cache_dir: Path, job: str) -> Path:
    """The default output directory of one `invoke run-local` job."""
    return cache_dir / "run-local" / job

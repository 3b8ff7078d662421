"""What a stage module may use of imageforge: the one import path for stages/ and for the
stage guide (docs/adding-a-stage.md). Stage modules import imageforge through this module only
(tests/unit/test_stage_api.py), so the engine's own layout can change under them."""

from __future__ import annotations

# Errors with their exit codes, and safe text for messages.
from imageforge.errors import CompatibilityError, LockError, ManifestError, SourceError, UsageError

# Image checks' building blocks.
from imageforge.image import smoke

# Compatibility rules beside a stage, and their helpers.
from imageforge.model.compat import (
    CUDA_BASE,
    Floor,
    Note,
    PinRule,
    Registry,
    Rule,
    Violation,
    data_of,
    floor,
    floors,
    image_cuda,
    minor,
    numeric,
    read,
    stage_version,
)
from imageforge.model.inputs import stage_inputs

# Pins resolved at lock time from other stages' pins.
from imageforge.model.lockpin import LockPin, Pin, Upstream
from imageforge.model.manifest import Manifest

# Sources a stage fetches, pinned by the lock.
from imageforge.model.sourcetypes import GitSource, Signature, Source, UrlSource

# The stage contract: what a stage module declares (docs/adding-a-stage.md).
from imageforge.model.stage import (
    EXPORT_ROOT,
    POLICY,
    Check,
    Context,
    Field,
    Inputs,
    Stage,
    filename_of,
    git_fields,
    git_source,
    url_fields,
    url_source,
)
from imageforge.planning import pipinstall

# Dockerfile text: every value quoted by sh().
from imageforge.planning.dockerfile import (
    APT_CLEAN,
    CCACHE_MOUNT,
    LDCONFIG,
    USE_CCACHE,
    apt_commands,
    apt_install,
    bind,
    run,
    sh,
)
from imageforge.planning.localtree import tree_digest

# What the lock pins of a stage read upstream, with the shared retry.
from imageforge.sources import gitsource, piplock, repotree, wheelmeta
from imageforge.sources.download import DEFAULT_POLICY, RetryPolicy
from imageforge.sources.signature import DEFAULT_KEY_URL
from imageforge.textsafe import escaped, redact

__all__ = [
    "APT_CLEAN",
    "CCACHE_MOUNT",
    "CUDA_BASE",
    "DEFAULT_KEY_URL",
    "DEFAULT_POLICY",
    "EXPORT_ROOT",
    "LDCONFIG",
    "POLICY",
    "USE_CCACHE",
    "Check",
    "CompatibilityError",
    "Context",
    "Field",
    "Floor",
    "GitSource",
    "Inputs",
    "LockError",
    "LockPin",
    "Manifest",
    "ManifestError",
    "Note",
    "Pin",
    "PinRule",
    "Registry",
    "RetryPolicy",
    "Rule",
    "Signature",
    "Source",
    "SourceError",
    "Stage",
    "Upstream",
    "UrlSource",
    "UsageError",
    "Violation",
    "apt_commands",
    "apt_install",
    "bind",
    "data_of",
    "escaped",
    "filename_of",
    "floor",
    "floors",
    "git_fields",
    "git_source",
    "gitsource",
    "image_cuda",
    "minor",
    "numeric",
    "pipinstall",
    "piplock",
    "read",
    "redact",
    "repotree",
    "run",
    "sh",
    "smoke",
    "stage_inputs",
    "stage_version",
    "tree_digest",
    "url_fields",
    "url_source",
    "wheelmeta",
]

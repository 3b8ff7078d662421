"""Every error a user can cause ends here: one sentence, one exit code, no traceback.

tasks.py catches FatalError in one place and turns it into ``invoke.Exit(msg, code)``.
"""

from __future__ import annotations

from imageforge.textsafe import redact_urls


class FatalError(Exception):
    """Root of user-facing errors. The message says what is wrong and what to do."""

    return_code = 1

    def __str__(self) -> str:
        # A URL reaches a message from a manifest, a --set, a lock or a server's answer, and
        # may carry a password or a token: every message is printed through here, so none
        # shows one, whichever site wrote it.
        return redact_urls(super().__str__())


class UsageError(FatalError):
    """A flag or its value is wrong: unknown choice, bad number, unwritable output path.

    Exit 1, the code invoke itself gives a command line it cannot parse (unknown task or flag,
    a flag without its value), so every usage error shares one code.
    """

    return_code = 1


class ManifestError(FatalError):
    """A manifest file, a --set override or a lock file is invalid."""

    return_code = 2


class CompatibilityError(FatalError):
    """A combination of versions that is known not to work."""

    return_code = 3


class SourceError(FatalError):
    """A source could not be downloaded, or its bytes are not the pinned ones."""

    return_code = 4


class ChecksumError(SourceError):
    """Downloaded bytes do not match the pinned sha256."""

    return_code = 5


class DockerError(FatalError):
    """Docker, BuildKit or buildx is missing, stopped or misconfigured."""

    return_code = 6


class BuildError(FatalError):
    """A stage failed to build."""

    return_code = 7


class LockError(FatalError):
    """The lock file is missing, stale or disagrees with upstream."""

    return_code = 8


class CacheError(FatalError):
    """The artifact cache is unusable (corrupt beyond repair, unwritable)."""

    return_code = 9


class ImageCheckError(FatalError):
    """A smoke check inside a built image failed."""

    return_code = 10


class TrainingJobError(FatalError):
    """A run-local training job failed: a host exited non-zero, or it ran out of time."""

    return_code = 11


class RegistryError(FatalError):
    """A registry failed, refused or went away while `build --push` pushed the image."""

    return_code = 12


class NotReproducibleError(FatalError):
    """A stage rebuilt from scratch differs from its stored artifact (`verify --rebuild`), or
    a remote artifact is not the one a rebuild verified (cache.trust = "verified")."""

    return_code = 13


class Interrupted(FatalError):
    """The user (or CI) stopped the run with SIGINT/SIGTERM."""

    return_code = 130

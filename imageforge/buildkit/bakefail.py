"""Why a `docker buildx bake` run failed when no recipe is to blame.

A Docker daemon that stopped mid-build, a disk that filled up while BuildKit exported an
artifact, a registry that failed a push: without this each read as "a stage failed to build"
(exit 7) followed by BuildKit's own wording. Each gets its sentence and exit code instead.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from imageforge import diskfull
from imageforge.cmd import docker
from imageforge.docker import BUILDX_MISSING
from imageforge.errors import DockerError, FatalError, RegistryError


def explain(output: str, *, cache: Path, push: str | None = None) -> FatalError | None:
    """The error for a failed bake whose output (stderr lines, stage errors) is `output`;
    None when the build itself failed. `cache` is the artifact store BuildKit exported into,
    `push` the image reference being pushed, if any."""
    if "'buildx' is not a docker command" in output:
        return DockerError(BUILDX_MISSING)
    if not daemon_answers():
        return DockerError("the Docker daemon stopped answering during the build; nothing was "
                           "stored or tagged: start it again (`docker info` must answer) and "
                           "run the build again.")
    if diskfull.mentions_full(output):
        path = diskfull.full_path(output)
        if (path.is_relative_to(cache) if path else diskfull.nearly_full(cache)):
            return diskfull.error(cache)
        where = f"writing {path}" if path else "in a build step"
        return DockerError(f"BuildKit ran out of disk space {where}; free space on Docker's "
                           "disk (e.g. `docker builder prune`) and run the build again.")
    if push and "failed to push" in output:
        # Not "nothing stored": a build of several bakes stored the earlier ones' stages
        # (and a stage target's own), which the next run reads instead of building again.
        return RegistryError(f"pushing {push} failed ({cause(output)}); no image was tagged "
                             "or pushed: run the build again once the registry answers.")
    return None


# Failures BuildKit itself gets past on a second attempt, each with what the warning says.
# Nothing is wrong with the build, and every finished step is in BuildKit's cache, so running
# the bake again is cheap and succeeds.
_TRANSIENT = (
    # containerd answers this when two exporters of one bake write the same blob at once (the
    # pushed image and an artifact's OCI layout share their layers); BuildKit gives up after a
    # few seconds instead of waiting (moby/buildkit#1491).
    (re.compile(r"ref \S+ locked for [^)]*\): unavailable"),
     "BuildKit lost a race for a blob lock in containerd"),
    # BuildKit's solver can keep an edge merged from a build that has since ended, and the next
    # build that reaches it fails at once (moby/buildkit#2303, still open). Two builds at once
    # on one engine, which imageforge's locks allow, are what leave such an edge behind.
    (re.compile(r"failed to get edge: inconsistent graph state"),
     "BuildKit's solver lost track of a step (\"inconsistent graph state\")"),
    # With containerd's image store, builds at once on one containerd (two on one engine, or
    # a second engine sharing the host's containerd) can lose a snapshot another build was
    # still reading; BuildKit then ends with a bare "not found" that names nothing, and the
    # same bake succeeds on its next attempt (moby/buildkit#6977, #6521). A missing file or
    # image always names what is missing, so it never matches.
    (re.compile(r"failed to solve: not found\s*$|snapshot \S+ does not exist: not found"),
     "containerd lost a snapshot another build was using (\"not found\")"),
    # A cache record a step was matched against is gone before the step reads it: BuildKit's
    # garbage collection (or another build) removed it meanwhile (moby/buildkit#3635, open;
    # depot's CLI retries it too). It came in a `make test` of this project after BuildKit
    # collected NCCL's layers: the rebuilt stage's dependent failed 558 s in, and passes when
    # run again. In a CI run BuildKit attached it to the step that read the record instead
    # ("stage nccl-tests failed: failed to get state for index 1 on [nccl-tests 1/2]").
    (re.compile(r"failed to get state for index \d+ on "),
     "BuildKit lost a cache record it had matched (\"failed to get state for index\")"),
)


def transient(output: str, stage_errors: Sequence[str] = ()) -> str | None:
    """What went wrong, when a failed bake's `output` and the errors BuildKit attached to its
    stages' steps (`stage_errors`) show only failures another attempt gets past (the first
    one's words); None when any error is another."""
    errors = [line for line in output.splitlines() if "ERROR" in line or "error:" in line]
    errors += stage_errors
    found = [next((why for pattern, why in _TRANSIENT if pattern.search(line)), None)
             for line in errors]
    if not found or None in found:
        return None
    return found[0]


def daemon_answers() -> bool:
    try:
        return docker("info", "--format", "{{.ServerVersion}}", timeout=15).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def cause(output: str) -> str:
    """The cause at the end of BuildKit's last error line, e.g. "500 Internal Server
    Error" or "connect: connection refused", without the URLs and upload tokens before it."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")] or lines
    if not errors:
        return "no output"
    # Go's url.Error puts the URL (with any upload token) in a part of its own: `Put "URL": EOF`.
    parts = [part for part in errors[-1].split(": ") if "://" not in part]
    # Go's errors end in their cause; one word ("EOF") says more with what it ended.
    tail = parts[-2:] if len(parts) > 2 and len(parts[-1]) < 12 else parts[-1:]
    return ": ".join(tail)[-200:]

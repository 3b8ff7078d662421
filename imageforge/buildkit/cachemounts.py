"""Removing the cache mounts a build from nothing made for itself.

Such a build gives every cache mount an id of its own (planning.execute.fresh_cache_mounts),
so it takes no pip wheel or ccache object from earlier builds. No later build uses those ids,
and BuildKit would keep them (a ccache of a whole NCCL build is hundreds of megabytes) until
its own garbage collection, so they go as soon as the build ends.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from imageforge import log
from imageforge.cmd import docker_binary, run

# BuildKit describes a cache mount as `cached mount <target> from exec <command> with id
# "/<id>"`: the id is the one thing in the record that names the build that made it.
_RECORD_ID = re.compile(r"^ID:\s+(\S+)\s*$", re.MULTILINE)
_DESCRIPTION = re.compile(r"^Description:\s+(.*)$", re.MULTILINE)


def private_records(listing: str, token: str) -> list[str]:
    """The record IDs, in `docker buildx du --verbose` output, of the cache mounts whose id
    ends in -verify-`token` (the suffix fresh_cache_mounts gives them)."""
    suffix = f'-verify-{token}"'
    found = []
    for block in re.split(r"\n\s*\n", listing):
        record, description = _RECORD_ID.search(block), _DESCRIPTION.search(block)
        if record and description and description.group(1).rstrip().endswith(suffix):
            found.append(record.group(1))
    return found


def drop(token: str, buildx: Sequence[str]) -> list[str]:
    """Remove the cache mounts of the build that used `token`, through `buildx` (the docker
    arguments that reach its builder, e.g. ["buildx"]); returns their record IDs. A failure
    is a warning: the build's result stands, and BuildKit's collection removes them later."""
    listing = run([docker_binary(), *buildx, "du", "--verbose", "--filter",
                   "type=exec.cachemount"], text=True, timeout=120)
    if listing.returncode != 0:
        log.warning(f"could not list BuildKit's cache mounts to remove this build's own: "
                    f"{listing.stderr.strip()}")
        return []
    records = private_records(listing.stdout, token)
    for record in records:
        # Docker matches `id` as a pattern and every other key exactly, so one call per ID.
        pruned = run([docker_binary(), *buildx, "prune", "--force", "--filter",
                      f"id={record}"], text=True, timeout=120)
        if pruned.returncode != 0:
            log.warning(f"could not remove this build's cache mount {record}: "
                        f"{pruned.stderr.strip()}")
    return records

"""Pins that cannot lie: a commit written in the manifest must be the one its version names.

A stage's labels, plan and keys say its `version`; a hand-pinned `commit` of another release
would build other code under that name. Checked with `git ls-remote` whenever pins are
resolved (`invoke lock`, and `invoke build` when it resolves stale entries), before any
download.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from imageforge.model.inputs import stage_inputs
from imageforge.model.manifest import Manifest
from imageforge.model.sourcetypes import GitSource
from imageforge.model.stage import Context, Stage
from imageforge.sources import gitsource


def verify_commits(manifest: Manifest, registry: Mapping[str, Stage],
                   locate: Callable[[str], str]) -> None:
    """Refuse (exit 8) a commit the manifest pins that its version's ref does not name.
    `manifest` is the file + overrides, before any lock fills in commits; `locate` maps a
    repository to where this machine fetches it (rewrite rules)."""
    for name, table in manifest.stages.items():
        # "auto" has no ref of its own: the lock pins the commit PyTorch names.
        if not table.get("commit") or table.get("version") == "auto":
            continue
        inputs = stage_inputs(manifest, registry[name], name)
        context = Context(image=manifest.image, stages={name: inputs})
        for source in registry[name].sources(context):
            if isinstance(source, GitSource) and source.commit:
                gitsource.verify_commit(locate(source.repo), source.ref, source.commit,
                                        key=f"stages.{name}.commit")

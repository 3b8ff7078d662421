"""What `plan`, `matrix.plan` and `ci.generate` show: a table, or JSON with --json."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from imageforge.planning.plan import Plan

if TYPE_CHECKING:
    from imageforge.planning.rules import Verdict


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanView:
    """`invoke plan`: the plan, the manifest as reports name it, and what waivers accept."""

    plan: Plan
    manifest: str
    verdict: Verdict

    def to_json(self) -> dict[str, Any]:
        document = self.plan.to_json(self.manifest)
        if self.verdict.accepted:
            document["waived"] = [accepted.to_json() for accepted in self.verdict.accepted]
        return document

    def table(self) -> str:
        planned = self.plan
        lines = [f"target {planned.target}  manifest {self.manifest}", *self.verdict.lines()]
        extended = planned.manifest.image.get("extends")
        if extended:
            lines.append(f"on {extended}, which already has: "
                         f"{', '.join(planned.manifest.image['provides'])}")
        lines.append(f"{'stage':<18} {'status':<7} {'version':<12} {'key':<19} deps")
        for st in planned.stages:
            version = str(st.inputs.get("version") or "-")
            lines.append(f"{st.name:<18} {st.status:<7} {version:<12} {st.key[:19]} "
                         f"{','.join(st.deps)}")
        lines += [f"not reproducible: {st.name}: {planned.registry[st.name].reproducible_reason}"
                  for st in planned.stages if not planned.registry[st.name].reproducible]
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatrixView:
    """`invoke matrix.plan`: what each image builds, and what the images share."""

    summary: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.summary

    def table(self) -> str:
        found = self.summary
        lines = [f"{image['image']}: {image['stages']} stages, builds "
                 f"{', '.join(image['builds']) or 'nothing'}"
                 + (f"; shares {', '.join(image['shared'])}" if image["shared"] else "")
                 for image in found["images"]]
        lines.append(f"{len(found['images'])} images, {found['stage_slots']} stage slots, "
                     f"{found['distinct_keys']} distinct keys, {found['keys_to_build']} to build")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Output:
    """What a command prints to standard output and to standard error."""

    out: str
    err: str = ""

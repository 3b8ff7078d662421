"""The baseline: ONE plain Dockerfile, one linear chain in seed 002's line order.

It runs the same commands as the stage recipes on the same sources (the same bind-mounted
named contexts), so what differs from imageforge is the structure only: in one chain a
changed line invalidates every line after it, whatever those lines depend on.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from imageforge.model.stage import EXPORT_ROOT, Stage
from imageforge.planning.dockerfile import env_line
from imageforge.planning.plan import Plan
from stages.smddp import openssh_steps

# (section, stage whose recipe it runs), in seed 002's order: EFA, Conda, NCCL, PyTorch, the
# OFI plugin, torchvision, OpenSSH, boost, SMDDP. The seed sets up OpenSSH before boost, so
# the smddp recipe is split in two sections there.
SEED_ORDER: tuple[tuple[str, str], ...] = (
    ("base", "base"),
    ("efa", "efa"),
    ("python", "python"),
    ("nccl", "nccl"),
    ("pytorch", "pytorch"),
    ("aws-ofi-nccl", "aws-ofi-nccl"),
    ("torchvision", "torchvision"),
    ("openssh", "smddp"),
    ("boost", "boost"),
    # The seed pip-installs the SageMaker packages right before the SMDDP wheel.
    ("sagemaker-training", "sagemaker-training"),
    ("smddp", "smddp"),
)

# Builder recipes install into /out for imageforge's `COPY --from=<stage> /out/ /`; in one
# chain the next line needs those files in place (the seed installs straight into /), so the
# same RUN moves them there and the layer count stays the recipe's.
MERGE = f"cp -a {EXPORT_ROOT}/. / && rm -rf {EXPORT_ROOT}"

# Instructions BuildKit numbers as steps ("[3/12] RUN ..."); ENV, ARG and LABEL are not.
STEP_KINDS = ("RUN", "COPY", "ADD", "WORKDIR")

HEADER = """\
# Benchmark baseline generated from {manifest}: seed 002's single linear chain, running the
# stage recipes' own commands. Do not edit: `invoke bench` writes it for every scenario.
"""

_ENV_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"')


@dataclasses.dataclass(frozen=True, kw_only=True)
class Baseline:
    dockerfile: str
    # The section of every step after the FROM, in order: BuildKit's step k is layers[k - 2].
    layers: tuple[str, ...]
    # Named contexts (fetched sources) the Dockerfile bind-mounts.
    contexts: tuple[str, ...]

    def section_of_step(self, step: int) -> str | None:
        """The section of BuildKit's step `step` ("[step/N]"); step 1 is the FROM."""
        index = step - 2
        return self.layers[index] if 0 <= index < len(self.layers) else None

    def sections(self) -> list[str]:
        """Sections that have at least one step, in chain order."""
        return list(dict.fromkeys(self.layers))

    def from_section(self, section: str) -> list[str]:
        """`section` and every section after it: what a change there rebuilds in one chain."""
        names = self.sections()
        return names[names.index(section):] if section in names else []


def instructions(text: str) -> list[str]:
    """Dockerfile text split into instructions (continuation lines kept together)."""
    found: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current.append(line)
        if not line.endswith("\\"):
            found.append("\n".join(current))
            current = []
    if current:
        found.append("\n".join(current))
    return found


def image_env(plan: Plan) -> dict[str, str]:
    """The variables the target image sets (its rendered ENV lines)."""
    env: dict[str, str] = {}
    for instruction in instructions(plan.stage(plan.target).recipe):
        if instruction.startswith("ENV "):
            env.update(_ENV_PAIR.findall(instruction))
    return env


# Seed 000's order: the EFA installer, NCCL, the OFI plugin, nccl-tests (target efa-nccl).
SEED_000_ORDER: tuple[tuple[str, str], ...] = (
    ("base", "base"),
    ("efa", "efa"),
    ("nccl", "nccl"),
    ("aws-ofi-nccl", "aws-ofi-nccl"),
    ("nccl-tests", "nccl-tests"),
    ("efa-nccl", "efa-nccl"),
)


def sections(plan: Plan, registry: Mapping[str, Stage],
             order: tuple[tuple[str, str], ...] = SEED_ORDER) -> list[tuple[str, list[str]]]:
    """(section, its instructions) in seed order, for the stages of `plan`."""
    names = {s.name for s in plan.stages}
    unknown = sorted(names - {stage for _, stage in order})
    if unknown:
        raise ValueError(f"the baseline follows the seed's order; stages "
                         f"{', '.join(unknown)} have no place in it.")
    ctx = plan.context
    ssh: list[str] = []
    if "smddp" in names and ctx.of("smddp")["openssh"]:
        ssh = instructions("\n".join(openssh_steps(ctx)))
    found: list[tuple[str, list[str]]] = []
    for section, name in order:
        if name not in names:
            continue
        stage = registry[name]
        body = instructions(stage.recipe(ctx))
        if section == "openssh":
            body = list(ssh)
        elif name == "smddp":
            body = [i for i in body if i not in ssh]
        # Image stages install in place; only builders fill /out.
        if body and not stage.image and stage.exports == (EXPORT_ROOT,):
            body[-1] = _merged(body[-1], name)
        found.append((section, body))
    return found


def baseline_dockerfile(plan: Plan, registry: Mapping[str, Stage],
                        order: tuple[tuple[str, str], ...] = SEED_ORDER) -> Baseline:
    """The linear Dockerfile for `plan`, its stages in `order` (seed 002's by default)."""
    image = plan.context.image
    digest = image.get("base_digest")
    lines = [HEADER.format(manifest=plan.manifest.path.name),
             f"FROM {image['base']}" + (f"@{digest}" if digest else "")]
    env = image_env(plan)
    # Like the seed, search paths are set once at the top. Variables that carry a version
    # (EFA_VERSION, NCCL_VERSION) go last: at the top they would invalidate every line on any
    # bump, which is not what this benchmark is about (and would flatter imageforge).
    paths = {k: v for k, v in env.items() if "${" in v}
    plain = {k: v for k, v in env.items() if k not in paths}
    if paths:
        lines.append(env_line(paths))
    layers: list[str] = []
    for section, body in sections(plan, registry, order):
        if not body:
            continue
        lines.append(f"\n# ---- {section} ----")
        for instruction in body:
            lines.append(instruction)
            if instruction.split(None, 1)[0] in STEP_KINDS:
                layers.append(section)
    if plain:
        lines.append("")
        lines.append(env_line(plain))
    contexts = sorted({src.name for stage in plan.stages for src in stage.sources})
    return Baseline(dockerfile="\n".join(lines) + "\n", layers=tuple(layers),
                    contexts=tuple(contexts))


def _merged(instruction: str, stage: str) -> str:
    if not instruction.startswith("RUN "):
        raise ValueError(f"stage {stage}: its recipe must end with the RUN that fills "
                         f"{EXPORT_ROOT}, found: {instruction.splitlines()[0]}")
    return f"{instruction} \\\n    && {MERGE}"

"""Golden images: tag names from a template, promotion of tested digests, size budgets."""

from __future__ import annotations

import re
import string
from datetime import UTC, datetime
from pathlib import Path

from imageforge.cmd import docker
from imageforge.errors import DockerError, ImageCheckError, RegistryError, UsageError
from imageforge.image.checkreport import passed_record
from imageforge.model.imageref import registry_host
from imageforge.planning.plan import Plan

# For an image whose stage module names no tag_template.
FALLBACK_TEMPLATE = "{name}:{target}-{key12}-{date}"
_DIGEST_REF = re.compile(r"(?P<repo>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})")


def template_variables(planned: Plan, *, date: datetime | None = None) -> dict[str, str]:
    image = planned.manifest.image
    cuda = str(image.get("cuda") or "")
    python = str(image["python"])
    values = {
        "name": str(image.get("name") or planned.target),
        "target": planned.target,
        "key12": planned.key[7:19],
        "date": (date or datetime.now(UTC)).strftime("%Y%m%d"),
        "cuda": cuda,
        "cuda_nodot": cuda.replace(".", ""),
        "python": python,
        "python_nodot": python.replace(".", ""),
    }
    for stage in planned.stages:
        version = stage.inputs.get("version")
        if version:
            values[stage.name] = str(version)
    return values


def tag_for(planned: Plan, template: str | None = None, *, date: datetime | None = None,
            repository: str | None = None) -> str:
    """The image reference a template names, e.g. smddp:pt1.10.2-cu113-py38-efa1.14.1-20261129."""
    template = template or planned.registry[planned.target].tag_template or FALLBACK_TEMPLATE
    values = template_variables(planned, date=date)
    names = [field for _, field, _, _ in string.Formatter().parse(template) if field]
    unknown = [n for n in names if n not in values]
    if unknown:
        raise UsageError(f"--tag-template {template!r}: unknown field {{{unknown[0]}}}; known: "
                         f"{', '.join(sorted(values))}.")
    tag = template.format(**values)
    return f"{repository.rstrip('/')}/{tag}" if repository else tag


def split_digest_ref(ref: str) -> tuple[str, str]:
    match = _DIGEST_REF.fullmatch(ref)
    if not match:
        raise UsageError(f"--image {ref}: give the image by digest, REPOSITORY@sha256:<64 hex>; "
                         "promotion never moves a tag by name.")
    return match.group("repo"), match.group("digest")


def require_tested(cache_dir: Path, digest: str) -> None:
    """Promotion needs a passing `invoke test-image` run of exactly this digest."""
    if passed_record(cache_dir, digest) is None:
        raise ImageCheckError(f"{digest} has no passing `invoke test-image` record; run "
                              "test-image on that digest (and fix what fails) before "
                              "promoting it.")


def repository_of(ref: str) -> str:
    """The repository part of an image reference (without tag or digest)."""
    without_digest = ref.split("@", 1)[0]
    last = without_digest.rsplit("/", 1)[-1]
    if ":" in last:
        return without_digest[: len(without_digest) - len(last)] + last.split(":", 1)[0]
    return without_digest


def promote(ref: str, tag: str, *, cache_dir: Path, env: dict[str, str] | None = None) -> str:
    """Point `<repository>:<tag>` at a tested digest without rebuilding; returns the new
    reference. Registry images are retagged in the registry, local ones locally."""
    repository, digest = split_digest_ref(ref)
    require_tested(cache_dir, digest)
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}", tag):
        raise UsageError(f"--tag {tag}: not a valid tag (letters, digits, . _ -).")
    target = f"{repository}:{tag}"
    if registry_host(repository):
        result = docker("buildx", "imagetools", "create", "--tag", target, ref, env=env)
    else:
        result = docker("tag", ref, target, env=env)
    if result.returncode != 0:
        raise RegistryError(f"could not tag {ref} as {target}: "
                         f"{result.stderr.decode(errors='replace').strip().splitlines()[-1:]}")
    return target


def image_size(ref: str) -> int:
    """Bytes of an image in the local store (the size budget compares these)."""
    result = docker("image", "inspect", "--format", "{{.Size}}", ref)
    if result.returncode != 0:
        raise DockerError(f"image {ref} is not in the local image store; build it first.")
    return int(result.stdout.decode().strip() or 0)


def check_size_budget(size: int, previous: int | None, ratio: float, ref: str) -> None:
    if previous and size > previous * ratio:
        raise ImageCheckError(
            f"{ref} is {size / 1e6:.0f} MB, {size / previous:.2f}x the last golden image "
            f"({previous / 1e6:.0f} MB); the budget is {ratio:.2f}x. Find what grew, or raise "
            "the budget with --size-budget.")

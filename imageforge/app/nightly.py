"""`invoke nightly`: move pins within policy, rebuild what changed, test, push, promote.

lock --upgrade -> diff with the last lock -> nothing changed and the channel already holds
this key: "up to date", nothing built -> otherwise build (the artifact cache rebuilds only
stages whose keys changed), test-image, size budget, push a dated tag, promote the channel
tag. Every step lands in the reports (JSON, Markdown, JUnit XML); nothing is promoted after
a failure, and the run exits with the failing step's error.
"""

from __future__ import annotations

import dataclasses
import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from imageforge import cachedir, jsonfile, log
from imageforge.app import project, verify
from imageforge.app.build import build
from imageforge.app.workspace import Workspace
from imageforge.buildkit.results import BuildOptions
from imageforge.cache import remote as remote_mod
from imageforge.cmd import docker
from imageforge.docker import image_digest, image_labels
from imageforge.errors import FatalError, RegistryError, UsageError
from imageforge.image import golden
from imageforge.image.checkreport import publish, summary
from imageforge.image.checks import require_passed, run_image_tests
from imageforge.jsonfile import read_object
from imageforge.model.manifest import manifest_label
from imageforge.sources import cabundle
from imageforge.textsafe import redact

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NightlyOptions:
    target: str | None = None
    push: bool = False
    repository: str | None = None      # where dated tags and the channel tag go
    channel: str = "golden"
    template: str | None = None
    size_budget: float = 1.2           # AWS DLC fails a build 1.2x over its size baseline
    report_dir: Path | None = None
    webhook: str | None = None
    verify: int = 0                    # stages to rebuild from scratch and compare


@dataclasses.dataclass
class Step:
    name: str
    status: str = "ok"                 # ok | failed | skipped
    seconds: float = 0.0
    detail: str = ""


@dataclasses.dataclass
class Nightly:
    manifest: str
    target: str
    started: str
    status: str = "running"            # up-to-date | ok | failed
    steps: list[Step] = dataclasses.field(default_factory=list)
    lock_changes: list[str] = dataclasses.field(default_factory=list)
    rebuilt: list[str] = dataclasses.field(default_factory=list)
    built_keys: list[str] = dataclasses.field(default_factory=list)
    image: dict[str, Any] = dataclasses.field(default_factory=dict)
    promoted: str | None = None
    error: str | None = None
    # `--verify N`: what rebuilding those stages from scratch found (buildkit/verify.py).
    verified: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @contextmanager
    def step(self, name: str) -> Iterator[Step]:
        step = Step(name=name)
        self.steps.append(step)
        clock = time.monotonic()
        try:
            yield step
        except FatalError as exc:
            step.status, step.detail = "failed", str(exc)
            raise
        finally:
            step.seconds = round(time.monotonic() - clock, 2)


def run(ws: Workspace, options: NightlyOptions) -> Nightly:
    target = options.target or project.default_target(ws)
    report = Nightly(manifest=manifest_label(ws.manifest), target=target,
                     started=_now())
    try:
        with report.step("lock --upgrade") as step:
            _, report.lock_changes = project.write_lock(ws, upgrade=True)
            step.detail = "; ".join(report.lock_changes) or "no pin moved"
        _image(dataclasses.replace(ws, locked=True), options, report)
    except FatalError as exc:
        report.status, report.error = "failed", str(exc)
        raise
    finally:
        _publish(report, options)
    return report


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _image(ws: Workspace, options: NightlyOptions, report: Nightly) -> None:
    """Build (what changed), test, budget, push and promote one image whose lock is settled."""
    planned = project.plan(ws, report.target)
    state_path = _state_path(ws, planned.manifest.image.get("name") or report.target,
                             options.channel)
    last = read_object(state_path)
    if not report.lock_changes and last and last.get("key") == planned.key:
        report.status = "up to date"
        report.image = {"tag": last.get("ref"), "digest": last.get("digest"),
                        "size": last.get("size")}
        report.steps.append(Step(name="build", status="skipped",
                                 detail=f"{options.channel} already holds key {planned.key[:19]}"))
        _verify(ws, options, report)
        return
    tag = golden.tag_for(planned, options.template, repository=options.repository)
    with report.step("build") as step:
        result = build(ws, BuildOptions(target=report.target, tag=tag, progress="plain"))
        assert result is not None
        report.rebuilt = result.rebuilt
        report.built_keys = [s.key for s in result.stages if s.state == "built"]
        step.detail = "rebuilt: " + (", ".join(result.rebuilt) or "nothing")
    with report.step("test-image") as step:
        step.detail = _test(ws, tag)
    _verify(ws, options, report)
    digest = _local_digest(tag)
    size = golden.image_size(tag)
    report.image = {"tag": tag, "digest": digest, "size": size}
    with report.step("size budget") as step:
        golden.check_size_budget(size, last.get("size") if last else None, options.size_budget,
                                 tag)
        step.detail = f"{size / 1e6:.0f} MB" + (
            f" ({size / last['size']:.2f}x the last golden)" if last and last.get("size") else "")
    ref = f"{golden.repository_of(tag)}@{digest}"
    host = tag.split("/", 1)[0] if options.repository else ""
    with remote_mod.credentials(host) as env:
        if options.push:
            with report.step("push") as step:
                _push(tag, env)
                step.detail = tag
        with report.step("promote") as step:
            report.promoted = golden.promote(ref, options.channel,
                                             cache_dir=ws.cache_dir, env=env)
            step.detail = f"{report.promoted} -> {digest}"
    _write_json(state_path, {"key": planned.key, "ref": tag, "digest": digest, "size": size,
                             "promoted": report.promoted, "date": report.started})
    report.status = "ok"


def _verify(ws: Workspace, options: NightlyOptions, report: Nightly) -> None:
    """`--verify N`: rebuild the N stages verified longest ago from scratch and compare them
    with their artifacts; a difference fails the nightly before anything is promoted."""
    if not options.verify:
        return
    with report.step("verify --rebuild") as step:
        chosen = verify.least_recently_verified(ws, report.target, options.verify)
        verdicts = verify.rebuild(ws, report.target, chosen, progress="plain",
                                  ca_bundle=cabundle.resolve(None))
        report.verified = [v.to_json() for v in verdicts]
        step.detail = ", ".join(f"{v.stage} {v.result}" for v in verdicts) or "no stage"
        verify.raise_if_failed(verdicts)


# ---- a matrix ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class MatrixImage:
    ws: Workspace         # the image's manifest with its --set overrides
    target: str | None
    tag: str | None
    label: str


@dataclasses.dataclass
class MatrixNightly:
    file: str
    started: str
    status: str = "running"            # up-to-date | ok | failed
    lock_changes: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    images: list[Nightly] = dataclasses.field(default_factory=list)
    error: str | None = None

    @property
    def built_keys(self) -> list[str]:
        return [key for image in self.images for key in image.built_keys]


def run_matrix(file: str, images: list[MatrixImage], options: NightlyOptions) -> MatrixNightly:
    """The nightly of every image of a matrix: each manifest's lock is upgraded once (without
    an image's overrides: they pin what they set), then each image is built, tested and
    promoted as `nightly` does one. A stage key several images share is built once (the
    artifact cache holds it after the first). An image that fails does not stop the others;
    the run fails with the first failure once all are done."""
    _distinct_channels(images)
    report = MatrixNightly(file=file, started=_now())
    first: FatalError | None = None
    try:
        for manifest in dict.fromkeys(image.ws.manifest for image in images):
            base = dataclasses.replace(images[0].ws, manifest=manifest, overrides=())
            _, report.lock_changes[manifest_label(manifest)] = project.write_lock(
                base, upgrade=True)
        for image in images:
            ws = dataclasses.replace(image.ws,
                                           locked=not image.ws.overrides)
            one = Nightly(manifest=image.label, target=image.target
                          or project.default_target(ws), started=_now())
            one.lock_changes = report.lock_changes[manifest_label(
                image.ws.manifest)]
            report.images.append(one)
            try:
                _image(ws, _options_for(image, options), one)
            except FatalError as exc:
                one.status, one.error = "failed", str(exc)
                first = first or exc
        if first is not None:
            raise first
        report.status = ("up to date" if all(i.status == "up to date" for i in report.images)
                         else "ok")
    except FatalError as exc:
        report.status, report.error = "failed", str(exc)
        raise
    finally:
        _publish_matrix(report, options)
    return report


def _options_for(image: MatrixImage, options: NightlyOptions) -> NightlyOptions:
    """An image with a tag keeps it, and its channel tag is `<tag>-<channel>` (two variants of
    one repository must not promote the same channel tag)."""
    if not image.tag:
        return dataclasses.replace(options, target=image.target)
    last = image.tag.rsplit("/", 1)[-1]
    suffix = last.split(":", 1)[1] if ":" in last else "latest"
    return dataclasses.replace(options, target=image.target, template=image.tag,
                               channel=f"{suffix}-{options.channel}")


def _distinct_channels(images: list[MatrixImage]) -> None:
    seen: dict[tuple[str, str | None], str] = {}
    for image in images:
        if image.tag:
            continue
        key = (str(image.ws.manifest), image.target)
        if key in seen:
            raise UsageError(f"matrix images {seen[key]!r} and {image.label!r} would promote "
                             "the same channel tag; give each a tag in the matrix file.")
        seen[key] = image.label


def _test(ws: Workspace, image: str) -> str:
    checks = run_image_tests(project.plan(ws, image_target(ws, image)), image)
    publish(ws.cache_dir, checks)
    require_passed(checks)
    return summary(checks)


def image_target(ws: Workspace, image: str) -> str:
    """The target `image` was built for: its label (every image imageforge builds has it),
    else the image the manifest defines."""
    return image_labels(image).get("io.imageforge.target") or project.default_target(ws)


def _local_digest(ref: str) -> str:
    return image_digest(ref)


def _push(tag: str, env: dict[str, str] | None) -> None:
    result = docker("push", tag, timeout=3600, env=env)
    if result.returncode != 0:
        last = result.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise RegistryError(f"pushing {tag} failed: {' '.join(last) or 'no output'}")


def _state_path(ws: Workspace, name: str, channel: str) -> Path:
    return cachedir.golden(ws.cache_dir, name, channel)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    jsonfile.write_json(path, data)


# ---- reports ----------------------------------------------------------------------------

def to_json(report: Nightly) -> dict[str, Any]:
    return dataclasses.asdict(report)


def markdown(report: Nightly) -> str:
    icon = {"ok": "✅", "failed": "❌", "skipped": "⏭️"}
    lines = [f"## imageforge nightly: {report.target} — {report.status}", "",
             f"Manifest `{report.manifest}`, started {report.started}.", "",
             "| step | result | seconds | detail |", "|---|---|---:|---|"]
    lines += [f"| {s.name} | {icon.get(s.status, s.status)} {s.status} | {s.seconds:.1f} | "
              f"{_md(s.detail)} |" for s in report.steps]
    if report.lock_changes:
        lines += ["", "### Pins that moved", ""] + [f"- {c}" for c in report.lock_changes]
    if report.image:
        lines += ["", f"Image `{report.image.get('tag')}` `{report.image.get('digest')}`"]
    if report.promoted:
        lines.append(f"Promoted: `{report.promoted}`")
    if report.error:
        lines += ["", "### Failure", "", "```", report.error, "```"]
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    first = text.splitlines()[0] if text else ""
    return first.replace("|", "\\|")[:200]


def junit(report: Nightly) -> str:
    failures = sum(s.status == "failed" for s in report.steps)
    skipped = sum(s.status == "skipped" for s in report.steps)
    suite = ET.Element("testsuite", name=f"imageforge nightly {report.target}",
                       tests=str(len(report.steps)), failures=str(failures),
                       skipped=str(skipped), timestamp=report.started,
                       time=f"{sum(s.seconds for s in report.steps):.2f}")
    for step in report.steps:
        case = ET.SubElement(suite, "testcase", classname=f"nightly.{report.target}",
                             name=step.name, time=f"{step.seconds:.2f}")
        if step.status == "failed":
            ET.SubElement(case, "failure", message=step.detail.splitlines()[0] if step.detail
                          else "failed").text = step.detail
        elif step.status == "skipped":
            ET.SubElement(case, "skipped", message=step.detail)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _publish(report: Nightly, options: NightlyOptions) -> None:
    if options.report_dir is not None:
        options.report_dir.mkdir(parents=True, exist_ok=True)
        (options.report_dir / "nightly.json").write_text(
            json.dumps(to_json(report), indent=2) + "\n")
        (options.report_dir / "nightly.md").write_text(markdown(report))
        (options.report_dir / "nightly.xml").write_text(junit(report))
    if options.webhook:
        notify(options.webhook, report)


def matrix_markdown(report: MatrixNightly) -> str:
    lines = [f"# imageforge nightly over {report.file} — {report.status}", "",
             f"{len(report.images)} images; {len(report.built_keys)} stage builds, "
             f"{len(set(report.built_keys))} distinct keys.", ""]
    return "\n".join(lines) + "\n".join(markdown(image) for image in report.images)


def matrix_junit(report: MatrixNightly) -> str:
    suites = ET.Element("testsuites", name=f"imageforge nightly {report.file}")
    for image in report.images:
        suites.append(ET.fromstring(junit(image).split("?>", 1)[1]))
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _publish_matrix(report: MatrixNightly, options: NightlyOptions) -> None:
    if options.report_dir is not None:
        options.report_dir.mkdir(parents=True, exist_ok=True)
        document = {**dataclasses.asdict(report), "built_keys": report.built_keys}
        (options.report_dir / "nightly.json").write_text(json.dumps(document, indent=2) + "\n")
        (options.report_dir / "nightly.md").write_text(matrix_markdown(report))
        (options.report_dir / "nightly.xml").write_text(matrix_junit(report))
    if options.webhook:
        for image in report.images:
            notify(options.webhook, image)


def notify(url: str, report: Nightly) -> None:
    """POST the summary; retried on network errors and 5xx, never fails the nightly."""
    import requests

    payload = {"text": f"imageforge nightly {report.target}: {report.status}",
               "report": to_json(report)}
    try:
        _retrying(lambda: _post(url, payload))
    except (requests.RequestException, _ServerError) as exc:
        # The exception text repeats the URL, token and all: name only its kind.
        detail = str(exc) if isinstance(exc, _ServerError) else type(exc).__name__
        log.warning(f"webhook {redact(url)} failed: {detail}")


class _ServerError(Exception):
    pass


def _post(url: str, payload: dict[str, Any]) -> None:
    import requests

    response = requests.post(url, json=payload, timeout=(5, 30))
    if response.status_code >= 500:
        raise _ServerError(f"HTTP {response.status_code}")
    response.raise_for_status()


def _retrying(call: Callable[[], T]) -> T:
    import requests
    from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

    wrapped = retry(
        retry=retry_if_exception_type((requests.ConnectionError, requests.Timeout, _ServerError)),
        stop=stop_after_attempt(4), wait=wait_exponential_jitter(multiplier=0.5, max=5),
        reraise=True)(call)
    return wrapped()

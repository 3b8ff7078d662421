"""Tag templates, digest references, size budgets and the nightly's reports and webhook."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from imageforge.app import project
from imageforge.app.nightly import Nightly, Step, junit, markdown, notify
from imageforge.app.workspace import Workspace
from imageforge.errors import FatalError, ImageCheckError
from imageforge.image import golden
from imageforge.planning.plan import Plan
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
DAY = datetime(2026, 11, 29, tzinfo=UTC)


def plan(manifest: str, target: str) -> Plan:
    return project.plan(Workspace(registry=STAGES, manifest=ROOT / manifest), target)


def test_default_tag_names_every_component_and_the_date() -> None:
    tag = golden.tag_for(plan("manifests/smddp.toml", "smddp"), date=DAY)
    assert tag == "smddp:pt1.10.2-cu113-py38-efa1.14.1-20261129"
    seed0 = golden.tag_for(plan("manifests/efa-nccl.toml", "efa-nccl"), date=DAY)
    assert seed0 == "efa-nccl:efa1.11.2-nccl2.7.8-20261129"


def test_template_and_repository_are_configurable_and_checked() -> None:
    planned = plan("manifests/smddp.toml", "smddp")
    tag = golden.tag_for(planned, "{name}:{target}-{nccl}-{key12}", date=DAY,
                         repository="registry.example:5000/training")
    assert tag == f"registry.example:5000/training/smddp:smddp-2.10.3-{planned.key[7:19]}"
    with pytest.raises(FatalError, match=r"unknown field \{torch\}"):
        golden.tag_for(planned, "{name}:{torch}")


def test_promotion_needs_a_digest_reference() -> None:
    digest = "sha256:" + "a" * 64
    assert golden.split_digest_ref(f"reg:5000/x/smddp@{digest}") == ("reg:5000/x/smddp", digest)
    with pytest.raises(FatalError, match="by digest"):
        golden.split_digest_ref("reg:5000/x/smddp:golden")


def test_promotion_refuses_an_untested_digest(tmp_path: Path) -> None:
    ref = "reg:5000/x/smddp@sha256:" + "b" * 64
    with pytest.raises(ImageCheckError, match="no passing `invoke test-image` record"):
        golden.promote(ref, "golden", cache_dir=tmp_path)


@pytest.mark.parametrize(("ref", "repository"), [
    ("smddp:pt1-20261129", "smddp"),
    ("reg:5000/training/smddp:pt1", "reg:5000/training/smddp"),
    ("reg:5000/smddp@sha256:" + "c" * 64, "reg:5000/smddp"),
])
def test_repository_of_strips_tag_and_digest(ref: str, repository: str) -> None:
    assert golden.repository_of(ref) == repository


def test_size_budget() -> None:
    golden.check_size_budget(1190, 1000, 1.2, "img")
    golden.check_size_budget(5000, None, 1.2, "img")
    with pytest.raises(ImageCheckError, match=r"1.30x the last golden image"):
        golden.check_size_budget(1300, 1000, 1.2, "img")


def failed_nightly() -> Nightly:
    report = Nightly(manifest="manifests/smddp.toml", target="smddp",
                     started="2026-11-29T03:00:00Z", status="failed")
    report.steps = [Step(name="lock --upgrade", detail="efa: 1.14.1 -> 1.15.1"),
                    Step(name="build", status="failed", seconds=3.5,
                         detail="stage efa failed: exit 1\n    usage"),
                    Step(name="promote", status="skipped", detail="after a failure")]
    report.lock_changes = ["efa: 1.14.1 -> 1.15.1 (policy ~=1.14)"]
    report.error = "stage efa failed: exit 1"
    return report


def test_markdown_summary_names_the_failed_step() -> None:
    text = markdown(failed_nightly())
    assert "| build | ❌ failed | 3.5 | stage efa failed: exit 1 |" in text
    assert "- efa: 1.14.1 -> 1.15.1 (policy ~=1.14)" in text


def test_junit_report_is_valid_xml_with_failure_and_skip() -> None:
    suite = ET.fromstring(junit(failed_nightly()))
    assert suite.get("tests") == "3"
    assert suite.get("failures") == "1"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    failure = cases["build"].find("failure")
    assert failure is not None
    assert "stage efa failed" in (failure.text or "")
    assert cases["promote"].find("skipped") is not None


def test_webhook_is_retried_and_its_token_never_printed(httpserver: HTTPServer,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[dict[str, object]] = []

    def handler(request: Request) -> Response:
        calls.append(json.loads(request.data))
        return Response("busy", status=503) if len(calls) < 3 else Response("ok")

    httpserver.expect_request("/hook").respond_with_handler(handler)
    notify(httpserver.url_for("/hook") + "?token=s3cr3t-token", failed_nightly())
    assert len(calls) == 3
    assert calls[-1]["text"] == "imageforge nightly smddp: failed"
    httpserver.clear()
    httpserver.expect_request("/hook").respond_with_data("down", status=500)
    notify(httpserver.url_for("/hook") + "?token=s3cr3t-token", failed_nightly())
    out = capsys.readouterr()
    # A warning, on stderr like every other (imageforge.log), never on stdout.
    assert "imageforge: warning: webhook" in out.err
    assert "s3cr3t-token" not in out.out + out.err

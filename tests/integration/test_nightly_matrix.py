"""`nightly --matrix`: every image of a matrix built, tested and promoted in one run with one
report; the stages the images share are built once, each image promotes a channel tag of its
own, and a second run finds every image up to date."""

from __future__ import annotations

import json
import subprocess
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import requests

from bench.run import pin_changes
from tests.integration.conftest import invoke

RUN = uuid.uuid4().hex[:8]


def test_a_matrix_nightly_builds_shared_stages_once_and_promotes_each_image(
        sample_manifest_copy: Path, upstream: str, cache_dir: Path, tmp_path: Path) -> None:
    pins = requests.get(f"{upstream}/pins.json", timeout=10).json()
    plugin = next(c for c in pin_changes(sample_manifest_copy, pins) if c.stage == "aws-ofi-nccl")
    repository = f"imageforge-test/matrix-nightly-{RUN}"
    matrix = tmp_path / "images.toml"
    matrix.write_text(f'''
[[image]]
manifest = "{sample_manifest_copy}"
target = "efa-nccl"
tag = "{repository}:plugin-old"

[[image]]
manifest = "{sample_manifest_copy}"
target = "efa-nccl"
tag = "{repository}:plugin-new"
set = {json.dumps(list(plugin.overrides))}
''')
    reports = tmp_path / "reports"
    args = ("nightly", "--matrix", str(matrix), "--report", str(reports))
    first = invoke(*args, cache=cache_dir, timeout=1800)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    report = json.loads((reports / "nightly.json").read_text())
    assert report["status"] == "ok"
    old, new = report["images"]
    assert [old["status"], new["status"]] == ["ok", "ok"]
    # Every key built once across the matrix; what both images have is built by the first.
    assert len(report["built_keys"]) == len(set(report["built_keys"]))
    assert {"efa", "nccl"} & set(new["rebuilt"]) == set()
    assert {"aws-ofi-nccl", "efa-nccl"} <= set(new["rebuilt"])
    assert [old["promoted"], new["promoted"]] == [f"{repository}:plugin-old-golden",
                                                  f"{repository}:plugin-new-golden"]
    for image in (old, new):
        tagged = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}",
                                 image["promoted"]], capture_output=True, text=True, check=False)
        assert tagged.returncode == 0, f"{image['promoted']} was not promoted"
    assert old["image"]["digest"] != new["image"]["digest"]
    suites = ET.fromstring((reports / "nightly.xml").read_text())
    assert [s.get("failures") for s in suites] == ["0", "0"]
    assert "2 images; " in (reports / "nightly.md").read_text()
    assert "2 images: ok" in first.stdout

    second = invoke(*args, cache=cache_dir)
    assert second.returncode == 0, second.stderr
    again = json.loads((reports / "nightly.json").read_text())
    assert [i["status"] for i in again["images"]] == ["up to date", "up to date"]
    assert again["built_keys"] == []
    assert "2 images: up to date" in second.stdout


def test_a_matrix_nightly_refuses_per_image_options_in_one_sentence(cache_dir: Path) -> None:
    result = invoke("nightly", "--matrix", "examples/images.toml", "--target", "smddp",
                    cache=cache_dir)
    assert result.returncode == 1
    assert "nightly --matrix: the matrix file names each image's manifest" in result.stderr
    assert "Traceback" not in result.stderr

"""matrix.build on the sample: two images that share efa, nccl and aws-ofi-nccl; each key
is built once across the matrix, and one report says so."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

from tests.checksummary import check_summaries
from tests.integration.conftest import invoke

RUN = uuid.uuid4().hex[:8]


def test_a_matrix_builds_each_shared_stage_once(sample_manifest: Path, cache_dir: Path,
                                                tmp_path: Path) -> None:
    matrix = tmp_path / "images.toml"
    tags = [f"imageforge-test/matrix-efa-nccl:{RUN}", f"imageforge-test/matrix-smddp:{RUN}"]
    matrix.write_text(f'''
[[image]]
manifest = "{sample_manifest}"
target = "efa-nccl"
tag = "{tags[0]}"

[[image]]
manifest = "{sample_manifest}"
target = "smddp"
tag = "{tags[1]}"
''')
    try:
        planned = invoke("matrix.plan", "--file", str(matrix), "--json", cache=cache_dir)
        assert planned.returncode == 0, planned.stderr
        summary = json.loads(planned.stdout)
        assert summary["images"][1]["shared"] == ["base", "efa", "nccl", "aws-ofi-nccl"]
        report = tmp_path / "report.json"
        result = invoke("matrix.build", "--file", str(matrix), "--report", str(report),
                        "--progress", "plain", cache=cache_dir, timeout=1800)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
        document = json.loads(report.read_text())
        first, second = (image["stages"] for image in document["images"])
        for shared in ("efa", "nccl", "aws-ofi-nccl"):
            assert first[shared]["key"] == second[shared]["key"]
            assert second[shared]["state"] == "cached", second
        built = [s["key"] for image in (first, second) for s in image.values()
                 if s["state"] == "built"]
        assert len(built) == len(set(built)) == summary["keys_to_build"]
        assert document["built"] == document["distinct_built"] == len(built)
        # Both images were tested (their checks ran and passed) and tagged: one summary line
        # per image, in matrix order (a substring such as "0 failed" would match "10 failed").
        summaries = check_summaries(result.stdout)
        assert [s.image for s in summaries] == tags, result.stdout[-3000:]
        assert all(s.ok > 0 and s.failed == 0 for s in summaries), summaries
        for tag in tags:
            subprocess.run(["docker", "image", "inspect", tag], check=True,
                           capture_output=True)
    finally:
        subprocess.run(["docker", "image", "rm", "--force", *tags], capture_output=True,
                       check=False)

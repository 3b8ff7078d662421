"""scripts/gpu_check.py reads nccl-tests' own output: checked on the recorded H200 run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs/real-hardware/h200-one-gpu.json"


def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts/gpu_check.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


def recorded(run: str) -> str:
    return str(json.loads(RECORD.read_text())["one_gpu"]["runs"][run]["output"])


def test_rows_of_a_real_sendrecv_run() -> None:
    module = gpu_check()
    rows = module.parse_rows(recorded("sendrecv_perf"))
    assert len(rows) == 26
    assert rows[0]["size"] == "8"
    assert rows[-1]["size"] == "268435456"
    at_256m = module.row_at(rows, "256M")
    assert at_256m["busbw_oop"] == "1691.9"
    assert at_256m["wrong_oop"] == "0"
    assert at_256m["wrong_ip"] == "N/A"


def test_avg_rows_and_the_version_lines() -> None:
    module = gpu_check()
    out = recorded("all_reduce_perf -o avg")
    rows = module.parse_rows(out)
    assert len(rows) == 26
    assert {r["redop"] for r in rows} == {"avg"}
    assert module.NCCL_VERSION.search(out).group(1) == "2.30.7+cuda13.0"
    tests = module.TESTS_VERSION.search(out)
    assert tests.group(2) == tests.group(3) == "23007"


def test_a_wrong_count_is_seen() -> None:
    module = gpu_check()
    line = ("     1048576        262144     float     sum      -1    10.59   98.99   98.99"
            "       3     2.84  368.98  368.98       0")
    rows = module.parse_rows(line)
    assert rows == [{**rows[0], "wrong_oop": "3", "wrong_ip": "0"}]


def test_codes_of_ncclgetversion() -> None:
    module = gpu_check()
    assert module.dotted(23007) == "2.30.7"
    assert module.dotted(2708) == "2.7.8"


TORCH_RECORD = ROOT / "docs/real-hardware/torch211/torch.json"


def torch_gpu_check() -> ModuleType:
    gpu_check()   # its sibling, imported by name as on a GPU host
    spec = importlib.util.spec_from_file_location("torch_gpu_check",
                                                  ROOT / "scripts/torch_gpu_check.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_torch_run_reads_nccls_version_line_and_process_group_version() -> None:
    """On the recorded H200 torch run: NCCL's own line and ProcessGroupNCCL's runtime version,
    from each job's real output."""
    module = torch_gpu_check()
    record = json.loads(TORCH_RECORD.read_text())
    for job in ("baseline", "trap", "arranged"):
        output = record[job]["output"]
        assert module.NCCL_LINE.findall(output) == ["2.28.9+cuda13.0"], job
        assert module.PG_VERSION.findall(output) == ["2.28.9"], job
    # The trap is the one job whose rank saw two libnccl; the arrangement mapped the built one.
    [trap] = record["trap"]["ranks"]
    assert trap["problem"].startswith("the process mapped 2 libnccl files")
    [arranged] = record["arranged"]["ranks"]
    assert arranged["problem"] is None
    assert arranged["mapped"] == [record["arranged"]["built"].replace(
        "libnccl.so.2", "libnccl.so.2.28.9")]

"""On-GPU checks of what imageforge built, run from an exported tree on any GPU host.

Usage (scripts/gpu-check.sh wraps it):
    python3 scripts/gpu_check.py --tree DIR --json OUT.json [--gpus 1|2] [--max-bytes 256M]

DIR is `invoke build --target efa-nccl --output DIR` plus, in DIR/deps/lib, the non-system
libraries the exported files need (scripts/gpu-bundle.sh makes both). Standard library only:
GPU hosts run whatever Python they have.

One GPU: all_reduce_perf (sum), sendrecv_perf and all_reduce_perf -o avg with NCCL_DEBUG=INFO
(a one-rank sum is a copy; sendrecv and avg run NCCL's kernels), then all_reduce_perf with the
built aws-ofi-nccl as NCCL's net plugin and no EFA device (it must fail over, not crash).
Two GPUs: all_reduce_perf -g 2 in one process; two ranks under mpirun; two ranks through the
plugin over libfabric's tcp provider with P2P and SHM off. Each check compares with the pins
recorded in DIR/imageforge-export.json. Exit status 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# NVLink multicast stays off: a program using it can take a shared host's GPUs out of service.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0"}
RUN_TIMEOUT = 300
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\S+)\s+(-?\d+)\s+(.*)$")
NCCL_VERSION = re.compile(r"NCCL INFO NCCL version (\S+)")
TESTS_VERSION = re.compile(r"nccl-tests version (\S+) nccl-headers=(\d+) nccl-library=(\d+)")
LOADED_NCCL = """\
import ctypes, os, sys
lib = ctypes.CDLL("libnccl.so.2")
code = ctypes.c_int()
assert lib.ncclGetVersion(ctypes.byref(code)) == 0
maps = {l.split(None, 5)[5].strip() for l in open("/proc/self/maps") if len(l.split(None, 5)) == 6}
print(code.value, *sorted(p for p in maps if "libnccl" in os.path.basename(p)))
"""


def dotted(code: int) -> str:
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


class Checker:
    def __init__(self, tree: Path, max_bytes: str) -> None:
        self.tree = tree
        self.max_bytes = max_bytes
        self.checks: list[dict[str, Any]] = []
        self.export = json.loads((tree / "imageforge-export.json").read_text())
        self.inputs = {s["name"]: s["inputs"] for s in self.export["stages"]}
        libs = [tree / "usr/local/lib", tree / "opt/amazon/efa/lib", tree / "deps/lib"]
        self.env = {**os.environ, **SAFE_ENV,
                    "LD_LIBRARY_PATH": ":".join([*map(str, libs),
                                                 os.environ.get("LD_LIBRARY_PATH", "")]),
                    "PATH": f"{tree / 'opt/nccl-tests/bin'}:{os.environ['PATH']}"}
        self.tests = tree / "opt/nccl-tests/bin"

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)

    def pin(self, stage: str) -> str:
        return str(self.inputs.get(stage, {}).get("version", "?"))

    def run(self, argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
        print("+", " ".join(argv), flush=True)
        started = time.monotonic()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                                  env={**self.env, **(env or {})}, check=False)
            out, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            partial = [p.decode(errors="replace") if isinstance(p, bytes) else p or ""
                       for p in (exc.stdout, exc.stderr)]
            out, rc = "".join(partial) + "\ntimed out", 124
        return {"argv": argv, "env": env or {}, "rc": rc,
                "seconds": round(time.monotonic() - started, 2), "output": out}

    def versions(self) -> dict[str, Any]:
        pin = self.pin("nccl")
        result = self.run([sys.executable, "-c", LOADED_NCCL])
        words = result["output"].split()
        loaded = dotted(int(words[0])) if result["rc"] == 0 and words else None
        paths = words[1:] if loaded else []
        self.check("ncclGetVersion (ctypes) returns the pin", loaded == pin,
                   f"{loaded} from {' '.join(paths) or '?'}; pinned {pin}")
        self.check("the libnccl loaded is the exported one",
                   len(paths) == 1 and paths[0].startswith(str(self.tree)), " ".join(paths))
        header = self.header_version()
        self.check("nccl.h declares the pin", header == pin, f"nccl.h {header}; pinned {pin}")
        return {"pinned": pin, "ncclGetVersion": loaded, "loaded": paths, "nccl.h": header,
                "aws-ofi-nccl": self.pin("aws-ofi-nccl"), "nccl-tests": self.pin("nccl-tests"),
                "ptx_and_sass": self.fatbin_archs()}

    def header_version(self) -> str | None:
        text = (self.tree / "usr/local/include/nccl.h").read_text(errors="replace")
        parts = [re.search(rf"#define NCCL_{p}\s+(\d+)", text)
                 for p in ("MAJOR", "MINOR", "PATCH")]
        return ".".join(m.group(1) for m in parts if m) if all(parts) else None

    def fatbin_archs(self) -> dict[str, list[str]] | None:
        """The SASS and PTX archs embedded in libnccl (cuobjdump, where the host has it)."""
        cuobjdump = shutil.which("cuobjdump")
        lib = next(iter(sorted((self.tree / "usr/local/lib").glob("libnccl.so.*.*"))), None)
        if cuobjdump is None or lib is None:
            return None
        found: dict[str, list[str]] = {}
        for kind in ("elf", "ptx"):
            out = self.run([cuobjdump, f"--list-{kind}", str(lib)])["output"]
            found[kind] = sorted(set(re.findall(r"sm_\d+a?|compute_\d+a?", out)))
        self.check("libnccl carries PTX for the newest arch (runs on newer GPUs)",
                   bool(found["ptx"]), f"SASS {found['elf']}, PTX {found['ptx']}")
        return found

    def perf(self, name: str, argv: list[str], env: dict[str, str] | None = None,
             expect_version: bool = True) -> dict[str, Any]:
        result = self.run(argv, {"NCCL_DEBUG": "INFO", **(env or {})})
        out = result["output"]
        rows = parse_rows(out)
        version = NCCL_VERSION.search(out)
        tests = TESTS_VERSION.search(out)
        wrong = [r for r in rows if r["wrong_oop"] not in ("0", "N/A")
                 or r["wrong_ip"] not in ("0", "N/A")]
        self.check(f"{name}: exits 0 with rows", result["rc"] == 0 and bool(rows),
                   f"rc {result['rc']}, {len(rows)} rows in {result['seconds']} s")
        self.check(f"{name}: #wrong is 0 on every row", bool(rows) and not wrong,
                   f"{len(wrong)} rows with errors" if wrong else f"{len(rows)} rows")
        if expect_version:
            seen = version.group(1).split("+")[0] if version else None
            self.check(f"{name}: NCCL version line is the pin", seen == self.pin("nccl"),
                       version.group(0) if version else "no 'NCCL version' line")
        if tests:
            self.check(f"{name}: nccl-headers equals nccl-library",
                       tests.group(2) == tests.group(3), tests.group(0))
        result.update(rows=rows, nccl_version=version.group(1) if version else None,
                      tests_line=tests.group(0) if tests else None,
                      net=net_lines(out), table=table_text(out))
        result["output"] = out[-20000:]
        return result

    def one_gpu(self) -> dict[str, Any]:
        size = ["-b", "8", "-e", self.max_bytes, "-f", "2", "-g", "1"]
        all_reduce = str(self.tests / "all_reduce_perf")
        sendrecv = str(self.tests / "sendrecv_perf")
        runs = {
            "all_reduce_perf": self.perf("all_reduce_perf", [all_reduce, *size]),
            "sendrecv_perf": self.perf("sendrecv_perf", [sendrecv, *size]),
            "all_reduce_perf -o avg": self.perf("all_reduce_perf -o avg",
                                                [all_reduce, *size, "-o", "avg"]),
        }
        plugin = self.plugin_path()
        run = self.perf("all_reduce_perf with the built plugin, no EFA device",
                        [str(self.tests / "all_reduce_perf"), "-b", "8", "-e", "1M", "-f", "2",
                         "-g", "1", "-o", "avg"],
                        {"NCCL_NET_PLUGIN": str(plugin), "NCCL_DEBUG_SUBSYS": "INIT,NET"})
        self.check("built plugin: NCCL falls back cleanly without EFA", run["rc"] == 0,
                   "; ".join(run["net"][-4:]) or "no NET lines")
        runs["plugin without EFA"] = run
        busbw = row_at(runs["sendrecv_perf"]["rows"], self.max_bytes)
        return {"runs": runs, "sendrecv_busbw_at_max": busbw}

    def two_gpus(self) -> dict[str, Any]:
        runs: dict[str, Any] = {}
        runs["all_reduce_perf -g 2"] = self.perf(
            "all_reduce_perf -g 2 (one process)",
            [str(self.tests / "all_reduce_perf"), "-b", "8", "-e", "1G", "-f", "2", "-g", "2"])
        mpirun = self.mpirun()
        base = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2",
                "-x", "LD_LIBRARY_PATH", "-x", "PATH", "-x", "NCCL_NVLS_ENABLE",
                "-x", "NCCL_DEBUG"]
        all_reduce = str(self.tests / "all_reduce_perf")
        runs["mpirun -np 2"] = self.perf(
            "mpirun -np 2 all_reduce_perf (one rank per GPU)",
            [*base, all_reduce, "-b", "8", "-e", "1G", "-f", "2", "-g", "1"])
        net_env = {"NCCL_NET_PLUGIN": str(self.plugin_path()), "FI_PROVIDER": "tcp",
                   "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
                   "NCCL_DEBUG_SUBSYS": "INIT,NET", "FI_EFA_USE_DEVICE_RDMA": "0"}
        exports = [w for k in net_env for w in ("-x", k)]
        run = self.perf(
            "mpirun -np 2 through the plugin (FI_PROVIDER=tcp, P2P and SHM off)",
            [*base, *exports, all_reduce, "-b", "8", "-e", "256M", "-f", "2", "-g", "1"], net_env)
        selected = [line for line in run["net"]
                    if "Selected provider" in line or "Using network" in line]
        self.check("two ranks through the plugin: NCCL used the OFI network",
                   any("OFI" in line or "Selected provider" in line for line in selected),
                   "; ".join(selected[:3]) or "no provider line")
        runs["plugin tcp"] = run
        return {"runs": runs,
                "busbw_at_1G": row_at(runs["all_reduce_perf -g 2"]["rows"], "1G"),
                "plugin_tcp_busbw_at_256M": row_at(run["rows"], "256M")}

    def fabric(self) -> dict[str, Any]:
        """What the exported libfabric sees on this host: its providers, and whether an EFA
        device answers (test-image --hardware's EFA checks need one)."""
        fi_info = str(self.tree / "opt/amazon/efa/bin/fi_info")
        providers = self.run([fi_info, "-l"])
        efa = self.run([fi_info, "-p", "efa", "-t", "FI_EP_RDM"])
        listed = re.findall(r"^(\S+):$", providers["output"], re.MULTILINE)
        self.check("exported fi_info runs here and lists providers",
                   providers["rc"] == 0 and bool(listed), ", ".join(listed))
        return {"providers": listed, "efa_rc": efa["rc"], "efa_output": efa["output"][-2000:]}

    def plugin_path(self) -> Path:
        lib = self.tree / "usr/local/lib"
        for name in ("libnccl-net-ofi.so", "libnccl-net.so"):
            if (lib / name).exists():
                return lib / name
        return lib / "libnccl-net.so"

    def mpirun(self) -> str:
        own = self.tree / "deps/bin/mpirun"
        return str(own) if own.exists() else (shutil.which("mpirun") or "mpirun")


def parse_rows(out: str) -> list[dict[str, str]]:
    rows = []
    for line in out.splitlines():
        match = ROW.match(line)
        if not match:
            continue
        rest = match.group(6).split()
        if len(rest) < 8:
            continue
        rows.append({"size": match.group(1), "count": match.group(2), "type": match.group(3),
                     "redop": match.group(4), "time_oop": rest[0], "algbw_oop": rest[1],
                     "busbw_oop": rest[2], "wrong_oop": rest[3], "time_ip": rest[4],
                     "algbw_ip": rest[5], "busbw_ip": rest[6], "wrong_ip": rest[7]})
    return rows


def row_at(rows: list[dict[str, str]], size: str) -> dict[str, str] | None:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    want = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    return next((r for r in rows if int(r["size"]) == want), None)


def net_lines(out: str) -> list[str]:
    keep = ("NET/", "Using network", "Selected provider", "net plugin", "NET/Plugin")
    return [line.strip() for line in out.splitlines() if any(k in line for k in keep)][:40]


def table_text(out: str) -> str:
    lines = [line for line in out.splitlines()
             if (line.startswith("#") and ("size" in line or "(B)" in line)) or ROW.match(line)
             or "Avg bus bandwidth" in line or "Out of bounds" in line]
    return "\n".join(lines)


def host_info() -> dict[str, str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True, check=False)
    return {"gpus": out.stdout.strip()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", required=True, type=Path)
    parser.add_argument("--json", required=True, type=Path)
    parser.add_argument("--gpus", type=int, default=1, choices=(1, 2))
    parser.add_argument("--max-bytes", default="256M")
    args = parser.parse_args()
    checker = Checker(args.tree.resolve(), args.max_bytes)
    report: dict[str, Any] = {"host": host_info(), "export": checker.export}
    report["versions"] = checker.versions()
    report["one_gpu"] = checker.one_gpu()
    if args.gpus == 2:
        report["two_gpus"] = checker.two_gpus()
    report["fabric"] = checker.fabric()
    report["not_run"] = [
        "all_reduce_perf -g 1 selecting the EFA provider (test-image --hardware, needs an EFA "
        "device: this host has none)",
        "fi_info -p efa -t FI_EP_RDM (needs an EFA device)",
    ]
    report["checks"] = checker.checks
    report["passed"] = all(c["ok"] for c in checker.checks)
    args.json.write_text(json.dumps(report, indent=2))
    failed = [c["check"] for c in checker.checks if not c["ok"]]
    print(f"\n{len(checker.checks) - len(failed)} of {len(checker.checks)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

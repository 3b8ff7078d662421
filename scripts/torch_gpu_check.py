"""A real torch through the NCCL imageforge built, on a GPU host, arranged as the image does.

Usage (scripts/torch-gpu-check.sh wraps it, with the nccl-tests checks of gpu_check.py):
    python3 scripts/torch_gpu_check.py --tree DIR --json OUT.json [--gpus N]

DIR is the unpacked bundle of a torch image (scripts/gpu-bundle.sh MANIFEST OUT training):
the files its stages made, of which torch's site-packages keeps only
`nvidia/nccl/lib/libnccl.so.2`, the image's symlink to the nccl stage's library. The host's
own torch must be the manifest's release (the same wheel). Three runs, each a torchrun job
with N ranks (all_reduce sums and averages at several sizes, DDP steps of a small model) whose
processes judge their own /proc/self/maps with the project's check (stages/nccl_loaded.py):
- the wheel as installed: its own libnccl, the baseline;
- the trap: LD_PRELOAD of the built library while the wheel's copy stays; the check must say
  two libnccl are mapped;
- the image's arrangement: the wheel's `libnccl.so.2` replaced by the image's symlink, pointing
  at the built library at its place in DIR (the wheel's file moved out of every search path,
  and put back at the end). No LD_PRELOAD, no LD_LIBRARY_PATH.
Standard library only, apart from torch in the ranks. NVLink multicast stays off in every
process (NCCL_NVLS_ENABLE=0). Exit 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stages"))
import gpu_check  # a sibling script, not a package
import nccl_loaded

SIZES = [1, 1000, 1 << 20, 1 << 24, 1 << 26]   # float32 elements: 4 B to 256 MiB
STEPS = 30
NCCL_LINE = re.compile(r"NCCL INFO NCCL version (\S+)")
PG_VERSION = re.compile(r"ProcessGroupNCCL[^\n]*?NCCL version: ([\d.]+)")
WHEEL_NCCL = "nvidia/nccl/lib/libnccl.so.2"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def host_site() -> Path:
    """The site-packages of the host's torch, found without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise SystemExit("torch_gpu_check: this host's python3 has no torch")
    return Path(spec.origin).parent.parent


def fill_wheel_nccl(tree: Path, site: Path) -> list[str]:
    """Put the host's own NCCL wheel file where the bundle left a `libnccl.so.V.sha256` record
    (an image whose nccl stage unpacked the NCCL wheel: gpu-bundle.sh ships no copy of it),
    only when its sha256 is the recorded one. Returns what it filled."""
    filled = []
    for record in sorted(tree.glob("**/lib/libnccl.so.*.sha256")):
        digest, name = record.read_text().split()
        wheel = site / WHEEL_NCCL
        if not wheel.is_file() or sha256(wheel) != digest:
            raise SystemExit(f"torch_gpu_check: {record.relative_to(tree)}: the image's {name} "
                             f"is the NCCL wheel's file with sha256 {digest[:16]}..., and this "
                             f"host's {wheel} is not; install the manifest's nvidia-nccl wheel")
        shutil.copyfile(wheel, record.with_name(name))
        record.unlink()
        filled.append(f"{name}: the host's {wheel}, sha256 {digest}")
    return filled


class TorchChecker(gpu_check.Checker):
    def __init__(self, tree: Path, gpus: int, work: Path) -> None:
        super().__init__(tree, "256M")
        self.gpus, self.work = gpus, work
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
        self.env["NCCL_NVLS_ENABLE"] = "0"
        self.site = host_site()
        links = [site / WHEEL_NCCL for site in tree.glob("opt/conda/lib/python*/site-packages")
                 if (site / WHEEL_NCCL).is_symlink()]
        if len(links) != 1:
            raise SystemExit(f"torch_gpu_check: {tree} holds no site-packages/{WHEEL_NCCL} "
                             "link; make the tree with scripts/gpu-bundle.sh MANIFEST OUT training")
        # The image's link names the library by its absolute path in the image.
        self.target = os.readlink(links[0])
        self.built = tree / self.target.lstrip("/")

    def job(self, name: str, expected: Path, source: str,
            env: dict[str, str] | None = None) -> dict[str, Any]:
        out = self.work / name.replace(" ", "-")
        out.mkdir()
        result = self.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={self.gpus}", __file__, "--rank-json", str(out),
                           "--expect", str(expected), "--version", self.pin("nccl"),
                           "--source", source],
                          {"NCCL_DEBUG": "INFO", "TORCH_CPP_LOG_LEVEL": "INFO", **(env or {})})
        ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
        log = result["output"]
        result.update(ranks=ranks, nccl_lines=sorted(set(NCCL_LINE.findall(log))),
                      pg_versions=sorted(set(PG_VERSION.findall(log))))
        result["output"] = log[-20000:]
        return result

    def train_checks(self, name: str, result: dict[str, Any]) -> None:
        ranks = result["ranks"]
        self.check(f"{name}: torchrun exits 0 with {self.gpus} rank(s)",
                   result["rc"] == 0 and len(ranks) == self.gpus,
                   f"rc {result['rc']}, {len(ranks)} rank reports")
        sums = [r for rank in ranks for r in rank["all_reduce"] if not r["right"]]
        self.check(f"{name}: all_reduce sum and avg are right at every size",
                   bool(ranks) and not sums,
                   f"{len(SIZES) * 2} reductions per rank" if not sums else f"wrong: {sums}")
        losses = [rank["losses"] for rank in ranks]
        self.check(f"{name}: {STEPS} DDP steps, the loss goes down",
                   bool(losses) and all(row[-1] < row[0] for row in losses),
                   "; ".join(f"{row[0]:.4f} -> {row[-1]:.4f}" for row in losses))

    def baseline(self) -> dict[str, Any]:
        wheel = self.site / WHEEL_NCCL
        result = self.job("wheel", wheel, "wheel")
        self.train_checks("the wheel's own NCCL", result)
        self.check("the wheel's own NCCL: one libnccl mapped, the wheel's",
                   all(r["problem"] is None for r in result["ranks"]) and bool(result["ranks"]),
                   "; ".join(str(r["problem"] or r["mapped"]) for r in result["ranks"]))
        return result

    def trap(self) -> dict[str, Any]:
        """LD_PRELOAD of the built library beside the wheel's copy: what the check must catch."""
        result = self.job("ld preload", self.built, "nccl stage",
                          {"LD_PRELOAD": str(self.built)})
        caught = [r["problem"] for r in result["ranks"]]
        self.check("the trap (LD_PRELOAD, wheel's copy kept): the check sees two libnccl",
                   bool(caught) and all(p and "mapped 2 libnccl" in p for p in caught),
                   "; ".join(map(str, caught)))
        return result

    def arranged(self) -> dict[str, Any]:
        wheel = self.site / WHEEL_NCCL
        kept = self.work / "wheel-nccl" / wheel.name
        kept.parent.mkdir()
        if not os.access(wheel.parent, os.W_OK):
            raise SystemExit(f"torch_gpu_check: {wheel.parent} is not writable; run as the user "
                             "that owns the host's torch")
        wheel_sha = sha256(wheel)
        shutil.move(wheel, kept)
        try:
            wheel.symlink_to(self.built)
            project = self.run([sys.executable, str(Path(nccl_loaded.__file__)),
                                self.pin("nccl"), str(wheel), "nccl stage"])
            self.check("the project's check (import torch) passes on the arrangement",
                       project["rc"] == 0, project["output"].strip())
            result = self.job("image arrangement", wheel, "nccl stage")
        finally:
            wheel.unlink()
            shutil.move(kept, wheel)
        built_sha = sha256(self.built)
        name = "the image's arrangement"
        self.train_checks(name, result)
        mapped = {m for r in result["ranks"] for m in r["mapped"]}
        self.check(f"{name}: each rank mapped one libnccl, the built one",
                   all(r["problem"] is None for r in result["ranks"]) and bool(result["ranks"])
                   and mapped == {os.path.realpath(self.built)},
                   f"{sorted(mapped)}; sha256 {built_sha[:12]} (the wheel's is {wheel_sha[:12]})")
        pin = self.pin("nccl")
        self.check(f"{name}: NCCL_DEBUG=INFO's version line is the pin",
                   [v.split("+")[0] for v in result["nccl_lines"]] == [pin],
                   ", ".join(result["nccl_lines"]) or "no 'NCCL version' line")
        self.check(f"{name}: ProcessGroupNCCL's runtime NCCL version is the pin",
                   result["pg_versions"] == [pin], ", ".join(result["pg_versions"]) or "none")
        headers = {r["headers"] for r in result["ranks"]}
        result.update(built=str(self.built), built_sha256=built_sha, wheel_sha256=wheel_sha,
                      link=self.target, headers=sorted(headers))
        return result


def rank_main(args: argparse.Namespace) -> int:
    """One torchrun rank: reductions, DDP steps, then what this process mapped."""
    # Only the ranks need torch.
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    reductions = []
    for n in SIZES:
        base = (torch.arange(n, device=device) % 97).float()
        for op, want in ((dist.ReduceOp.SUM, base * world + world * (world + 1) / 2),
                         (dist.ReduceOp.AVG, base + (world + 1) / 2)):
            x = base + rank + 1
            dist.all_reduce(x, op=op)
            torch.cuda.synchronize()
            reductions.append({"elements": n, "op": str(op).rsplit(".", 1)[-1],
                               "right": bool(torch.equal(x, want))})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)
    inputs = torch.randn(256, 32, generator=data).to(device)
    targets = inputs.sum(dim=1, keepdim=True) / 8
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    big = torch.ones(1 << 28, device=device)   # 1 GiB of float32
    times = []
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(big)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    dist.barrier()
    report = {"rank": rank, "world": world, "all_reduce": reductions, "losses": losses,
              "all_reduce_1GiB_ms": sorted(times[1:])[len(times[1:]) // 2],
              "mapped": nccl_loaded.mapped_nccl(),
              "problem": nccl_loaded.problem(args.version, args.expect, args.source),
              "headers": nccl_loaded.dotted(tuple(torch.cuda.nccl.version())[:3])}
    (Path(args.rank_json) / f"rank{rank}.json").write_text(json.dumps(report, indent=2))
    dist.destroy_process_group()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--rank-json", help=argparse.SUPPRESS)
    parser.add_argument("--expect", help=argparse.SUPPRESS)
    parser.add_argument("--version", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--fill-wheel-nccl", action="store_true",
                        help="only put the host's NCCL wheel file in the tree (fill_wheel_nccl)")
    args = parser.parse_args()
    if args.rank_json:
        return rank_main(args)
    if args.tree is not None and args.fill_wheel_nccl:
        for line in fill_wheel_nccl(args.tree.resolve(), host_site()):
            print(f"torch_gpu_check: filled {line}")
        return 0
    if args.tree is None or args.json is None:
        parser.error("--tree and --json are required")
    filled = fill_wheel_nccl(args.tree.resolve(), host_site())
    with tempfile.TemporaryDirectory(prefix="imageforge-torch-") as work:
        checker = TorchChecker(args.tree.resolve(), args.gpus, Path(work))
        for line in filled:
            checker.check("the NCCL wheel's library is the host wheel's file, by sha256", True,
                          line)
        host_torch = metadata.version("torch")
        pinned = checker.pin("pytorch")
        checker.check("the host's torch is the manifest's release",
                      host_torch.split("+")[0] == pinned, f"host {host_torch}; pinned {pinned}")
        report: dict[str, Any] = {"host": gpu_check.host_info(), "export": checker.export,
                                  "torch": host_torch, "gpus": args.gpus}
        report["baseline"] = checker.baseline()
        report["trap"] = checker.trap()
        report["arranged"] = checker.arranged()
    report["checks"] = checker.checks
    report["passed"] = all(c["ok"] for c in checker.checks)
    args.json.write_text(json.dumps(report, indent=2))
    failed = [c["check"] for c in checker.checks if not c["ok"]]
    print(f"\n{len(checker.checks) - len(failed)} of {len(checker.checks)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

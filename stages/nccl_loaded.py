"""Which libnccl a process really mapped: the pytorch wheel stage's check, and a library for
the GPU host's torch run (scripts/torch_gpu_check.py), so both judge with the same code.

    python nccl_loaded.py VERSION EXPECTED SOURCE

imports torch, then requires exactly one libnccl in /proc/self/maps, at the real path of
EXPECTED (SOURCE names who made it, for the message), whose ncclGetVersion is VERSION. It
prints the loaded library and torch's compile-time NCCL headers, and warns when their
major.minor differ: `torch.cuda.nccl.version()` reports the headers, never the library.
Exit 0 when it holds, 1 with one sentence when not.

Standard library only (and torch): it runs inside built images and on GPU hosts, with
whatever Python they have and none of imageforge.
"""

from __future__ import annotations

import ctypes
import os
import sys

MAPS = "/proc/self/maps"


def dotted(parts: tuple[int, ...]) -> str:
    return ".".join(map(str, parts))


def mapped_nccl(maps: str = MAPS) -> list[str]:
    """The libnccl files this process has mapped (`maps` is its /proc/PID/maps), by the path
    the loader opened."""
    with open(maps) as lines:
        # address perms offset dev inode path: the path is all the rest, spaces and all.
        paths = {fields[5].strip() for fields in (line.split(None, 5) for line in lines)
                 if len(fields) == 6}
    return sorted(path for path in paths if os.path.basename(path).startswith("libnccl.so"))


def library_version(path: str) -> tuple[int, int, int]:
    """ncclGetVersion of an already-mapped library: asks the library, not its headers."""
    code = ctypes.c_int()
    if ctypes.CDLL(path).ncclGetVersion(ctypes.byref(code)) != 0:
        raise RuntimeError(f"ncclGetVersion failed in {path}")
    return code.value // 10000, code.value // 100 % 100, code.value % 100


def problem(version: str, expected: str, source: str, maps: str = MAPS) -> str | None:
    """Why this process's NCCL is not the expected one, or None when it is."""
    want = tuple(int(x) for x in version.split("."))
    paths = mapped_nccl(maps)
    if len(paths) != 1:
        return f"the process mapped {len(paths)} libnccl files: {paths}"
    if paths[0] != os.path.realpath(expected):
        return (f"the process loaded {paths[0]}, not {os.path.realpath(expected)} "
                f"(the {source}'s library)")
    got = library_version(paths[0])
    if got != want:
        return f"{paths[0]} reports NCCL {dotted(got)}, the pin is {version}"
    return None


def main(argv: list[str], maps: str = MAPS) -> int:
    """The check as the image runs it: `argv` is VERSION EXPECTED SOURCE."""
    version, expected, source = argv
    # The check is about what importing torch maps.
    import torch

    found = problem(version, expected, source, maps)
    if found:
        print(f"import torch: {found}", file=sys.stderr)
        return 1
    path = mapped_nccl(maps)[0]
    loaded = library_version(path)
    headers = tuple(torch.cuda.nccl.version())[:3]
    print(f"libnccl loaded: {path} NCCL {dotted(loaded)}")
    print(f"torch {torch.__version__} compiled against NCCL headers {dotted(headers)}")
    if headers[:2] != loaded[:2]:
        print(f"warning: torch's NCCL headers {dotted(headers)} and the loaded NCCL "
              f"{dotted(loaded)} differ in major.minor", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

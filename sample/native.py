"""Compiling the one binary the sample upstream ships: SMDDP's ``libsmddp.so``.

Real SMDDP wheels carry a shared library, so the sample's do too; it is compiled at generation
time rather than committed. Its bytes are pinned, so the compile is made reproducible: no debug
info, no build-id, no compiler ident, stripped, and source paths mapped away. The result still
depends on the gcc and binutils versions, which are the same on every machine of the project.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

# -nostartfiles leaves out the C runtime's init objects, which carry the toolchain's version
# string; the library has no constructors that would need them.
_REPRODUCIBLE_FLAGS = (
    "-nostartfiles",
    "-O2",
    "-g0",
    "-fPIC",
    "-fno-ident",
    "-frandom-seed=sample",
    "-Wl,--build-id=none",
    "-Wl,--hash-style=gnu",
    "-s",
)


class NativeBuildError(Exception):
    """The C compiler is missing or failed."""


def _cc(args: list[str], cwd: Path) -> None:
    env = dict(os.environ, LC_ALL="C", SOURCE_DATE_EPOCH="0")
    compiler = os.environ.get("SAMPLE_CC", "gcc")
    try:
        proc = subprocess.run([compiler, *args], cwd=cwd, env=env, capture_output=True, check=False)
    except FileNotFoundError as exc:
        raise NativeBuildError(f"{compiler} not found: a C compiler is needed") from exc
    if proc.returncode != 0:
        raise NativeBuildError(
            f"{compiler} {' '.join(args)}: {proc.stderr.decode(errors='replace')}"
        )


def compile_shared_library(source: bytes, soname: str, needed_stub: tuple[bytes, str]) -> bytes:
    """Compile ``source`` into a shared library named ``soname``.

    ``needed_stub`` is (C source, soname) of a library to link against: the stub only gives
    the linker the symbols and the DT_NEEDED name, so the real library (libfabric in the
    image) is what gets loaded at run time.
    """
    stub_source, stub_soname = needed_stub
    with tempfile.TemporaryDirectory(prefix="sample-native-") as tmp:
        work = Path(tmp)
        (work / "stub.c").write_bytes(stub_source)
        (work / "lib.c").write_bytes(source)
        prefix_map = f"-ffile-prefix-map={work}=."
        _cc(
            [
                "-shared",
                *_REPRODUCIBLE_FLAGS,
                prefix_map,
                f"-Wl,-soname,{stub_soname}",
                "-o",
                stub_soname,
                "stub.c",
            ],
            work,
        )
        _cc(
            [
                "-shared",
                *_REPRODUCIBLE_FLAGS,
                prefix_map,
                f"-Wl,-soname,{soname}",
                "-o",
                soname,
                "lib.c",
                "-L.",
                f"-l:{stub_soname}",
            ],
            work,
        )
        return (work / soname).read_bytes()

"""stages/nccl_loaded.py, the check of which libnccl a process really mapped, against real
shared libraries built here with gcc (each exports ncclGetVersion, as libnccl does) and loaded
by a real process: one library at the expected path passes; two mapped, another path, or
another version each fail with the sentence the image check and the GPU host's torch run print.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def libnccl(where: Path, code: int) -> Path:
    """A real libnccl.so.2 whose ncclGetVersion answers `code` (22809 is 2.28.9)."""
    where.mkdir(parents=True)
    source = where / "nccl.c"
    source.write_text(f"int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}\n")
    library = where / "libnccl.so.2.x"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    (where / "libnccl.so.2").symlink_to(library.name)
    return where / "libnccl.so.2"


def problem(load: list[Path], version: str, expected: Path) -> str:
    """What nccl_loaded.problem says in a process that loaded `load` (ctypes, like dlopen)."""
    script = ("import ctypes, sys\n"
              f"sys.path.insert(0, {str(ROOT / 'stages')!r})\n"
              "import nccl_loaded\n"
              f"for path in {[str(p) for p in load]!r}:\n"
              "    ctypes.CDLL(path)\n"
              f"print(nccl_loaded.problem({version!r}, {str(expected)!r}, 'nccl stage'))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True, timeout=60)
    return result.stdout.strip()


@pytest.fixture
def built(tmp_path: Path) -> Path:
    return libnccl(tmp_path / "built", 22809)


def test_one_library_at_the_expected_path_with_the_pin_passes(built: Path) -> None:
    assert problem([built], "2.28.9", built) == "None"


def test_two_libraries_mapped_is_named_with_both_paths(built: Path, tmp_path: Path) -> None:
    wheel = libnccl(tmp_path / "wheel", 22809)
    said = problem([wheel, built], "2.28.9", built)
    assert said.startswith("the process mapped 2 libnccl files")
    assert str(built.resolve()) in said
    assert str(wheel.resolve()) in said


def test_another_library_than_the_expected_one_is_named(built: Path, tmp_path: Path) -> None:
    wheel = libnccl(tmp_path / "wheel", 22809)
    said = problem([wheel], "2.28.9", built)
    assert said == (f"the process loaded {wheel.resolve()}, not {built.resolve()} "
                    "(the nccl stage's library)")


def test_a_library_of_another_version_is_named_with_both_versions(tmp_path: Path) -> None:
    other = libnccl(tmp_path / "other", 23007)
    said = problem([other], "2.28.9", other)
    assert said == f"{other.resolve()} reports NCCL 2.30.7, the pin is 2.28.9"


def test_nothing_mapped_is_a_problem_too(built: Path) -> None:
    assert problem([], "2.28.9", built) == "the process mapped 0 libnccl files: []"

"""stages/nccl_loaded.py, the check of which libnccl a process really mapped, against real
shared libraries built here with gcc (each exports ncclGetVersion, as libnccl does) and the real
/proc/self/maps of a process that loaded them: one library at the expected path passes; two
mapped, another path, or another version each fail with the sentence the image check and the
GPU host's torch run print. The judging runs in this process (so mutation testing sees it); the
script text runs as the image runs it, `python -c`, too.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import types
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from stages import nccl_loaded, pytorch_wheel


def libnccl(where: Path, code: int, answer: int = 0) -> Path:
    """A real libnccl.so.2 whose ncclGetVersion sets `code` (22809 is 2.28.9) and returns
    `answer` (ncclSuccess is 0)."""
    where.mkdir(parents=True)
    source = where / "nccl.c"
    # A null pointer is refused as libnccl refuses it (ncclInvalidArgument, 4).
    source.write_text("int ncclGetVersion(int *v) { if (!v) return 4; "
                      f"*v = {code}; return {answer}; }}\n")
    library = where / "libnccl.so.2.x"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    (where / "libnccl.so.2").symlink_to(library.name)
    return where / "libnccl.so.2"


def maps_of(load: list[Path], out: Path) -> str:
    """The /proc/self/maps of a real process that loaded `load` (ctypes, like dlopen), kept in
    `out` so that the check reads it here, as that process would have read its own."""
    script = ("import ctypes, sys\n"
              "for path in sys.argv[2:]:\n"
              "    ctypes.CDLL(path)\n"
              "with open('/proc/self/maps') as maps, open(sys.argv[1], 'w') as saved:\n"
              "    saved.write(maps.read())\n")
    subprocess.run([sys.executable, "-c", script, str(out), *map(str, load)], check=True,
                   timeout=60)
    return str(out)


def problem(load: list[Path], version: str, expected: Path, tmp_path: Path) -> str | None:
    """What nccl_loaded.problem says of a process that loaded `load`."""
    return nccl_loaded.problem(version, str(expected), "nccl stage",
                               maps_of(load, tmp_path / "maps"))


Build = Callable[..., Path]


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """libnccl(folder, code, answer) under one folder for the module, each built once."""
    # A name of its own: the loader keeps what it loaded by path, and a later session in this
    # process (mutation testing runs several) may reuse the same temporary path.
    root, made = tmp_path_factory.mktemp(f"libnccl-{uuid.uuid4().hex[:8]}"), {}

    def made_once(name: str, code: int, answer: int = 0) -> Path:
        if (name, code, answer) not in made:
            made[name, code, answer] = libnccl(root / f"{name}-{code}-{answer}", code, answer)
        return made[name, code, answer]
    return made_once


@pytest.fixture
def built(build: Build) -> Path:
    return build("built", 22809)


def test_one_library_at_the_expected_path_with_the_pin_passes(built: Path,
                                                              tmp_path: Path) -> None:
    # `expected` is the symlink the image has; the process maps the file it points at.
    assert problem([built], "2.28.9", built, tmp_path) is None


def test_two_libraries_mapped_is_named_with_both_paths(built: Path, build: Build,
                                                       tmp_path: Path) -> None:
    wheel = build("wheel", 22809)
    said = problem([wheel, built], "2.28.9", built, tmp_path)
    both = sorted([str(built.resolve()), str(wheel.resolve())])
    assert said == f"the process mapped 2 libnccl files: {both}"


def test_another_library_than_the_expected_one_is_named(built: Path, build: Build,
                                                        tmp_path: Path) -> None:
    wheel = build("wheel", 22809)
    said = problem([wheel], "2.28.9", built, tmp_path)
    assert said == (f"the process loaded {wheel.resolve()}, not {built.resolve()} "
                    "(the nccl stage's library)")


def test_a_library_of_another_version_is_named_with_both_versions(build: Build,
                                                                  tmp_path: Path) -> None:
    other = build("other", 23007)
    said = problem([other], "2.28.9", other, tmp_path)
    assert said == f"{other.resolve()} reports NCCL 2.30.7, the pin is 2.28.9"


def test_nothing_mapped_is_a_problem_too(built: Path, tmp_path: Path) -> None:
    assert problem([], "2.28.9", built, tmp_path) == "the process mapped 0 libnccl files: []"


def test_a_library_under_a_path_with_spaces_is_read_whole(tmp_path: Path) -> None:
    # /proc/PID/maps prints the path unquoted after five fields, spaces and all.
    spaced = libnccl(tmp_path / "my libs" / "nccl 2", 22809)
    maps = maps_of([spaced], tmp_path / "maps")
    assert nccl_loaded.mapped_nccl(maps) == [str(spaced.resolve())]
    assert nccl_loaded.problem("2.28.9", str(spaced), "nccl stage", maps) is None


def test_only_files_named_libnccl_so_count(build: Build, tmp_path: Path) -> None:
    # A plugin named like NCCL (libnccl-net.so) or a library that merely contains the name
    # is not NCCL itself; anonymous mappings ([heap], [stack]) have no path at all.
    plugin_dir, renamed_dir = tmp_path / "plugin", tmp_path / "renamed"
    plugin_dir.mkdir()
    renamed_dir.mkdir()
    source = build("real", 22809).resolve()
    plugin, renamed = plugin_dir / "libnccl-net.so", renamed_dir / "mylibnccl.so.2"
    plugin.write_bytes(source.read_bytes())
    renamed.write_bytes(source.read_bytes())
    maps = maps_of([plugin, renamed, source], tmp_path / "maps")
    assert nccl_loaded.mapped_nccl(maps) == [str(source)]


def test_by_default_the_process_reads_its_own_maps(tmp_path: Path) -> None:
    # What the image's check and the GPU host's ranks rely on: no argument, this process.
    loaded = libnccl(tmp_path / uuid.uuid4().hex, 22809)
    ctypes.CDLL(str(loaded))
    assert str(loaded.resolve()) in nccl_loaded.mapped_nccl()


@pytest.mark.parametrize(("code", "version"), [(22809, (2, 28, 9)), (21003, (2, 10, 3)),
                                                (30000, (3, 0, 0)), (29999, (2, 99, 99))])
def test_library_version_asks_the_library(build: Build, code: int,
                                          version: tuple[int, int, int]) -> None:
    # NCCL 2.9 and later encode their version as major * 10000 + minor * 100 + patch.
    assert nccl_loaded.library_version(str(build("lib", code))) == version


def test_a_failing_ncclgetversion_is_an_error_naming_the_library(build: Build) -> None:
    broken = build("broken", 22809, 1)
    with pytest.raises(RuntimeError) as error:
        nccl_loaded.library_version(str(broken))
    assert str(error.value) == f"ncclGetVersion failed in {broken}"


def test_dotted_joins_the_parts_of_a_version() -> None:
    assert nccl_loaded.dotted((2, 28, 9)) == "2.28.9"


def standin_torch(headers: tuple[object, ...]) -> types.ModuleType:
    """torch as main() reads it: its version and torch.cuda.nccl.version(), the NCCL headers
    it was compiled with (a stand-in: the real torch is a 554 MB wheel of CUDA libraries that
    cannot be installed for unit tests; what it maps is the library loaded into `maps`)."""
    torch = types.ModuleType("torch")
    torch.__version__ = "2.14.1"  # type: ignore[attr-defined]
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        nccl=types.SimpleNamespace(version=lambda: headers))
    return torch


@pytest.mark.parametrize("headers", [(2, 28, 9), (2, 28, 3), (2, 28, 9, "a0")],
                         ids=["same", "another-patch", "with-suffix"])
def test_main_prints_the_loaded_library_and_the_headers(
        built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, headers: tuple[object, ...]) -> None:
    monkeypatch.setitem(sys.modules, "torch", standin_torch(headers))
    maps = maps_of([built], tmp_path / "maps")
    assert nccl_loaded.main(["2.28.9", str(built), "nccl stage"], maps) == 0
    out, err = capsys.readouterr()
    # torch.cuda.nccl.version() may carry a suffix: only major.minor.patch are printed.
    assert out == (f"libnccl loaded: {built.resolve()} NCCL 2.28.9\n"
                   f"torch 2.14.1 compiled against NCCL headers 2.28.{headers[2]}\n")
    assert err == ""  # another patch of the headers is no warning


def test_main_warns_when_the_headers_differ_in_major_minor(
        built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", standin_torch((2, 27, 9)))
    maps = maps_of([built], tmp_path / "maps")
    assert nccl_loaded.main(["2.28.9", str(built), "NCCL wheel"], maps) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"libnccl loaded: {built.resolve()} NCCL 2.28.9"
    assert err == ("warning: torch's NCCL headers 2.27.9 and the loaded NCCL 2.28.9 differ in "
                   "major.minor\n")


def test_main_fails_with_one_sentence_naming_the_problem(
        built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", standin_torch((2, 28, 9)))
    maps = maps_of([built], tmp_path / "maps")
    assert nccl_loaded.main(["2.30.7", str(built), "NCCL wheel"], maps) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"import torch: {built.resolve()} reports NCCL 2.28.9, the pin is 2.30.7\n"


def test_main_names_who_made_the_library_it_expected(
        built: Path, build: Build, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", standin_torch((2, 28, 9)))
    wheel = build("wheel", 22809)
    assert nccl_loaded.main(["2.28.9", str(built), "NCCL wheel"],
                            maps_of([wheel], tmp_path / "maps")) == 1
    assert capsys.readouterr().err == (f"import torch: the process loaded {wheel.resolve()}, not "
                                       f"{built.resolve()} (the NCCL wheel's library)\n")


def run_script(built: Path, tmp_path: Path, version: str) -> subprocess.CompletedProcess[str]:
    """The check's text run as the pytorch wheel stage runs it, `python -c LOADED VERSION
    EXPECTED SOURCE`, in a process whose `import torch` loads `built`, as torch's preload does
    (torch itself is a stand-in on disk: see standin_torch)."""
    package = tmp_path / "site" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import ctypes, types\n"
        f"ctypes.CDLL({str(built)!r})\n"
        "__version__ = '2.14.1'\n"
        "cuda = types.SimpleNamespace(nccl=types.SimpleNamespace(version=lambda: (2, 28, 9)))\n")
    env = {**os.environ, "PYTHONPATH": str(package.parent)}
    return subprocess.run([sys.executable, "-c", pytorch_wheel.LOADED, version, str(built),
                           "nccl stage"], capture_output=True, text=True, env=env, check=False,
                          timeout=60)


def test_the_script_text_passes_as_the_image_runs_it(built: Path, tmp_path: Path) -> None:
    result = run_script(built, tmp_path, "2.28.9")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines() == [f"libnccl loaded: {built.resolve()} NCCL 2.28.9",
                                          "torch 2.14.1 compiled against NCCL headers 2.28.9"]


def test_the_script_text_fails_as_the_image_runs_it(built: Path, tmp_path: Path) -> None:
    result = run_script(built, tmp_path, "2.30.7")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"import torch: {built.resolve()} reports NCCL 2.28.9, the pin is "
                             "2.30.7\n")

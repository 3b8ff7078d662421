"""What real NCCL, aws-ofi-nccl and nccl-tests need from their recipes, on the rendered text.

Each test stands for a defect the sample never showed and the real sources did (the real
build in tests/integration/test_real_parts.py checks the result inside the image).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.planning.dockerfile import APT_CLEAN
from stages import STAGES
from stages.nccl import gencode, reproducible_nvcc

ROOT = Path(__file__).resolve().parents[2]
REAL = "manifests/real-efa-nccl.toml"


pytestmark = pytest.mark.usefixtures("in_repo_root")


def recipes(*sets: str, manifest: str = REAL, target: str = "efa-nccl") -> dict[str, str]:
    planned = project.plan(Workspace(registry=STAGES,
                                            manifest=Path(manifest), overrides=sets), target)
    return {s.name: s.recipe for s in planned.stages}


def make_lines(recipe: str) -> list[str]:
    return [line for line in recipe.splitlines() if re.search(r"\bmake\b", line)]


def test_every_make_line_of_nccl_and_nccl_tests_gets_nvcc_gencode() -> None:
    found = recipes()
    for stage in ("nccl", "nccl-tests"):
        lines = make_lines(found[stage])
        assert lines, stage
        for line in lines:
            assert "NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90" in line, (stage, line)


def test_only_tests_narrows_nccl_tests_make_to_those_binaries() -> None:
    """nccl-tests' src/Makefile builds $(BIN_FILES_LIST:%=%_perf); a command-line value
    overrides its own list, in the sub-make too."""
    (line,) = make_lines(recipes("stages.nccl-tests.only_tests=all_reduce,sendrecv")
                         ["nccl-tests"])
    assert "'BIN_FILES_LIST=all_reduce sendrecv'" in line
    assert not any("BIN_FILES_LIST" in line for line in make_lines(recipes()["nccl-tests"]))


def test_nvcc_names_its_temporary_files_after_the_object_in_both_nvcc_stages() -> None:
    found = recipes()
    for stage in ("nccl", "nccl-tests"):
        flag = found[stage].index("NVCC_APPEND_FLAGS")
        assert "-objtemp" in found[stage][flag:flag + 80], stage
        # Set before the make line that runs nvcc.
        assert flag < found[stage].index("make -j"), stage
    # NCCL links its relocatable device code; nccl-tests has none to link.
    assert "-nodlink" not in found["nccl"]
    assert "-objtemp -nodlink" in found["nccl-tests"]
    # Seed 000's CUDA 11.1 nvcc has no -objtemp.
    seed = recipes(manifest="manifests/efa-nccl.toml")
    assert "NVCC_APPEND_FLAGS" not in seed["nccl"] + seed["nccl-tests"]


@pytest.mark.parametrize(("cuda", "flagged"), [
    ("13.0", True), ("12.4", True), ("12.4.1", True), ("12.3", False), ("11.3", False),
    (None, False), ("", False)])
def test_objtemp_only_from_the_nvcc_that_has_it(cuda: str | None, flagged: bool) -> None:
    assert bool(reproducible_nvcc(cuda)) is flagged
    # A user's own NVCC_APPEND_FLAGS is kept, -objtemp added after it.
    if flagged:
        assert "${NVCC_APPEND_FLAGS:+$NVCC_APPEND_FLAGS }-objtemp" in reproducible_nvcc(cuda)[0]


def test_every_apt_step_removes_what_differs_between_runs() -> None:
    found = recipes("image.apt=true")
    apt_steps = {name: recipe for name, recipe in found.items() if "apt-get" in recipe}
    # The real efa stand-in runs apt (its pkgcache.bin differed); so do base and the plugin.
    assert {"base", "efa", "aws-ofi-nccl"} <= set(apt_steps)
    for name, recipe in apt_steps.items():
        assert recipe.count("apt-get update") == recipe.count(APT_CLEAN), name
    for path in ("/var/cache/apt/*.bin", "/var/log/dpkg.log", "/var/lib/apt/lists/*"):
        assert path in APT_CLEAN
    # The installer runs apt itself, also where the recipe fetches no lists (apt = false).
    assert APT_CLEAN in recipes()["efa"]


def test_gencode_adds_ptx_for_the_newest_arch_only() -> None:
    codes = gencode(["8.0", "9.0", "7.0"])
    assert codes.split() == [
        "-gencode=arch=compute_70,code=sm_70", "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90"]


def test_only_shared_libraries_unless_static_is_asked_for() -> None:
    assert "rm -f /out/usr/local/lib/libnccl_static.a" in recipes()["nccl"]
    assert "libnccl_static.a" not in recipes("stages.nccl.static=true")["nccl"]


def test_nccl_2_19_and_later_check_for_python3_or_install_it() -> None:
    assert "needs python3" in recipes()["nccl"]
    installed = recipes("image.apt=true")["nccl"]
    assert re.search(r"apt-get install .*python3", installed), installed
    # The sample's NCCL 2.10 runs no python while it builds.
    old = recipes("stages.nccl.version=2.18.6")["nccl"]
    assert "python3" not in old


def test_only_funcs_reaches_both_make_lines() -> None:
    lines = make_lines(recipes("stages.nccl.only_funcs=AllReduce Sum f32 * *")["nccl"])
    assert len(lines) == 2
    assert all("'ONLY_FUNCS=AllReduce Sum f32 * *'" in line or
               "ONLY_FUNCS=AllReduce Sum f32 * *" in line for line in lines), lines


def test_plugin_from_an_exported_tree_gets_its_release_version() -> None:
    recipe = recipes()["aws-ofi-nccl"]
    assert "echo 1.21.1 > .release_version;" in recipe
    assert recipe.index(".release_version") < recipe.index("./autogen.sh")
    # Releases before 1.19 take their version from configure.ac and need no file.
    assert ".release_version" not in recipes("stages.aws-ofi-nccl.version=1.18.0")["aws-ofi-nccl"]


def test_plugin_gets_no_with_nccl_from_1_5() -> None:
    assert "--with-nccl" not in recipes()["aws-ofi-nccl"]
    old = recipes(manifest="manifests/efa-nccl.toml")["aws-ofi-nccl"]
    assert "--with-nccl=/usr/local" in old


def test_builders_that_link_libfabric_are_built_from_efa() -> None:
    for stage in ("aws-ofi-nccl", "nccl-tests"):
        planned = project.plan(Workspace(registry=STAGES, manifest=Path(REAL)), "efa-nccl")
        assert planned.registry[stage].parent == "efa", stage


def test_image_stage_removes_every_other_libnccl_and_keeps_the_plugin(tmp_path: Path) -> None:
    recipe = recipes()["efa-nccl"]
    assert "/usr/lib/x86_64-linux-gnu" in recipe
    assert "rm -f /usr/include/nccl.h" in recipe
    # Run the rendered find on a directory laid out as a CUDA base plus the built plugin.
    find = re.search(r"find (.*?) -maxdepth 1 (.*?) -print -delete", recipe)
    assert find, recipe
    for name in ("libnccl.so", "libnccl.so.2", "libnccl.so.2.27.7", "libnccl_static.a",
                 "libnccl-net.so", "libnccl-net-ofi.so", "libcudart.so.13"):
        (tmp_path / name).write_text("x")
    subprocess.run(["bash", "-c", f"find {tmp_path} -maxdepth 1 {find.group(2)} -delete"],
                   check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "libcudart.so.13", "libnccl-net-ofi.so", "libnccl-net.so"]
    # The sample keeps its NCCL in /opt/conda: /usr/local/lib (where its plugin is) is searched.
    sample = recipes(manifest="manifests/sample.toml")["efa-nccl"]
    assert "/usr/local/lib" in sample
    assert "! -path '/opt/conda/*'" in sample


TARBALL = ("stages.aws-ofi-nccl.url=http://127.0.0.1:9/aws-ofi-nccl-{version}.tar.gz",
           f"stages.aws-ofi-nccl.sha256={'0' * 64}")


def bundles() -> Path:
    """Where the real upstream git bundles are, as scripts/real-upstream.sh finds them."""
    for candidate in (os.environ.get("IMAGEFORGE_UPSTREAM_BUNDLES"), ROOT / "shared/upstream",
                      ROOT.parent / "shared/upstream"):
        if candidate and (Path(candidate) / "aws-ofi-nccl.bundle").is_file():
            return Path(candidate)
    raise AssertionError("aws-ofi-nccl.bundle not found: set IMAGEFORGE_UPSTREAM_BUNDLES")


@pytest.fixture(scope="module")
def tag_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real aws-ofi-nccl v1.21.1 as GitHub's auto-generated tag archive has it (git
    archive: no .git, no .release_version, no configure)."""
    work = tmp_path_factory.mktemp("ofi")
    subprocess.run(["git", "clone", "--quiet", "--bare", str(bundles() / "aws-ofi-nccl.bundle"),
                    str(work / "repo.git")], check=True)
    archive = work / "aws-ofi-nccl-1.21.1.tar.gz"
    subprocess.run(["git", "-C", str(work / "repo.git"), "archive", "--format=tar.gz",
                    "--prefix=aws-ofi-nccl-1.21.1/", "-o", str(archive), "v1.21.1"], check=True)
    return archive


def chain(recipe: str, until: str) -> list[str]:
    """The steps of the recipe's RUN (its && chain), up to the one starting with `until`."""
    lines = recipe[recipe.index("RUN "):].splitlines()[1:]
    steps = [line.strip().removesuffix("\\").strip().removeprefix("&& ") for line in lines]
    return steps[:next(i for i, step in enumerate(steps) if step.startswith(until))]


def run_chain(steps: list[str], src: Path, work: Path) -> subprocess.CompletedProcess[str]:
    script = " && ".join(steps).replace("/src/", f"{src}/").replace("/tmp/aws-ofi-nccl",
                                                                       str(work))
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, cwd=work.parent,
                          check=False)


def test_plugin_from_a_release_tarball_is_a_url_source_pinned_by_sha256() -> None:
    planned = project.plan(Workspace(registry=STAGES,
                                            manifest=Path(REAL), overrides=TARBALL), "efa-nccl")
    stage = next(s for s in planned.stages if s.name == "aws-ofi-nccl")
    assert "tar -xf /src/aws-ofi-nccl-1.21.1.tar.gz --strip-components=1" in stage.recipe
    assert "from=src-aws-ofi-nccl,target=/src" in stage.recipe
    git = next(s for s in project.plan(Workspace(registry=STAGES,
                                                        manifest=Path(REAL)), "efa-nccl").stages
               if s.name == "aws-ofi-nccl")
    assert stage.key != git.key


def test_a_real_tag_archive_needs_the_release_version_and_gets_it(tag_archive: Path,
                                                                  tmp_path: Path) -> None:
    steps = chain(recipes(*TARBALL)["aws-ofi-nccl"], "./configure")
    assert any(".release_version" in step for step in steps), steps
    # Without the version file, the real autogen.sh stops as it does on GitHub's archives.
    bare = [step for step in steps if ".release_version" not in step]
    result = run_chain(bare, tag_archive.parent, tmp_path / "bare")
    assert result.returncode != 0
    assert "No version found" in result.stdout + result.stderr
    result = run_chain(steps, tag_archive.parent, tmp_path / "src")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "src/.release_version").read_text().strip() == "1.21.1"
    assert "1.21.1" in (tmp_path / "src/configure").read_text()[:4000]


def test_a_failed_step_before_the_version_file_fails_the_build(tmp_path: Path) -> None:
    # A missing tarball must stop the chain; an unbraced `a || b` would carry on.
    steps = chain(recipes(*TARBALL)["aws-ofi-nccl"], "./configure")
    (tmp_path / "empty").mkdir()
    result = run_chain(steps, tmp_path / "empty", tmp_path / "src")
    assert result.returncode != 0
    assert not list(tmp_path.rglob(".release_version"))
    assert not (tmp_path / "src/configure").exists()

"""Builds every sample component on the host with the stage commands, and checks the results.

The builds share one generated upstream and one work directory per module; each component is
built once (module-scoped fixtures) and then inspected by several tests.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from sample.generate import generate
from sample.hostbuild import BuildFailed, HostBuild, python_in_conda

# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def hb(tmp_path_factory: pytest.TempPathFactory) -> HostBuild:
    upstream = tmp_path_factory.mktemp("upstream")
    generate(upstream)
    return HostBuild(upstream, tmp_path_factory.mktemp("work"))


@pytest.fixture(scope="module")
def efa(hb: HostBuild) -> Path:
    return hb.build_efa("1.14.1")


@pytest.fixture(scope="module")
def nccl(hb: HostBuild) -> Path:
    """NCCL v2.10.3-1 built with src.build + pkg.txz.build and extracted into a prefix."""
    return hb.build_nccl("v2.10.3-1")


@pytest.fixture(scope="module")
def nccl_278(hb: HostBuild) -> Path:
    hb.build_nccl("v2.7.8-1", package=False)
    return hb.nccl_build_dir("v2.7.8-1")


@pytest.fixture(scope="module")
def torch_site(hb: HostBuild, nccl: Path) -> Path:
    return hb.build_pytorch("v1.10.2", nccl)


def run(
    cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, env={**os.environ, **(env or {})}, cwd=cwd, capture_output=True, text=True, check=False
    )


def library_path(*dirs: Path) -> dict[str, str]:
    return {"LD_LIBRARY_PATH": os.pathsep.join(str(d) for d in dirs)}


def nccl_version_code(lib: Path) -> int:
    nccl = ctypes.CDLL(str(lib))
    version = ctypes.c_int()
    assert nccl.ncclGetVersion(ctypes.byref(version)) == 0
    return version.value


# ---------------------------------------------------------------------------------- EFA


def test_efa_installer_installs_libfabric_and_openmpi(hb: HostBuild, efa: Path) -> None:
    lib = hb.efa_prefix / "lib"
    assert (lib / "libfabric.so.1.13.2").is_file()
    assert os.readlink(lib / "libfabric.so.1") == "libfabric.so.1.13.2"
    assert os.readlink(lib / "libfabric.so") == "libfabric.so.1"
    header = (hb.efa_prefix / "include/rdma/fabric.h").read_text()
    for line in (
        "#define FI_MAJOR_VERSION 1",
        "#define FI_MINOR_VERSION 13",
        "#define FI_REVISION_VERSION 2",
        "uint32_t fi_version(void);",
    ):
        assert line in header
    fabric = ctypes.CDLL(str(lib / "libfabric.so"))
    assert fabric.fi_version() == (1 << 16) | 13
    for name in (
        "lib/libmpi.so",
        "lib/libmpi.so.40",
        "include/mpi.h",
        "bin/mpicc",
        "bin/mpirun",
        "bin/ompi_info",
    ):
        assert (hb.mpi_prefix / name).exists(), name
    mpi = ctypes.CDLL(str(hb.mpi_prefix / "lib/libmpi.so"))
    for symbol in (
        "MPI_Init",
        "MPI_Finalize",
        "MPI_Comm_rank",
        "MPI_Comm_size",
        "MPI_Get_library_version",
    ):
        assert hasattr(mpi, symbol)
    assert (efa / "etc/ld.so.conf.d/efa.conf").read_text() == "/opt/amazon/efa/lib\n"
    installed = (efa / "opt/amazon/efa_installed_packages").read_text()
    assert "# EFA installer version: 1.14.1" in installed
    assert "libfabric-aws-1.13.2+gdr" in installed


@pytest.mark.usefixtures("efa")
def test_fi_info_version_and_provider_listing(hb: HostBuild) -> None:
    fi_info = str(hb.efa_prefix / "bin/fi_info")
    version = run([fi_info, "--version"])
    assert version.returncode == 0
    assert version.stdout.splitlines()[:2] == ["fi_info: 1.13.2amzn1.0", "libfabric: 1.13.2amzn1.0"]
    rdm = run([fi_info, "-p", "efa", "-t", "FI_EP_RDM"])
    assert rdm.returncode == 0
    assert rdm.stdout.splitlines()[:6] == [
        "provider: efa",
        "    fabric: EFA-fe80::e5:56ff:fe34:56a8",
        "    domain: efa_0-rdm",
        "    version: 2.0",
        "    type: FI_EP_RDM",
        "    protocol: FI_PROTO_EFA",
    ]
    assert all(t == "    type: FI_EP_RDM" for t in rdm.stdout.splitlines() if "type:" in t)
    everything = run([fi_info, "-p", "efa"]).stdout
    assert [line for line in everything.splitlines() if line.startswith("provider")] == [
        "provider: efa",
        "provider: efa",
        "provider: efa;ofi_rxd",
    ]
    missing = run([fi_info, "-p", "verbs"])
    assert missing.returncode != 0
    assert "fi_getinfo: -61" in missing.stderr
    assert run([fi_info, "--bogus"]).returncode != 0


def _unpacked_installer(hb: HostBuild, version: str, dest: Path) -> Path:
    with tarfile.open(hb.upstream / "files" / f"aws-efa-installer-{version}.tar.gz") as tar:
        tar.extractall(dest, filter="tar")
    return dest / "aws-efa-installer"


def test_efa_installer_1_11_2_bundles_libfabric_1_11_1(hb: HostBuild, tmp_path: Path) -> None:
    installer = _unpacked_installer(hb, "1.11.2", tmp_path)
    root = tmp_path / "root"
    proc = run(
        ["./efa_installer.sh", "-y", "--skip-kmod", "-g", "--skip-limit-conf"],
        {"EFA_INSTALL_ROOT": str(root)},
        installer,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    version = run([str(root / "opt/amazon/efa/bin/fi_info"), "--version"]).stdout
    assert "libfabric: 1.11.1amzn1.0" in version
    assert not (root / "etc/security/limits.d/efa.conf").exists()


def test_efa_installer_usage_and_unknown_flags(hb: HostBuild, tmp_path: Path) -> None:
    installer = _unpacked_installer(hb, "1.15.1", tmp_path)
    helped = run(["./efa_installer.sh", "--help"], cwd=installer)
    assert helped.returncode == 0
    for flag in (
        "--yes",
        "--skip-kmod",
        "--enable-gdr",
        "--skip-limit-conf",
        "--no-verify",
        "--debug-packages",
        "--minimal",
    ):
        assert flag in helped.stdout
    bad = run(["./efa_installer.sh", "-y", "--frobnicate"], cwd=installer)
    assert bad.returncode == 1
    assert "Unknown option: --frobnicate" in bad.stderr
    assert "Usage:" in bad.stderr


def test_efa_installer_fails_loudly_when_a_compile_fails(hb: HostBuild, tmp_path: Path) -> None:
    installer = _unpacked_installer(hb, "1.14.1", tmp_path)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "gcc").write_text("#!/bin/sh\necho 'gcc: internal error' >&2\nexit 4\n")
    (fake_bin / "gcc").chmod(0o755)
    env = {"EFA_INSTALL_ROOT": str(tmp_path / "root"), "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    proc = run(["./efa_installer.sh", "-y", "--skip-kmod", "-g"], env, installer)
    assert proc.returncode != 0
    assert "installation complete" not in proc.stdout


def test_efa_installer_needs_yes_when_not_interactive(hb: HostBuild, tmp_path: Path) -> None:
    installer = _unpacked_installer(hb, "1.14.1", tmp_path)
    proc = subprocess.run(
        ["./efa_installer.sh", "--skip-kmod"],
        cwd=installer,
        input="",
        env={**os.environ, "EFA_INSTALL_ROOT": str(tmp_path / "root")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "pass -y" in proc.stderr


@pytest.mark.usefixtures("efa")
def test_mpicc_builds_and_mpirun_runs_ranks(hb: HostBuild, tmp_path: Path) -> None:
    source = tmp_path / "hello.c"
    source.write_text(
        "#include <mpi.h>\n#include <stdio.h>\n"
        "int main(int argc, char **argv) { int r, n;\n"
        "  MPI_Init(&argc, &argv); MPI_Comm_rank(MPI_COMM_WORLD, &r);\n"
        '  MPI_Comm_size(MPI_COMM_WORLD, &n); printf("rank %d of %d\\n", r, n);\n'
        "  MPI_Finalize(); return 0; }\n"
    )
    mpicc = str(hb.mpi_prefix / "bin/mpicc")
    built = run([mpicc, "-o", str(tmp_path / "hello"), str(source)])
    assert built.returncode == 0, built.stderr
    mpirun = str(hb.mpi_prefix / "bin/mpirun")
    ran = run([mpirun, "--allow-run-as-root", "-np", "3", str(tmp_path / "hello")])
    assert ran.returncode == 0, ran.stderr
    assert sorted(ran.stdout.splitlines()) == ["rank 0 of 3", "rank 1 of 3", "rank 2 of 3"]
    if os.geteuid() == 0:
        refused = run(
            [mpirun, "-np", "1", str(tmp_path / "hello")],
            {"OMPI_ALLOW_RUN_AS_ROOT": "", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": ""},
        )
        assert refused.returncode == 1
        assert "--allow-run-as-root" in refused.stderr


# ---------------------------------------------------------------------------------- NCCL


@pytest.mark.usefixtures("nccl")
def test_nccl_src_build_outputs(hb: HostBuild) -> None:
    build = hb.nccl_build_dir("v2.10.3-1")
    header = (build / "include/nccl.h").read_text()
    for line in (
        "#define NCCL_MAJOR 2",
        "#define NCCL_MINOR 10",
        "#define NCCL_PATCH 3",
        '#define NCCL_SUFFIX ""',
        "#define NCCL_VERSION_CODE 21003",
        "(X) * 10000 + (Y) * 100 + (Z)",
    ):
        assert line in header
    lib = build / "lib"
    assert (lib / "libnccl.so.2.10.3").is_file()
    assert os.readlink(lib / "libnccl.so.2") == "libnccl.so.2.10.3"
    assert os.readlink(lib / "libnccl.so") == "libnccl.so.2"
    assert (lib / "libnccl_static.a").is_file()
    assert nccl_version_code(lib / "libnccl.so") == 21003
    info = ctypes.CDLL(str(lib / "libnccl.so")).ncclSampleBuildInfo
    info.restype = ctypes.c_char_p
    assert b"-gencode=arch=compute_70,code=sm_70 -gencode=arch=compute_80,code=sm_80" in info()


def test_nccl_pkg_txz_has_one_top_dir(hb: HostBuild, nccl: Path) -> None:
    packages = list((hb.nccl_build_dir("v2.10.3-1") / "pkg/txz").glob("*.txz"))
    assert [p.name for p in packages] == [f"nccl_2.10.3-1+cuda11.3_{os.uname().machine}.txz"]
    with tarfile.open(packages[0]) as tar:
        tops = {name.split("/")[0] for name in tar.getnames()}
    assert tops == {packages[0].name.removesuffix(".txz")}
    # The fixture extracted it with --strip-components=1 into the prefix.
    assert (nccl / "include/nccl.h").is_file()
    assert (nccl / "include/nccl_net.h").is_file()
    assert os.readlink(nccl / "lib/libnccl.so") == "libnccl.so.2"
    assert nccl_version_code(nccl / "lib/libnccl.so") == 21003


def test_nccl_2_7_8_uses_the_old_version_code(nccl_278: Path) -> None:
    assert "#define NCCL_VERSION_CODE 2708" in (nccl_278 / "include/nccl.h").read_text()
    assert nccl_version_code(nccl_278 / "lib/libnccl.so") == 2708
    assert (nccl_278 / "lib/libnccl.so.2.7.8").is_file()


class UniqueId(ctypes.Structure):
    """ncclUniqueId, which ncclCommInitRank takes by value."""

    _fields_ = [("internal", ctypes.c_char * 128)]


def test_nccl_allreduce_on_host_memory(nccl: Path) -> None:
    lib = ctypes.CDLL(str(nccl / "lib/libnccl.so"))
    unique_id = UniqueId()
    assert lib.ncclGetUniqueId(ctypes.byref(unique_id)) == 0
    lib.ncclCommInitRank.argtypes = [ctypes.c_void_p, ctypes.c_int, UniqueId, ctypes.c_int]
    for nranks, expected in ((1, [1.0, 2.0, 3.0]), (4, [4.0, 8.0, 12.0])):
        comm = ctypes.c_void_p()
        assert lib.ncclCommInitRank(ctypes.byref(comm), nranks, unique_id, 0) == 0
        send = (ctypes.c_float * 3)(1.0, 2.0, 3.0)
        recv = (ctypes.c_float * 3)()
        # count 3, ncclFloat32 = 7, ncclSum = 0, stream NULL
        assert lib.ncclAllReduce(send, recv, ctypes.c_size_t(3), 7, 0, comm, None) == 0
        assert list(recv) == expected
        assert lib.ncclCommDestroy(comm) == 0
    bad = lib.ncclAllReduce(None, None, ctypes.c_size_t(3), 7, 0, None, None)
    assert bad == 4  # ncclInvalidArgument


# ---------------------------------------------------------------------------------- PyTorch


def test_pytorch_reports_nccl_it_was_built_with(hb: HostBuild, torch_site: Path) -> None:
    code = (
        "import torch; print(torch.__version__); print(torch.cuda.nccl.version()); "
        "print(torch.cuda.nccl.runtime_version()); print(torch.cuda.get_arch_list()); "
        "print(len(torch._C._ops()), torch._C._run_op('add', 0, 100))"
    )
    proc = python_in_conda(hb, code, [torch_site])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "1.10.2",
        "(2, 10, 3)",
        "(2, 10, 3)",
        "['sm_37', 'sm_50', 'sm_70', 'sm_80', 'compute_70']",
        "28 982.0",
    ]
    log = (hb.logs / "pytorch-v1.10.2.log").read_text()
    assert "-- NCCL version: 2.10.3" in log
    assert "with MAX_JOBS=2" in log


def test_pytorch_extension_links_the_given_nccl(torch_site: Path, nccl: Path) -> None:
    extension = next((torch_site / "torch").glob("_C*.so"))
    dynamic = run(["readelf", "-d", str(extension)]).stdout
    assert "libnccl.so.2" in dynamic
    assert str(nccl / "lib") in dynamic  # rpath/runpath to NCCL_LIB_DIR


def test_pytorch_refuses_mismatched_nccl(hb: HostBuild, nccl: Path, nccl_278: Path) -> None:
    src = hb.export("pytorch", "v1.10.2", hb.work / "src" / "pytorch-mismatch")
    env = {
        "USE_SYSTEM_NCCL": "1",
        "NCCL_INCLUDE_DIR": str(nccl_278 / "include"),
        "NCCL_LIB_DIR": str(nccl / "lib"),
        "MAX_JOBS": "2",
    }
    python = str(hb.make_conda())
    with pytest.raises(BuildFailed, match="header version and library version do not match"):
        hb.run("pytorch-mismatch", [python, "setup.py", "install", f"--root={hb.work}/x"], src, env)


def test_pytorch_requires_system_nccl(hb: HostBuild) -> None:
    src = hb.export("pytorch", "v1.11.0", hb.work / "src" / "pytorch-bundled")
    python = str(hb.make_conda())
    env = {"USE_SYSTEM_NCCL": "0"}
    with pytest.raises(BuildFailed, match="set USE_SYSTEM_NCCL=1"):
        hb.run("pytorch-bundled", [python, "setup.py", "install", f"--root={hb.work}/y"], src, env)


def test_torchvision_records_the_torch_it_was_built_against(
    hb: HostBuild, torch_site: Path
) -> None:
    vision_site = hb.build_vision("v0.11.3", torch_site)
    proc = python_in_conda(
        hb,
        "import torchvision as tv; print(tv.__version__, tv.version.torch_version)",
        [vision_site, torch_site],
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0.11.3 1.10.2"
    requires = (vision_site / "torchvision-0.11.3-py3.11.egg-info" / "requires.txt").read_text()
    assert requires.strip() == "torch==1.10.2"


@pytest.mark.usefixtures("efa")
def test_smddp_wheel_installs_with_pip(hb: HostBuild, torch_site: Path) -> None:
    hb.install_smddp("1.4.0")
    code = (
        "import smdistributed.dataparallel as d; print(d.__version__); "
        "import smdistributed.dataparallel.torch as t; "
        "print(t.library_version(), t.libfabric_api_version())"
    )
    loaded = python_in_conda(hb, code, [torch_site], library_path(hb.efa_prefix / "lib"))
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.splitlines() == ["1.4.0", "1.4.0 (1, 13)"]
    without_efa = python_in_conda(hb, "import smdistributed.dataparallel.torch", [torch_site])
    assert without_efa.returncode != 0
    assert "libfabric.so.1" in without_efa.stderr
    import_only = python_in_conda(
        hb, "import smdistributed.dataparallel as d; print(d.__version__)"
    )
    assert import_only.returncode == 0, "the top-level package does not need torch"


# ---------------------------------------------------------------------------------- nccl-tests


@pytest.mark.usefixtures("efa")
def test_nccl_tests_build_and_run(hb: HostBuild, nccl: Path) -> None:
    build = hb.build_nccl_tests("v2.11.0", nccl)
    assert (build / "all_reduce_perf").is_file()
    assert (build / "all_gather_perf").is_file()
    env = library_path(nccl / "lib", hb.mpi_prefix / "lib")
    linked = run(["ldd", str(build / "all_reduce_perf")], env).stdout
    assert "libnccl.so.2" in linked
    assert "libmpi.so.40" in linked
    assert "not found" not in linked
    proc = run([str(build / "all_reduce_perf"), "-b", "8", "-e", "128", "-f", "2", "-g", "1"], env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "# nccl-tests version 2.11.0 nccl-headers=21003 nccl-library=21003" in lines
    assert "# NCCL version 2.10.3" in lines
    rows = [line.split() for line in lines if line and not line.startswith("#")]
    assert [row[0] for row in rows] == ["8", "16", "32", "64", "128"]
    assert all(row[8] == "0" and row[12] == "0" for row in rows), "no wrong values"
    assert "# Out of bounds values : 0 OK" in lines
    gathered = run(
        [
            str(build / "all_gather_perf"),
            "-b",
            "1K",
            "-e",
            "4K",
            "-f",
            "2",
            "-g",
            "2",
            "-d",
            "half",
        ],
        env,
    )
    assert gathered.returncode == 0, gathered.stdout + gathered.stderr


# ---------------------------------------------------------------------------------- boost


def test_boost_installs_headers_and_libraries(hb: HostBuild, tmp_path: Path) -> None:
    prefix = hb.build_boost("1.73.0")
    version = (prefix / "include/boost/version.hpp").read_text()
    assert "#define BOOST_VERSION 107300" in version
    assert '#define BOOST_LIB_VERSION "1_73"' in version
    for lib in ("system", "thread"):
        assert (prefix / f"lib/libboost_{lib}.so.1.73.0").is_file()
        assert os.readlink(prefix / f"lib/libboost_{lib}.so") == f"libboost_{lib}.so.1.73.0"
        assert (prefix / f"lib/libboost_{lib}.a").is_file()
    program = tmp_path / "use_boost.cpp"
    program.write_text(
        "#include <boost/system/error_code.hpp>\n#include <boost/thread/thread.hpp>\n"
        "#include <cstdio>\nint main() { int x = 0; boost::thread t([&x] { x = 42; }); t.join();\n"
        '  std::printf("%s %d %s\\n", boost::system::library_version(), x,\n'
        "              boost::system::system_category().name()); }\n"
    )
    built = run(
        [
            "g++",
            "-std=c++11",
            f"-I{prefix}/include",
            str(program),
            "-o",
            str(tmp_path / "use_boost"),
            f"-L{prefix}/lib",
            "-lboost_thread",
            "-lboost_system",
            "-pthread",
            f"-Wl,-rpath,{prefix}/lib",
        ]
    )
    assert built.returncode == 0, built.stderr
    assert run([str(tmp_path / "use_boost")]).stdout == "1_73 42 system\n"


def test_b2_exits_non_zero_when_compilation_fails(hb: HostBuild, tmp_path: Path) -> None:
    with tarfile.open(hb.upstream / "files" / "boost_1_74_0.tar.gz") as tar:
        tar.extractall(tmp_path, filter="tar")
    tree = tmp_path / "boost_1_74_0"
    source = tree / "libs/thread/src/pthread/once.cpp"
    source.write_text(source.read_text() + "\nthis is not C++;\n")
    assert run(["./bootstrap.sh"], cwd=tree).returncode == 0
    proc = run(
        [
            "./b2",
            "threading=multi",
            f"--prefix={tmp_path}/prefix",
            "-j",
            "2",
            "cxxflags=-fPIC",
            "cflags=-fPIC",
            "install",
        ],
        cwd=tree,
    )
    assert proc.returncode != 0
    assert "failed updating" in proc.stderr
    assert not (tmp_path / "prefix/lib/libboost_thread.so").exists()


def test_b2_rejects_unknown_features(hb: HostBuild, tmp_path: Path) -> None:
    with tarfile.open(hb.upstream / "files" / "boost_1_73_0.tar.gz") as tar:
        tar.extractall(tmp_path, filter="tar")
    tree = tmp_path / "boost_1_73_0"
    assert run(["./bootstrap.sh"], cwd=tree).returncode == 0
    proc = run(["./b2", "colour=blue", "install"], cwd=tree)
    assert proc.returncode != 0
    assert "unknown feature 'colour'" in proc.stderr


# ---------------------------------------------------------------------------------- aws-ofi-nccl

@pytest.mark.usefixtures("efa")
def test_aws_ofi_nccl_plugin_builds_and_loads(hb: HostBuild, nccl: Path) -> None:
    prefix = hb.build_ofi("v1.1.3-aws", nccl, "--enable-platform-aws")
    plugin = prefix / "lib/libnccl-net.so"
    env = library_path(hb.efa_prefix / "lib", nccl / "lib", hb.mpi_prefix / "lib", prefix / "lib")
    linked = run(["ldd", str(plugin)], env).stdout
    assert "libfabric.so.1" in linked
    assert "libnccl.so.2" in linked
    assert "not found" not in linked
    symbols = run(["nm", "-D", "--defined-only", str(plugin)]).stdout
    assert re.search(r" D ncclNetPlugin_v4$", symbols, re.M)
    version = ctypes.CDLL(str(plugin)).aws_ofi_nccl_version
    version.restype = ctypes.c_char_p
    assert version() == b"1.1.3-aws"
    transfer = run([str(prefix / "bin/nccl_message_transfer")], env)
    assert transfer.returncode == 0, transfer.stdout + transfer.stderr
    assert "Selected Provider is efa" in transfer.stdout
    # NCCL loads the plugin by name from the library path, as in the image.
    tests = hb.build_nccl_tests("v2.11.0", nccl)
    logged = run(
        [str(tests / "all_reduce_perf"), "-b", "8", "-e", "8", "-g", "1"],
        {**env, "NCCL_DEBUG": "INFO"},
    )
    assert logged.returncode == 0, logged.stdout + logged.stderr
    assert "NCCL INFO NET/OFI Selected Provider is efa" in logged.stdout
    assert "NCCL INFO Using network AWS Libfabric" in logged.stdout


@pytest.mark.usefixtures("efa")
def test_aws_ofi_nccl_configure_requires_libfabric_1_11(
    hb: HostBuild, nccl: Path, tmp_path: Path
) -> None:
    old = tmp_path / "old-efa"
    shutil.copytree(hb.efa_prefix, old, symlinks=True)
    header = old / "include/rdma/fabric.h"
    header.write_text(
        header.read_text().replace("#define FI_MINOR_VERSION 13", "#define FI_MINOR_VERSION 10")
    )
    src = hb.export("aws-ofi-nccl", "v1.1.1", hb.work / "src" / "aws-ofi-nccl-old")
    with pytest.raises(BuildFailed, match=r"requires libfabric 1\.11\.0 or newer"):
        hb.run(
            "aws-ofi-nccl-old-libfabric",
            f"./autogen.sh && ./configure --with-libfabric={old} "
            f"--with-nccl={nccl} --disable-tests",
            src,
        )
    with pytest.raises(BuildFailed, match="NCCL headers not found"):
        hb.run(
            "aws-ofi-nccl-no-nccl",
            f"./configure --with-libfabric={hb.efa_prefix} --with-nccl={tmp_path} --disable-tests",
            src,
        )

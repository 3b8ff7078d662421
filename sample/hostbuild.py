"""Builds the sample upstream on the host with the commands imageforge's stages run.

Used by the tests and by ``python -m sample build --dir DIR --work WORK``. Each step runs the
stage command from the sample's contract, with paths moved under a work directory instead of
/opt, /usr/local and /out: the EFA installer gets ``EFA_INSTALL_ROOT``, ``--root``/``DESTDIR``
point into the work directory, and the Python steps use a venv created with
``--system-site-packages`` as the stand-in for /opt/conda.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sample.gitrepo import git_env

NVCC_GENCODE = "-gencode=arch=compute_70,code=sm_70 -gencode=arch=compute_80,code=sm_80"
TORCH_CUDA_ARCH_LIST = "3.7 5.0 7.0+PTX 8.0"
CUDA_HOME = "/usr/local/cuda"


class BuildFailed(Exception):
    """A build step exited non-zero; the message carries the end of its output."""


@dataclass
class HostBuild:
    """Where the upstream is and where the builds go; ``timings`` collects seconds per step."""

    upstream: Path
    work: Path
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    def run(
        self, step: str, cmd: str | Sequence[str], cwd: Path, env: Mapping[str, str] | None = None
    ) -> str:
        """Run a command (a string goes through bash, as in a Dockerfile RUN); returns output."""
        self.logs.mkdir(parents=True, exist_ok=True)
        full_env = {**git_env(), **(env or {})}
        shell = isinstance(cmd, str)
        args: str | list[str] = cmd if isinstance(cmd, str) else list(cmd)
        start = time.monotonic()
        proc = subprocess.run(
            args,
            cwd=cwd,
            env=full_env,
            shell=shell,
            executable="/bin/bash" if shell else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
        )
        self.timings[step] = self.timings.get(step, 0.0) + time.monotonic() - start
        output = proc.stdout.decode(errors="replace")
        (self.logs / f"{step}.log").write_text(output)
        if proc.returncode != 0:
            tail = "\n".join(output.splitlines()[-40:])
            raise BuildFailed(f"{step}: `{cmd}` exited {proc.returncode}\n{tail}")
        return output

    def export(self, repo: str, rev: str, dest: Path) -> Path:
        """A checkout of ``rev`` without .git (how the stages mount sources)."""
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        git_dir = self.upstream / "git" / f"{repo}.git"
        archive = subprocess.run(
            ["git", "--git-dir", str(git_dir), "archive", "--format=tar", rev],
            capture_output=True,
            env=git_env(),
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
        return dest

    # ----------------------------------------------------------------- EFA

    @property
    def efa_root(self) -> Path:
        return self.work / "efa-root"

    @property
    def efa_prefix(self) -> Path:
        return self.efa_root / "opt/amazon/efa"

    @property
    def mpi_prefix(self) -> Path:
        return self.efa_root / "opt/amazon/openmpi"

    def build_efa(self, version: str = "1.14.1") -> Path:
        scratch = self.work / "efa"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        tarball = self.upstream / "files" / f"aws-efa-installer-{version}.tar.gz"
        cmd = f"tar -xf {tarball} && cd aws-efa-installer && ./efa_installer.sh -y --skip-kmod -g"
        self.run("efa", cmd, scratch, {"EFA_INSTALL_ROOT": str(self.efa_root)})
        shutil.rmtree(scratch)
        return self.efa_root

    # ----------------------------------------------------------------- NCCL

    def nccl_build_dir(self, tag: str) -> Path:
        return self.work / f"nccl-build-{tag}"

    def nccl_prefix(self, tag: str) -> Path:
        return self.work / f"nccl-prefix-{tag}"

    def build_nccl(self, rev: str = "v2.10.3-1", package: bool = True) -> Path:
        """src.build (and pkg.txz.build, extracted into a prefix); returns the prefix."""
        src = self.export("nccl", rev, self.work / "src" / f"nccl-{rev}")
        build = self.nccl_build_dir(rev)
        self.run(
            f"nccl-{rev}",
            f"make -j4 src.build CUDA_HOME={CUDA_HOME} "
            f'NVCC_GENCODE="{NVCC_GENCODE}" BUILDDIR={build}',
            src,
        )
        prefix = self.nccl_prefix(rev)
        if package:
            self.run(f"nccl-{rev}-pkg", f"make pkg.txz.build BUILDDIR={build}", src)
            shutil.rmtree(prefix, ignore_errors=True)
            prefix.mkdir(parents=True)
            self.run(
                f"nccl-{rev}-extract",
                f"tar -xvf {build}/pkg/txz/nccl_*.txz -C {prefix} --strip-components=1",
                src,
            )
        return prefix

    # ----------------------------------------------------------------- aws-ofi-nccl

    def build_ofi(self, rev: str, nccl_prefix: Path, extra: str = "") -> Path:
        src = self.export("aws-ofi-nccl", rev, self.work / "src" / f"aws-ofi-nccl-{rev}")
        out = self.work / f"ofi-out-{rev}"
        prefix = "/opt/aws-ofi-nccl"
        cmd = (
            f"./autogen.sh && ./configure --with-libfabric={self.efa_prefix} "
            f"--with-mpi={self.mpi_prefix} --with-cuda={CUDA_HOME} --with-nccl={nccl_prefix} "
            f"--prefix={prefix} {extra} && make && make install DESTDIR={out}"
        )
        self.run(f"aws-ofi-nccl-{rev}", cmd, src)
        return out / prefix.lstrip("/")

    # ----------------------------------------------------------------- nccl-tests

    def build_nccl_tests(self, rev: str, nccl_prefix: Path) -> Path:
        src = self.export("nccl-tests", rev, self.work / "src" / f"nccl-tests-{rev}")
        self.run(
            f"nccl-tests-{rev}",
            f"make MPI=1 MPI_HOME={self.mpi_prefix} CUDA_HOME={CUDA_HOME} NCCL_HOME={nccl_prefix}",
            src,
        )
        return src / "build"

    # ----------------------------------------------------------------- boost

    def build_boost(self, version: str = "1.73.0") -> Path:
        top = "boost_" + version.replace(".", "_")
        scratch = self.work / "boost"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        prefix = self.work / f"boost-prefix-{version}"
        cmd = (
            f"tar -xzf {self.upstream}/files/{top}.tar.gz && cd {top} && ./bootstrap.sh && "
            f"./b2 threading=multi --prefix={prefix} -j2 cxxflags=-fPIC cflags=-fPIC install"
        )
        self.run(f"boost-{version}", cmd, scratch)
        return prefix

    # ----------------------------------------------------------------- Python stages

    @property
    def conda(self) -> Path:
        """The /opt/conda stand-in: a venv that sees the system's setuptools."""
        return self.work / "conda"

    @property
    def conda_python(self) -> Path:
        return self.conda / "bin" / "python"

    def make_conda(self) -> Path:
        if not self.conda_python.exists():
            self.run(
                "venv",
                [sys.executable, "-m", "venv", "--system-site-packages", str(self.conda)],
                self.work,
            )
        return self.conda_python

    def site_packages(self, root: Path) -> Path:
        """Where ``setup.py install --root=root`` puts packages of the conda venv."""
        purelib = sysconfig.get_path("purelib", vars={"base": str(self.conda)})
        return root / purelib.lstrip("/")

    def build_pytorch(self, rev: str, nccl_prefix: Path, max_jobs: int = 2) -> Path:
        src = self.export("pytorch", rev, self.work / "src" / f"pytorch-{rev}")
        out = self.work / f"torch-out-{rev}"
        python = self.make_conda()
        env = {
            "USE_SYSTEM_NCCL": "1",
            "NCCL_ROOT": str(nccl_prefix),
            "NCCL_INCLUDE_DIR": f"{nccl_prefix}/include",
            "NCCL_LIB_DIR": f"{nccl_prefix}/lib",
            "TORCH_CUDA_ARCH_LIST": TORCH_CUDA_ARCH_LIST,
            "TORCH_NVCC_FLAGS": "-Xfatbin -compress-all",
            "MAX_JOBS": str(max_jobs),
            "CMAKE_PREFIX_PATH": str(self.conda),
        }
        self.run(f"pytorch-{rev}", [str(python), "setup.py", "install", f"--root={out}"], src, env)
        return self.site_packages(out)

    def build_vision(self, rev: str, torch_site: Path) -> Path:
        src = self.export("vision", rev, self.work / "src" / f"vision-{rev}")
        out = self.work / f"vision-out-{rev}"
        env = {"BUILD_VERSION": rev.removeprefix("v"), "PYTHONPATH": str(torch_site)}
        self.run(
            f"vision-{rev}",
            [str(self.make_conda()), "setup.py", "install", f"--root={out}"],
            src,
            env,
        )
        return self.site_packages(out)

    def install_smddp(self, version: str = "1.4.0") -> Path:
        wheel = (
            self.upstream
            / "files"
            / f"smdistributed_dataparallel-{version}-cp311-cp311-linux_x86_64.whl"
        )
        self.make_conda()
        pip = self.conda / "bin" / "pip"
        self.run(
            f"smddp-{version}",
            [str(pip), "install", "--no-deps", "--no-index", str(wheel)],
            self.work,
            {"SMDATAPARALLEL_PT": "1"},
        )
        return self.site_packages(Path("/"))


def python_in_conda(
    build: HostBuild, code: str, paths: Sequence[Path] = (), env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with the conda venv's python, from a neutral directory."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    full_env.update(env or {})
    return subprocess.run(
        [str(build.conda_python), "-c", code],
        cwd=build.work,
        env=full_env,
        capture_output=True,
        text=True,
        check=False,
    )


def build_all(build: HostBuild, with_autotools: bool = True) -> dict[str, float]:
    """Every component in stage order (as in seed 002); returns seconds per step."""
    build.work.mkdir(parents=True, exist_ok=True)
    build.build_efa("1.14.1")
    nccl = build.build_nccl("v2.10.3-1")
    torch_site = build.build_pytorch("v1.10.2", nccl)
    if with_autotools:
        build.build_ofi("v1.1.3-aws", nccl)
    build.build_nccl_tests("v2.11.0", nccl)
    build.build_vision("v0.11.3", torch_site)
    build.build_boost("1.73.0")
    build.install_smddp("1.4.0")
    return dict(build.timings)

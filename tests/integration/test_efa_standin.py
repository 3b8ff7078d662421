"""The EFA installer stand-in (realparts) installed by the efa stage's real recipe.

Generates the tarball, renders stages/efa.py's recipe for it and builds it with BuildKit
FROM the CUDA devel base (Debian 12 with build-essential), then checks the fabric libraries
inside the image: real providers, libfabric 1.17, its rdma-core libraries resolved from
/usr/lib, and Open MPI starting two ranks.
"""

from __future__ import annotations

import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from imageforge.model.stage import Context
from realparts.__main__ import default_cache
from realparts.debs import DEFAULT_MIRROR
from realparts.efa_installer import Generated, generate, tarball_name
from stages import efa

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
BASE = "imageforge/cuda:13.0-devel-bookworm"
VERSION = "1.22.0"  # the name manifests/real-efa-nccl.toml gives it


def test_generated_tarball_is_reproducible(tmp_path: Path) -> None:
    first = generate(VERSION, tmp_path / "a", DEFAULT_MIRROR, default_cache())
    second = generate(VERSION, tmp_path / "b", DEFAULT_MIRROR, default_cache())
    assert first.path.read_bytes() == second.path.read_bytes()
    assert (first.path.parent / f"{first.path.name}.sha256").read_text() == \
        f"{first.sha256}  {tarball_name(VERSION)}\n"


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory, docker_ready: None) -> Generated:
    del docker_ready  # requested for its Docker check only (usefixtures is for tests)
    # The CUDA base the real manifest builds on (idempotent: nothing to do when present).
    subprocess.run([str(ROOT / "scripts/cuda-base.sh"), BASE], check=True, timeout=1800)
    return generate(VERSION, tmp_path_factory.mktemp("efa-standin"), DEFAULT_MIRROR,
                    default_cache())


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory, tarball: Generated) -> Iterator[str]:
    out = tmp_path_factory.mktemp("efa-build")
    # apt = false as in manifests/real-efa-nccl.toml: no package lists, so the install is offline.
    ctx = Context(image={"apt": False}, stages={"efa": {
        "version": VERSION, "url": f"file://{tarball.path}", "sha256": tarball.sha256,
        "flags": ["-y", "--skip-kmod", "-g"]}})
    env = [f'ENV {name}="{":".join(dirs)}:${name}"' for name, dirs in efa.env_paths(ctx).items()]
    (out / "Dockerfile").write_text("\n".join([f"FROM {BASE}", efa.recipe(ctx), *env]) + "\n")
    tag = f"imageforge-test/efa-standin:{uuid.uuid4().hex[:12]}"
    build = subprocess.run(
        # --no-cache: the apt lines below are only printed when the install step runs.
        ["docker", "buildx", "build", "--load", "--no-cache", "--progress", "plain", "-t", tag,
         "--build-context", f"src-efa={tarball.path.parent}", str(out)],
        capture_output=True, text=True, check=False, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    # Everything came from the bundle.
    assert "Need to get 0 B/" in build.stderr, build.stderr[-4000:]
    try:
        yield tag
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, check=False)


def test_installer_refuses_unknown_flags(tarball: Generated) -> None:
    result = subprocess.run(
        ["docker", "run", "--rm", "-v", f"{tarball.path}:/efa.tar.gz:ro", BASE, "bash", "-c",
         "cd /tmp && tar -xf /efa.tar.gz && aws-efa-installer/efa_installer.sh -y --bogus"],
        capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 1
    assert "Unknown option: --bogus" in result.stderr


def in_image(image: str, script: str) -> str:
    result = subprocess.run(["docker", "run", "--rm", image, "bash", "-c", script],
                            capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, f"{script}: {result.stdout}{result.stderr}"
    return result.stdout


def test_fi_info_lists_real_providers(image: str) -> None:
    listed = in_image(image, "fi_info -l")
    providers = {line.split(":")[0] for line in listed.splitlines() if line.endswith(":")}
    # verbs and efa are built in (libfabric links libefa) but list only where a device is.
    assert {"tcp", "sockets", "udp", "shm", "ofi_rxm"} <= providers, listed


def test_libfabric_is_debian_1_17(image: str) -> None:
    assert "libfabric: 1.17" in in_image(image, "/opt/amazon/efa/bin/fi_info --version")


def test_libfabric_is_real_files_resolving_rdma_core_from_usr_lib(image: str) -> None:
    # A copy in /opt/amazon/efa/lib, not a link out to Debian's file.
    ldd = in_image(image, "real=$(readlink -f /opt/amazon/efa/lib/libfabric.so.1) "
                          "&& test \"${real%/*}\" = /opt/amazon/efa/lib "
                          "&& ldd /opt/amazon/efa/lib/libfabric.so.1")
    assert "not found" not in ldd
    # Debian 12 is usr-merged: /lib is /usr/lib.
    for library in ("libibverbs.so.1", "librdmacm.so.1", "libefa.so.1"):
        assert f"{library} => /lib/x86_64-linux-gnu/{library}" in ldd \
            or f"{library} => /usr/lib/x86_64-linux-gnu/{library}" in ldd, ldd


def test_mpirun_runs_two_ranks(image: str) -> None:
    assert in_image(image, "mpirun --allow-run-as-root -np 2 echo rank").split() == ["rank"] * 2


MPI_PROGRAM = r"""#include <mpi.h>
#include <stdio.h>
int main(int c, char **v) {
    int rank, size;
    MPI_Init(&c, &v);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    printf("rank %d of %d\n", rank, size);
    MPI_Finalize();
    return 0;
}
"""


# Both ways a user builds an MPI program: the mpicc wrapper on PATH, and gcc pointed at
# /opt/amazon/openmpi by hand; each program then runs on two ranks.
MPI_BUILDS = r"""set -eo pipefail
cd /tmp
printf '%s' @PROGRAM@ > t.c
echo "mpicc $(command -v mpicc)"
mpicc t.c -o t-wrapper
gcc -I/opt/amazon/openmpi/include t.c -L/opt/amazon/openmpi/lib -lmpi -o t-direct
for t in t-wrapper t-direct; do
    echo "$t loads $(ldd ./$t | awk '$1 == "libmpi.so.40" {print $3}')"
    mpirun --allow-run-as-root -np 2 ./$t | sort | sed "s/^/$t /"
done
"""


def test_mpicc_builds_against_opt_amazon_openmpi(image: str) -> None:
    out = in_image(image, MPI_BUILDS.replace("@PROGRAM@", shlex.quote(MPI_PROGRAM)))
    # The Open MPI the image puts first on PATH and LD_LIBRARY_PATH, and both ranks of one
    # world of two really ran each program.
    assert out.splitlines() == [
        "mpicc /opt/amazon/openmpi/bin/mpicc",
        "t-wrapper loads /opt/amazon/openmpi/lib/libmpi.so.40",
        "t-wrapper rank 0 of 2", "t-wrapper rank 1 of 2",
        "t-direct loads /opt/amazon/openmpi/lib/libmpi.so.40",
        "t-direct rank 0 of 2", "t-direct rank 1 of 2"], out

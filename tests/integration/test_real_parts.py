"""Seed 000's image built from real parts, cold on a fresh machine, as CI runs it.

Real NCCL v2.28.9-1, nccl-tests v2.19.6 and aws-ofi-nccl v1.21.1 (full upstream history, served
over git smart HTTP on 127.0.0.1), a real CUDA 13.0 toolchain (NVIDIA's wheels from PyPI, laid
out by scripts/cuda-base.sh, with the distro NCCL such bases carry), Debian's real libfabric
1.17, rdma-core and Open MPI 4.1 through the EFA installer stand-in (the real installer is an
S3-only download: the one stand-in here). NCCL is built with ONLY_FUNCS="AllReduce Sum f32 * *"
(NCCL's own developer switch, a keyed manifest key) so the cold build takes minutes, and
nccl-tests with only_tests = ["all_reduce"] (the one test those kernels can run; nccl-tests'
own BIN_FILES_LIST); `make demo-real` builds the full library and every test. Each recipe
fix has an assertion here that fails without it.

NCCL is manifests/real-efa-nccl.toml's with the version set to 2.28.9: the NCCL torch 2.11's
cu130 wheel pins (manifests/real-torch211.toml, run on the H200 in docs/real-hardware.md).
ONLY_FUNCS cuts 2.28's device kernels to a few, but not 2.30's symmetric-memory kernels, so
2.30.7 compiled about three times as long here (its from-scratch rebuild set the suite's
wall time); `make demo-real` keeps building 2.30.7, whole.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stages.nccl import reproducible_nvcc
from tests.checksummary import checks_passed
from tests.integration.conftest import ROOT, docker_out, invoke

MANIFEST = ROOT / "manifests/real-efa-nccl.toml"
NCCL = "2.28.9"
PORT = "http://127.0.0.1:8742"
ONLY_FUNCS = "stages.nccl.only_funcs=AllReduce Sum f32 * *"
ONLY_TESTS = "stages.nccl-tests.only_tests=all_reduce"
RUN = uuid.uuid4().hex[:8]
BUILD_TIMEOUT = 3600
# GNU tar's and gzip's own switches for a reproducible archive: member times fixed, names
# sorted, no owner names, no pax atime/ctime records, no gzip time stamp. On make's command
# line, because aws-ofi-nccl's Makefile sets and exports TAR_OPTIONS itself (--owner=0
# --group=0), which hides the environment's.
REPRODUCIBLE_DIST = ("TAR_OPTIONS='--owner=0 --group=0 --numeric-owner --mtime=@0 --sort=name"
                     " --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime'"
                     " GZIP_ENV='-n --best'")


def efa_version() -> str:
    match = re.search(r'\[stages\.efa\]\s*\nversion = "([^"]+)"', MANIFEST.read_text())
    assert match, MANIFEST
    return match.group(1)


@pytest.fixture(scope="module")
def upstream_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """git/<name>.git: the real repositories; files/: the EFA installer stand-in."""
    root = tmp_path_factory.mktemp("real-upstream")
    subprocess.run([str(ROOT / "scripts/real-upstream.sh"), str(root)], check=True)
    subprocess.run([sys.executable, "-m", "realparts", "efa-installer", "--version",
                    efa_version(), "--out", str(root / "files"),
                    "--deb-cache", str(ROOT / "cache/sources/debs")], check=True, cwd=ROOT)
    return root


@pytest.fixture(scope="module")
def real_upstream(upstream_root: Path, docker_ready: None) -> Iterator[str]:
    """The real upstream repositories and the EFA installer stand-in, served on 127.0.0.1."""
    del docker_ready  # requested for its Docker check only (usefixtures is for tests)
    from sample.serve import start_server

    server = start_server(upstream_root)
    try:
        yield server.url.rstrip("/")
    finally:
        server.stop()


@pytest.fixture(scope="module")
def real_manifest(tmp_path_factory: pytest.TempPathFactory, real_upstream: str,
                  cache_dir: Path) -> Path:
    subprocess.run([str(ROOT / "scripts/cuda-base.sh")], check=True, timeout=1800)
    path = tmp_path_factory.mktemp("real-manifest") / "real-efa-nccl.toml"
    text = re.sub(r'(\[stages\.nccl\]\nversion = )"[^"]+"', rf'\1"{NCCL}"', MANIFEST.read_text())
    assert f'version = "{NCCL}"' in text, "the nccl pin of real-efa-nccl.toml moved"
    path.write_text(text.replace(PORT, real_upstream))
    result = invoke("lock", "--manifest", str(path), cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    return path


@pytest.fixture(scope="module")
def real_build(real_manifest: Path, cache_dir: Path) -> tuple[str, str]:
    """(tag, output) of the efa-nccl build with its image checks."""
    tag = f"imageforge-test/real-efa-nccl:{RUN}"
    result = invoke("build", "--target", "efa-nccl", "--manifest", str(real_manifest),
                    "--set", ONLY_FUNCS, "--set", ONLY_TESTS, "--locked", "--tag", tag,
                    "--progress", "plain",
                    cache=cache_dir, timeout=BUILD_TIMEOUT)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    return tag, result.stdout


@pytest.mark.usefixtures("real_build")
def test_real_stages_rebuilt_from_scratch_are_the_same(real_manifest: Path,
                                                       cache_dir: Path) -> None:
    """Same key, same bytes, for every real stage, each built again from scratch
    (BuildKit's cache off, cache mounts of its own): nvcc-built NCCL and nccl-tests (they
    differed before nvcc named its temporary files after the object, stages.nccl
    .reproducible_nvcc), the efa stand-in that runs apt (pkgcache.bin differed before
    dockerfile.APT_CLEAN), aws-ofi-nccl (autotools against Debian's libfabric) and the image."""
    result = invoke("verify", "--rebuild", "--target", "efa-nccl", "--manifest",
                    str(real_manifest), "--set", ONLY_FUNCS, "--set", ONLY_TESTS, "--json",
                    "--progress", "plain",
                    cache=cache_dir, timeout=BUILD_TIMEOUT)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    verdicts = {v["stage"]: v["result"] for v in json.loads(result.stdout)["stages"]}
    # efa (built FROM) and the image stay in the engine's image store: compared file by file.
    assert verdicts == {"efa": "same files", "nccl": "same", "aws-ofi-nccl": "same",
                        "nccl-tests": "same", "efa-nccl": "same files"}


def run_in(image: str, script: str) -> str:
    return docker_out("run", "--rm", "--entrypoint", "bash", image, "-c", script)


def test_real_nvcc_writes_the_same_files_twice_only_with_the_recipe_flags(
        real_manifest: Path) -> None:
    """The defects behind the differing libnccl.so and nccl-tests binaries, on the real nvcc
    of the CUDA base: one file compiled twice differs (nvcc's tmpxft_<pid> file name is in
    the object), and so does one program linked twice (the device link's stub), while each
    is the same bytes after the command the nccl (objects) and nccl-tests (programs) recipes
    run."""
    base = re.search(r'^base = "([^"]+)"', real_manifest.read_text(), re.MULTILINE)
    assert base, real_manifest
    nvcc = "nvcc -g -O2 -gencode=arch=compute_90,code=sm_90"
    compile_ = f"{nvcc} -c k.cu -o k.o && sha256sum k.o"
    link = f"{nvcc} -c k.cu -o k.o && {nvcc} k.o -o k && sha256sum k"
    objects, programs = reproducible_nvcc("13.0"), reproducible_nvcc("13.0", device_link=False)
    # (what, the recipe's command or none, build, the same bytes twice?)
    cases = [("object", "true", compile_, False),
             ("object, nccl's flag", objects[0], compile_, True),
             ("program, nccl's flag", objects[0], link, False),
             ("program, nccl-tests' flags", programs[0], link, True)]
    lines = ["set -euo pipefail", 'cd "$(mktemp -d)"',
             "echo 'namespace { __global__ void k(int *x) { x[0] = 1; } }' > k.cu",
             "echo 'int main() { k<<<1, 1>>>(nullptr); return 0; }' >> k.cu"]
    lines += [f"( {flag} && for i in 1 2; do {build} | cut -c1-64; done )"
              for _, flag, build, _ in cases]
    found = run_in(base.group(1), "\n".join(lines)).split()
    assert len(found) == 2 * len(cases), found
    for i, (what, _, _, same) in enumerate(cases):
        assert (found[2 * i] == found[2 * i + 1]) is same, what


# The real sources and the tags the manifest's versions name.
REAL_TAGS = {"nccl": f"v{NCCL}-1", "aws-ofi-nccl": "v1.21.1", "nccl-tests": "v2.19.6"}


def tag_commit(upstream_root: Path, stage: str, tag: str) -> str:
    """The commit `tag` points to in the real repository (peeled: an annotated tag's
    object is not the commit)."""
    found = subprocess.run(["git", "rev-parse", f"{tag}^{{commit}}"], capture_output=True,
                           text=True, check=True,
                           cwd=upstream_root / "git" / f"{stage}.git").stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{40}", found), found
    return found


def test_lock_resolves_real_release_tags(real_manifest: Path, upstream_root: Path) -> None:
    lock = json.loads(real_manifest.with_name("real-efa-nccl.lock.json").read_text())
    for stage, tag in REAL_TAGS.items():
        [source] = lock["stages"][stage].values()
        assert source["from"]["ref"] == tag, source
        assert source["commit"] == tag_commit(upstream_root, stage, tag), (stage, source)
    # And the one commit known from upstream itself: NVIDIA/nccl's "NCCL 2.28.9-1" (v2.28.9-1
    # is a lightweight tag on it).
    assert lock["stages"]["nccl"]["src-nccl"]["commit"] == \
        "dbc86fd06e8b0c4517b95d8958a09ccacf9520c9"


def test_every_image_check_passes_with_a_versions_report(real_build: tuple[str, str]) -> None:
    _, output = real_build
    assert checks_passed(output), output[-4000:]
    rows = {line.split()[0]: line for line in output.splitlines()
            if re.match(r"^(nccl|aws-ofi-nccl|libfabric|Open|nvcc)\b", line)}
    assert re.search(r"2\.28\.9\s+2\.28\.9\s+yes", rows["nccl"]), rows
    assert re.search(r"1\.21\.1\s+1\.21\.1\s+yes", rows["aws-ofi-nccl"]), rows
    assert re.search(r"1\.17\s+1\.17\.\d+\s+yes", rows["libfabric"]), rows
    assert "4.1" in rows["Open"], rows
    assert "13.0" in rows["nvcc"], rows
    # GPU and EFA checks are listed, never counted as passed.
    assert "needs hardware" in output


def test_exactly_one_libnccl_and_no_static_library(real_build: tuple[str, str]) -> None:
    tag, _ = real_build
    listing = run_in(tag, "ls /usr/local/lib /usr/lib/x86_64-linux-gnu | grep libnccl || true")
    assert f"libnccl.so.{NCCL}" in listing
    # The CUDA base's distro NCCL (2.27.7) is gone, and so is the 108 MB static library.
    assert "2.27.7" not in listing
    assert "libnccl_static.a" not in listing
    assert run_in(tag, "ls /usr/include/nccl.h 2>/dev/null || echo none") == "none"


def test_plugin_resolves_debian_libfabric_and_rdma_core(real_build: tuple[str, str]) -> None:
    tag, _ = real_build
    ldd = run_in(tag, "ldd /usr/local/lib/libnccl-net.so /opt/amazon/efa/lib/libfabric.so.1")
    assert "/opt/amazon/efa/lib/libfabric.so.1" in ldd
    # rdma-core from the system's library directory (Debian's merged /usr: /lib is /usr/lib).
    assert re.search(r"libibverbs\.so\.1 => (/usr)?/lib/x86_64-linux-gnu/", ldd), ldd
    assert "not found" not in ldd
    providers = run_in(tag, "/opt/amazon/efa/bin/fi_info -l")
    assert {"tcp:", "shm:"} <= set(providers.split()), providers


def test_nccl_tests_are_built_for_the_manifest_arch_only(real_build: tuple[str, str]) -> None:
    tag, _ = real_build
    # Without NVCC_GENCODE nccl-tests builds 6 archs: 263 MB for its 11 binaries. sm_90 alone
    # (SASS, plus PTX so they also run on newer GPUs) is about 71 MB, 6.5 MB a binary.
    size = int(run_in(tag, "du -sb /opt/nccl-tests/bin | cut -f1"))
    assert size < 15 * 1024 * 1024, size
    # only_tests: all_reduce_perf alone.
    assert run_in(tag, "ls /opt/nccl-tests/bin").split() == ["all_reduce_perf"]


def test_only_funcs_and_only_tests_are_keyed(real_manifest: Path, cache_dir: Path) -> None:
    def keys(*sets: str) -> dict[str, str]:
        result = invoke("plan", "--target", "nccl-tests", "--manifest", str(real_manifest),
                        "--json", *[w for s in sets for w in ("--set", s)], cache=cache_dir)
        assert result.returncode == 0, result.stderr
        return {s["name"]: s["key"] for s in json.loads(result.stdout)["stages"]}

    plain, funcs, tests = keys(), keys(ONLY_FUNCS), keys(ONLY_TESTS)
    assert funcs["nccl"] != plain["nccl"]
    assert funcs["nccl-tests"] != plain["nccl-tests"]   # built against another libnccl
    assert tests["nccl"] == plain["nccl"]
    assert tests["nccl-tests"] not in (plain["nccl-tests"], funcs["nccl-tests"])


def test_platform_aws_is_refused_on_libfabric_1_17(real_manifest: Path,
                                                   cache_dir: Path) -> None:
    result = invoke("check", "--manifest", str(real_manifest), "--set",
                    "stages.aws-ofi-nccl.configure_flags=--enable-platform-aws",
                    cache=cache_dir)
    assert result.returncode == 3, result.stdout + result.stderr
    # The rule's own sentence: the plugin, the flag, the libfabric it needs and the one the
    # pinned installer bundles.
    assert re.search(r"aws-ofi-nccl 1\.21\.1 with --enable-platform-aws needs libfabric >= "
                     r"1\.22\.0, but EFA installer 1\.22\.0 bundles libfabric 1\.17\b",
                     result.stdout + result.stderr), result.stdout + result.stderr


@pytest.fixture(scope="module")
def release_tarball(real_build: tuple[str, str], upstream_root: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Path:
    """aws-ofi-nccl v1.21.1's release tarball, made as upstream makes it: `make dist` in a
    configured checkout of the tag (configure needs libfabric and CUDA; the built image has
    both), served beside the EFA installer, in the same bytes every run (REPRODUCIBLE_DIST),
    so a later run's plugin build is BuildKit's cache hit, not a configure and compile."""
    tag, _ = real_build
    work = tmp_path_factory.mktemp("ofi-dist")
    subprocess.run(["git", "clone", "--quiet", "--branch", "v1.21.1",
                    str(upstream_root / "git/aws-ofi-nccl.git"), str(work / "src")], check=True)
    docker_out("run", "--rm", "-v", f"{work}:/work", "-w", "/work/src", "--entrypoint", "bash",
               tag, "-c", "./autogen.sh >/dev/null && ./configure --with-libfabric=/opt/amazon/efa"
               f" --with-cuda=/usr/local/cuda >/dev/null && make dist {REPRODUCIBLE_DIST}"
               " >/dev/null")
    tarball = upstream_root / "files/aws-ofi-nccl-1.21.1.tar.gz"
    shutil.copyfile(work / "src/aws-ofi-nccl-1.21.1.tar.gz", tarball)
    return tarball


def test_plugin_builds_from_its_make_dist_release_tarball(
        release_tarball: Path, real_manifest: Path, real_upstream: str, cache_dir: Path,
        tmp_path: Path) -> None:
    with tarfile.open(release_tarball) as archive:
        names = set(archive.getnames())
    assert {"aws-ofi-nccl-1.21.1/.release_version", "aws-ofi-nccl-1.21.1/configure"} <= names
    assert not any("/.git/" in name for name in names)
    manifest = tmp_path / "real-efa-nccl.toml"
    manifest.write_text(real_manifest.read_text().replace(
        "[stages.aws-ofi-nccl]\n",
        f'[stages.aws-ofi-nccl]\nurl = "{real_upstream}/files/aws-ofi-nccl-{{version}}.tar.gz"\n'))
    result = invoke("lock", "--manifest", str(manifest), cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    lock = manifest.with_name("real-efa-nccl.lock.json").read_text()
    assert hashlib.sha256(release_tarball.read_bytes()).hexdigest() in lock
    plan = invoke("plan", "--target", "efa-nccl", "--manifest", str(manifest), "--json",
                  "--set", ONLY_FUNCS, "--set", ONLY_TESTS, cache=cache_dir)
    assert plan.returncode == 0, plan.stderr
    status = {s["name"]: s["status"] for s in json.loads(plan.stdout)["stages"]}
    # Only the plugin and the image it is in change; NCCL and nccl-tests are reused.
    assert status["nccl"] == status["nccl-tests"] == status["efa"] == "cached", status
    assert status["aws-ofi-nccl"] != "cached", status
    tag = f"imageforge-test/real-efa-nccl:dist-{RUN}"
    result = invoke("build", "--target", "efa-nccl", "--manifest", str(manifest), "--set",
                    ONLY_FUNCS, "--set", ONLY_TESTS, "--locked", "--tag", tag, "--progress",
                    "plain",
                    cache=cache_dir, timeout=BUILD_TIMEOUT)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    assert checks_passed(result.stdout), result.stdout[-4000:]
    assert re.search(r"^aws-ofi-nccl\s+1\.21\.1\s+1\.21\.1\s+yes", result.stdout, re.M)
    assert "/usr/local/lib/libnccl-net.so" in run_in(tag, "ls /usr/local/lib/libnccl-net.so")

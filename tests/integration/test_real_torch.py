"""A real torch inside an image imageforge built, and the checks that read the libnccl it
really loads, each proven to fail on a deliberately broken image.

The torch 2.11.0 cu130 wheel and its whole locked closure (nvidia-* wheels included) come from
PyPI with hash checking; NCCL is `provider = "wheel"`: the nvidia-nccl-cu13 2.28.9 wheel that
torch pins, unpacked into /usr/local/lib by the nccl stage, with torch's site-packages copy a
link to it (manifests/torch211-nccl-wheel.toml and its committed lock). `import torch` maps
libnccl without a GPU, so every check here runs on this machine. The plain Debian base stands
in for the CUDA one: torch's wheels bring their own CUDA runtime, and nothing is compiled.

The stages' files are laid over the base as an image target's assembly does, once; the broken
images are that image changed after the build, as a user's derived Dockerfile would:
- LD_PRELOAD of a second libnccl: two libraries mapped in one process;
- `pip install` bringing the wheel's own copy back: torch loads it, not the nccl stage's;
- another NCCL release in the nccl stage's place: the version torch loads is not the pin.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import uuid
from pathlib import Path

import pytest

from imageforge.model.stage import Check
from imageforge.planning import project
from imageforge.planning.plan import Plan
from stages import STAGES
from tests.integration.conftest import ROOT, docker_out, invoke, untagging

RUN = uuid.uuid4().hex[:8]
MANIFEST = ROOT / "manifests" / "torch211-nccl-wheel.toml"
COMMITTED = MANIFEST.with_name("torch211-nccl-wheel.lock.json")
BASE_IMAGE = "imageforge/base:bookworm"
BASE = f"image.base={BASE_IMAGE}"
SITE = "/opt/conda/lib/python3.11/site-packages"
LOADED = "import torch maps one libnccl, the NCCL wheel's, at NCCL 2.28.9"
# Outside the session clean-up's names (tests/engine_cleanup.py), as test_runlocal_job's
# toolkit image.
KEPT = "imageforge-testkit/torch-wheel"
# pip in the broken images' builds reaches PyPI through the host's CA bundle, as a secret.
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Another release of the same NCCL wheel, for the image whose library is not the pin.
OTHER_NCCL = "2.28.7"


# Every image this module made is untagged at its end (the layers stay in BuildKit's cache).
remove_tags = untagging(RUN)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("torch")
    path = folder / MANIFEST.name
    path.write_text(MANIFEST.read_text())
    (folder / COMMITTED.name).write_text(COMMITTED.read_text())
    return path


@pytest.fixture(scope="module")
def planned(manifest: Path, cache_dir: Path) -> Plan:
    settings = project.Settings(registry=STAGES, manifest=manifest, overrides=(BASE,),
                                cache_dir=cache_dir)
    return project.plan(settings, "pytorch")


@pytest.fixture(scope="module")
def checks(planned: Plan) -> dict[str, Check]:
    """The checks test-image would run for these stages, by name (hardware ones left out)."""
    found = {c.name: c for name in ("nccl", "pytorch")
             for c in STAGES[name].checks(planned.context) if c.needs == "none"}
    assert LOADED in found, sorted(found)
    return found


@pytest.fixture(scope="module")
def keys(planned: Plan) -> dict[str, str]:
    return {name: planned.stage(name).key for name in ("python", "nccl", "pytorch")}


@pytest.fixture(scope="module")
def image(manifest: Path, cache_dir: Path, keys: dict[str, str],
          tmp_path_factory: pytest.TempPathFactory) -> str:
    """The python, nccl and pytorch stages built by imageforge from the committed lock, the
    nccl and pytorch files laid over the python stage as an image target's assembly lays
    them. Kept between sessions under a name the session clean-up does not match, tagged
    with the stages' keys: a session whose stages have the same keys finds it and builds
    nothing (the 5 GB closure took 7 minutes to build and store again), and any change to
    the pins, the recipes or the base gives another tag, built again from the start."""
    tag = f"{KEPT}:" + hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16]
    if docker_out("image", "ls", "--quiet", tag):
        return tag
    stages = {}
    for name in ("python", "nccl", "pytorch"):
        stages[name] = f"imageforge-test/torch-wheel-{name}:{RUN}"
        result = invoke("build", "--manifest", str(manifest), "--set", BASE, "--target", name,
                        "--no-test", "--tag", stages[name], "--progress", "plain",
                        cache=cache_dir, timeout=1800)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
        assert "nvcc" not in result.stdout + result.stderr   # no NCCL compiled
    # Older keys' images go: one kept image at a time.
    for old in docker_out("image", "ls", "--format", "{{.Repository}}:{{.Tag}}",
                          KEPT).split():
        subprocess.run(["docker", "image", "rm", old], capture_output=True, check=False)
    derive(tmp_path_factory.mktemp("assemble"), tag, f"""
        FROM {stages["nccl"]} AS nccl
        FROM {stages["pytorch"]} AS pytorch
        FROM {stages["python"]}
        COPY --from=nccl /out/ /
        COPY --from=pytorch /out/ /
        RUN ldconfig
        """)
    # The stages' own images (10 GB with the closure) are not needed once assembled: the
    # rest of the suite gets the disk back now, not when the session ends.
    subprocess.run(["docker", "image", "rm", *stages.values()], capture_output=True,
                   check=False)
    return tag


def derive(context: Path, tag: str, dockerfile: str) -> str:
    text = "\n".join(line.strip() for line in dockerfile.strip().splitlines()) + "\n"
    result = subprocess.run(["docker", "build", "--quiet", "--tag", tag, "--file", "-",
                             "--secret", f"id=ca-bundle,src={CA_BUNDLE}", str(context)],
                            input=text, text=True, capture_output=True, check=False,
                            timeout=1800)
    assert result.returncode == 0, result.stderr[-4000:]
    return tag


def run_check(image: str, check: Check) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "run", "--rm", "--entrypoint", "bash", image, "-c",
                           check.script], capture_output=True, text=True, check=False,
                          timeout=300)


def test_every_check_passes_on_the_built_image(image: str, checks: dict[str, Check]) -> None:
    for name, check in checks.items():
        result = run_check(image, check)
        assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"
    loaded = run_check(image, checks[LOADED]).stdout
    # The library torch mapped, by the path the loader opened, and what it reports.
    assert "/usr/local/lib/libnccl.so.2.28.9" in loaded, loaded
    assert "2.28.9" in loaded, loaded


def test_one_libnccl_on_disk_and_torch_reaches_it_through_the_link(image: str) -> None:
    out = docker_out("run", "--rm", "--entrypoint", "bash", image, "-c",
                     f"find / -xdev -name 'libnccl.so*' -type f | sort; "
                     f"readlink {SITE}/nvidia/nccl/lib/libnccl.so.2; "
                     "env | grep -c '^LD_PRELOAD=' || true")
    assert out.split() == ["/usr/local/lib/libnccl.so.2.28.9", "/usr/local/lib/libnccl.so.2",
                           "0"], out


def test_a_second_libnccl_preloaded_fails_the_check(image: str, checks: dict[str, Check],
                                                    tmp_path: Path) -> None:
    broken = derive(tmp_path, f"imageforge-test/torch-wheel-preload:{RUN}", f"""
        FROM {image}
        RUN mkdir -p /opt/other && cp /usr/local/lib/libnccl.so.2.28.9 /opt/other/libnccl.so.2
        ENV LD_PRELOAD=/opt/other/libnccl.so.2
        """)
    result = run_check(broken, checks[LOADED])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the process mapped 2 libnccl files" in result.stdout + result.stderr
    assert "/opt/other/libnccl.so.2" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_the_wheels_own_copy_brought_back_by_pip_fails_the_check(
        image: str, checks: dict[str, Check], tmp_path: Path) -> None:
    broken = derive(tmp_path, f"imageforge-test/torch-wheel-reinstalled:{RUN}", f"""
        FROM {image}
        RUN --mount=type=secret,id=ca-bundle PIP_CERT=/run/secrets/ca-bundle \\
            /opt/conda/bin/pip install --quiet --no-deps --force-reinstall \\
            nvidia-nccl-cu13==2.28.9 && test ! -L {SITE}/nvidia/nccl/lib/libnccl.so.2
        """)
    result = run_check(broken, checks[LOADED])
    assert result.returncode == 1, result.stdout + result.stderr
    said = result.stdout + result.stderr
    assert f"the process loaded {SITE}/nvidia/nccl/lib/libnccl.so.2, not " \
           "/usr/local/lib/libnccl.so.2.28.9 (the NCCL wheel's library)" in said, said
    # The other NCCL checks look only at the nccl stage's prefix: this one is what catches it.
    assert run_check(broken, checks["exactly one libnccl visible to the dynamic linker"]
                     ).returncode == 0


def test_another_nccl_in_the_stages_place_fails_on_the_version(
        image: str, checks: dict[str, Check], tmp_path: Path) -> None:
    broken = derive(tmp_path, f"imageforge-test/torch-wheel-other-nccl:{RUN}", f"""
        FROM {image}
        RUN --mount=type=secret,id=ca-bundle PIP_CERT=/run/secrets/ca-bundle \\
            /opt/conda/bin/pip download --quiet --no-deps --dest /tmp/other \\
            nvidia-nccl-cu13=={OTHER_NCCL} \\
            && /opt/conda/bin/python -m zipfile -e /tmp/other/*.whl /tmp/other/tree \\
            && cp /tmp/other/tree/nvidia/nccl/lib/libnccl.so.2 /usr/local/lib/libnccl.so.2.28.9 \\
            && rm -rf /tmp/other
        """)
    result = run_check(broken, checks[LOADED])
    said = result.stdout + result.stderr
    assert result.returncode == 1, said
    assert (f"/usr/local/lib/libnccl.so.2.28.9 reports NCCL {OTHER_NCCL}, the pin is 2.28.9"
            in said), said
    # The nccl stage's own check, which loads the library without torch, agrees.
    stage = run_check(broken, checks["ncclGetVersion of the libnccl a process loads is the pin"])
    assert stage.returncode != 0, stage.stdout + stage.stderr
    assert OTHER_NCCL in stage.stdout + stage.stderr, stage.stdout + stage.stderr

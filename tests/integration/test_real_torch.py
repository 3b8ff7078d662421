"""A real torch inside an image imageforge built, and the checks that read the libnccl it
really loads, each proven to fail on a deliberately broken image.

The torch 2.11.0 cu130 wheel and its whole locked closure (nvidia-* wheels included) come from
PyPI with hash checking; NCCL is `provider = "wheel"`: the nvidia-nccl-cu13 2.28.9 wheel that
torch pins, unpacked into /usr/local/lib by the nccl stage, with torch's site-packages copy a
link to it (manifests/torch211-nccl-wheel.toml and its committed lock). `import torch` maps
libnccl without a GPU, so every check here runs on this machine. The plain Debian base stands
in for the CUDA one: torch's wheels bring their own CUDA runtime, and nothing is compiled.

The stages' files, the SageMaker training toolkit's among them, are laid over the base as the
training target's assembly does, once. run-local runs a real two-host DistributedDataParallel job
on that image (gloo: there is no GPU here), each host's torch mapping the image's one libnccl.
The broken images are that image changed after the build, as a user's derived Dockerfile would:
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

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.model.stage import Check
from imageforge.planning.plan import Plan
from stages import STAGES
from tests.integration.conftest import ROOT, derive, docker_out, invoke, untagging

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
# Another release of the same NCCL wheel, for the image whose library is not the pin.
OTHER_NCCL = "2.28.7"
# One DistributedDataParallel step on each host over gloo (the hosts reach each other by the
# names SageMaker gives them), then what that process mapped: the job is the image's own torch
# training, not a script beside it.
DDP_PROGRAM = """\
import json, os
import torch, torch.distributed as dist
hosts = json.loads(os.environ["SM_HOSTS"])
rank = hosts.index(os.environ["SM_CURRENT_HOST"])
dist.init_process_group("gloo", init_method=f"tcp://{hosts[0]}:29500", rank=rank,
                        world_size=len(hosts))
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.full((8, 4), float(rank + 1))).pow(2).mean().backward()
optimizer.step()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
maps = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libnccl" in line})
record = {"rank": rank, "world": dist.get_world_size(), "sum": total.item(),
          "weight": model.module.weight.detach().tolist(), "torch": torch.__version__,
          "libnccl": maps}
with open(os.path.join(os.environ["SM_MODEL_DIR"], "record.json"), "w") as f:
    json.dump(record, f)
dist.destroy_process_group()
"""
# The stages laid over the python stage, as the training target lays them (it adds efa,
# aws-ofi-nccl and nccl-tests, which test_real_parts builds for real).
STAGED = ("nccl", "pytorch", "sagemaker-training")


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
    settings = Workspace(registry=STAGES, manifest=manifest, overrides=(BASE,),
                                cache_dir=cache_dir)
    # The training target's plan: its context has every stage the kept image lays down.
    return project.plan(settings, "training")


@pytest.fixture(scope="module")
def checks(planned: Plan) -> dict[str, Check]:
    """The checks test-image would run for these stages, by name (hardware ones left out)."""
    found = {c.name: c for name in STAGED
             for c in STAGES[name].checks(planned.context) if c.needs == "none"}
    assert LOADED in found, sorted(found)
    return found


@pytest.fixture(scope="module")
def keys(planned: Plan) -> dict[str, str]:
    return {name: planned.stage(name).key for name in ("python", *STAGED)}


@pytest.fixture(scope="module")
def image(manifest: Path, cache_dir: Path, keys: dict[str, str], planned: Plan,
          tmp_path_factory: pytest.TempPathFactory) -> str:
    """The python, nccl, pytorch and sagemaker-training stages built by imageforge from the
    committed lock, and their files laid over the python stage as the training target's
    assembly lays them, followed by that target's own rendered environment and steps (one
    libnccl, one dist-info per package). Kept between sessions under a name the session
    clean-up does not match, tagged with the stages' keys and those steps: a session whose
    stages have the same keys finds it and builds nothing (the 5 GB closure took 7 minutes to
    build and store again), and any change to the pins, the recipes or the base gives another
    tag, built again from the start."""
    # The training target's own block after its COPY lines: its ENV (PATH and the toolkit's
    # variables; the efa ones name what this image lacks, harmlessly) and its steps.
    block = planned.stage("training").recipe
    training = block[block.index("\nENV ") + 1:]
    made = json.dumps([keys, training], sort_keys=True).encode()
    tag = f"{KEPT}:" + hashlib.sha256(made).hexdigest()[:16]
    if docker_out("image", "ls", "--quiet", tag):
        return tag
    stages = {}
    for name in ("python", *STAGED):
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
    derive(tmp_path_factory.mktemp("assemble"), tag, "\n".join([
        *(f"FROM {stages[name]} AS {name}" for name in STAGED),
        f"FROM {stages['python']}",
        *(f"COPY --from={name} /out/ /" for name in STAGED),
        "RUN ldconfig",
        training,
    ]))
    # The stages' own images (10 GB with the closure) are not needed once assembled: the
    # rest of the suite gets the disk back now, not when the session ends.
    subprocess.run(["docker", "image", "rm", *stages.values()], capture_output=True,
                   check=False)
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


def test_run_local_trains_ddp_on_two_hosts_with_the_images_torch(image: str,
                                                                  tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(DDP_PROGRAM)
    out = tmp_path / "job"
    result = invoke("run-local", "--image", image, "--code", str(code), "--program",
                    "train.py", "--hosts", "2", "--output", str(out), "--timeout", "300",
                    "--json", timeout=420)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert json.loads(result.stdout)["status"] == "Completed", result.stdout
    records = [json.loads((out / host / "model" / "record.json").read_text())
               for host in ("algo-1", "algo-2")]
    assert [r["rank"] for r in records] == [0, 1]
    for record in records:
        assert (record["world"], record["sum"]) == (2, 3.0), record
        assert record["torch"].startswith("2.11.0+"), record
        # The job's own torch mapped the image's one libnccl, through the wheel's link.
        assert record["libnccl"] == ["/usr/local/lib/libnccl.so.2.28.9"], record
    # DDP averaged the two hosts' gradients: both took the same step from the same start.
    assert records[0]["weight"] == records[1]["weight"]

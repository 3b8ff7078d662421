"""Golden Dockerfiles for the two seed images, reviewed line by line against the seeds.

After an intended change, `invoke goldens` rewrites them; review the diff. The tests here
only compare: they never write a golden file.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
from invoke.context import MockContext

import tasks
from imageforge.app import project
from imageforge.app.workspace import Workspace
from stages import STAGES
from tasks import GOLDEN_DOCKERFILES

ROOT = Path(__file__).resolve().parents[2]


def rendered(manifest: str, target: str) -> str:
    settings = Workspace(registry=STAGES, manifest=Path(manifest))
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        return project.dockerfile(project.plan(settings, target))
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize(("manifest", "target", "golden"), GOLDEN_DOCKERFILES,
                         ids=[target for _, target, _ in GOLDEN_DOCKERFILES])
def test_rendered_dockerfile_matches_golden(manifest: str, target: str, golden: str) -> None:
    if os.environ.get("IMAGEFORGE_UPDATE_GOLDEN"):
        pytest.fail("IMAGEFORGE_UPDATE_GOLDEN is not read by the tests: run `invoke goldens`, "
                    "review the diff, then run the tests without it.")
    text = rendered(manifest, target)
    expected = (ROOT / golden).read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            golden, "rendered"))
        pytest.fail(f"rendering of {target} changed (`invoke goldens` after an intended "
                    f"change):\n{diff}")


def test_the_goldens_task_writes_what_the_test_compares(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    copies = tuple((m, t, str(tmp_path / Path(g).name)) for m, t, g in GOLDEN_DOCKERFILES)
    monkeypatch.setattr(tasks, "GOLDEN_DOCKERFILES", copies)
    monkeypatch.chdir(ROOT)

    tasks.goldens(MockContext())

    for (manifest, target, _), (_, _, written) in zip(GOLDEN_DOCKERFILES, copies, strict=True):
        assert Path(written).read_text() == rendered(manifest, target)


def test_seed_002_commands_are_rendered_faithfully() -> None:
    text = rendered("manifests/smddp.toml", "smddp")
    assert "./efa_installer.sh -y --skip-kmod -g" in text
    # The seed's two archs, plus PTX for the newest so NCCL runs on newer GPUs too.
    assert ("'NVCC_GENCODE=-gencode=arch=compute_70,code=sm_70 "
            "-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=compute_80'") in text
    assert "'TORCH_CUDA_ARCH_LIST=3.7 5.0 7.0+PTX 8.0'" in text
    assert "USE_SYSTEM_NCCL=1 NCCL_ROOT=/opt/conda" in text
    assert "--with-nccl=/opt/conda" in text
    assert "threading=multi cxxflags=-fPIC cflags=-fPIC install" in text
    assert "|| true" not in text
    assert "env SMDATAPARALLEL_PT=1 /opt/conda/bin/pip install" in text
    assert 'RDMAV_FORK_SAFE="1"' in text
    assert "/opt/conda/lib/python3.8/site-packages/smdistributed/dataparallel/lib" in text
    assert "BUILD_VERSION=0.11.3+cu113" in text
    # The seed's baked private key is off by default: keys are made when a container starts.
    assert "ssh-keygen -q -t rsa" not in text
    assert "ssh-keygen -A" in text
    assert 'ENTRYPOINT ["/usr/local/bin/imageforge-entrypoint"]' in text
    assert "\nsagemaker-training==5.1.4\nsagemaker-pytorch-training==3.0.0\n" in text
    # The seed's `pip install -U` moved what the toolkit stage pinned: not any more.
    assert "pip install -U" not in text
    assert "-r /opt/imageforge/pip/smddp.txt" in text


def test_seed_000_builds_nccl_for_every_arch_without_gencode() -> None:
    text = rendered("manifests/efa-nccl.toml", "efa-nccl")
    assert "NVCC_GENCODE" not in text
    assert ("make -j\"$(nproc)\" MPI=1 MPI_HOME=/opt/amazon/openmpi CUDA_HOME=/usr/local/cuda "
            "NCCL_HOME=/usr/local") in text
    assert "--with-nccl=/usr/local --prefix=/usr/local" in text


def test_true_dependencies_not_seed_line_order() -> None:
    plan = project.plan(Workspace(registry=STAGES,
                                         manifest=ROOT / "manifests/smddp.toml"), "smddp")
    deps = {s.name: set(s.deps) for s in plan.stages}
    assert deps["boost"] == {"base"}
    assert "efa" not in deps["pytorch"]
    assert "nccl" in deps["pytorch"]
    assert {"efa", "nccl"} <= deps["aws-ofi-nccl"]
    assert "pytorch" not in deps["aws-ofi-nccl"]


def test_cached_stage_sections_are_named_build_stages() -> None:
    text = rendered("manifests/smddp.toml", "smddp")
    names = [line.split(" AS ")[1] for line in text.splitlines() if line.startswith("FROM ")]
    assert names == ["base", "efa", "nccl", "aws-ofi-nccl", "boost", "python", "pytorch",
                     "sagemaker-training", "torchvision", "smddp"]

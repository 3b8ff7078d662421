"""PyTorch from its wheels, rendered from manifests/real-pytorch.toml and its lock (whose NCCL
was resolved "auto" from the torch 2.14.1 wheel's own pin): the locked closure installed with
hash checking, the wheel's libnccl replaced by the nccl stage's, no LD_PRELOAD anywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from imageforge.errors import CompatibilityError
from imageforge.model import compat
from imageforge.model.manifest import load
from imageforge.model.stage import Context, chosen_deps
from imageforge.planning import pipinstall, rules
from stages import STAGES, pytorch_wheel

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "manifests" / "real-pytorch.toml"
INVOKE = str(Path(sys.executable).with_name("invoke"))
SITE = "/opt/conda/lib/python3.11/site-packages"


def render(*sets: str) -> str:
    args = [a for s in sets for a in ("--set", s)]
    result = subprocess.run([INVOKE, "render", "--target", "training", "--manifest",
                             str(MANIFEST), *args], cwd=ROOT, capture_output=True, text=True,
                            check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return render()


def test_the_lock_pins_nccl_from_the_wheel_and_every_wheel_by_hash() -> None:
    lock = json.loads(MANIFEST.with_suffix(".lock.json").read_text())
    text = json.dumps(lock)
    assert '"requires": "nvidia-nccl-cu13==2.30.7"' in text
    assert '"tag": "v2.30.7-1"' in text
    pip = next(v for k, v in lock.items() if k == "pip" or k.endswith("pip"))
    packages = {p["name"]: p for p in pip["pytorch"]["packages"]}
    assert packages["torch"]["version"] == "2.14.1"
    assert packages["nvidia-nccl-cu13"]["version"] == "2.30.7"
    assert packages["torchvision"]["version"] == "0.29.1"
    assert all(p["hashes"] and all(h.startswith("sha256:") for h in p["hashes"])
               for p in packages.values())


def test_the_closure_installs_with_hash_checking_and_the_wheels_nccl_is_replaced(
        dockerfile: str) -> None:
    assert "torch==2.14.1 \\\n    --hash=sha256:" in dockerfile
    assert "--require-hashes" in dockerfile
    link = f"ln -sfn /usr/local/lib/libnccl.so.2 /out{SITE}/nvidia/nccl/lib/libnccl.so.2"
    assert link in dockerfile
    assert "LD_PRELOAD" not in dockerfile
    # No PyTorch source: nothing cloned, nothing compiled for torch.
    assert "src-pytorch" not in dockerfile
    assert "setup.py install" not in dockerfile


def test_nccl_version_auto_became_the_wheels_pin(dockerfile: str) -> None:
    assert "NCCL_VERSION=2.30.7" in dockerfile or 'NCCL_VERSION="2.30.7"' in dockerfile


def test_the_variant_comes_from_image_cuda_unless_given() -> None:
    image = {"cuda": "13.0", "python": "3.11"}
    assert pytorch_wheel.variant(Context(image=image, stages={"pytorch": {}})) == "cu130"
    given = Context(image=image, stages={"pytorch": {"variant": "cu132"}})
    assert pytorch_wheel.variant(given) == "cu132"


def test_the_checks_expect_the_nccl_stages_library_whoever_made_it() -> None:
    image = {"cuda": "13.0", "python": "3.11"}
    inputs = {"pytorch": {"version": "2.14.1", "provider": "wheel"},
              "nccl": {"version": "2.30.7", "prefix": "/opt/nccl", "provider": "source"}}
    checks = pytorch_wheel.checks(Context(image=image, stages=inputs))
    names = [c.name for c in checks]
    assert "import torch maps one libnccl, the nccl stage's, at NCCL 2.30.7" in names
    assert "pip check is clean" in names
    script = next(c.script for c in checks if "libnccl" in c.name)
    assert "/opt/nccl/lib/libnccl.so.2" in script
    wheel = Context(image=image, stages={**inputs, "nccl": {**inputs["nccl"],
                                                            "provider": "wheel"}})
    checks = pytorch_wheel.checks(wheel)
    assert "import torch maps one libnccl, the NCCL wheel's, at NCCL 2.30.7" in \
        [c.name for c in checks]
    # The NCCL wheel's library is unpacked into the nccl stage: the same one path either way.
    script = next(c.script for c in checks if "libnccl" in c.name)
    assert "/opt/nccl/lib/libnccl.so.2" in script
    assert f"{SITE}/nvidia" not in script


@pytest.mark.parametrize(("setting", "key", "provider"), [
    ("stages.pytorch.max_jobs=2", "max_jobs", "wheel"),
    ("stages.pytorch.repo=https://example.com/pytorch.git", "repo", "wheel"),
    ("stages.pytorch.extra_cuda_arch=[\"8.0\"]", "extra_cuda_arch", "wheel"),
])
def test_a_source_only_key_with_wheels_is_refused_naming_it(setting: str, key: str,
                                                            provider: str) -> None:
    result = subprocess.run([INVOKE, "plan", "--target", "training", "--manifest", str(MANIFEST),
                             "--set", setting], cwd=ROOT, capture_output=True, text=True,
                            check=False, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"imageforge: error: {MANIFEST}: stages.pytorch.{key} applies only to "
        f"provider = \"source\", and this table has provider = \"{provider}\"; remove the key or "
        "change the provider."]


def test_a_wheel_only_key_with_a_source_build_is_refused() -> None:
    result = subprocess.run([INVOKE, "plan", "--target", "smddp", "--manifest",
                             str(ROOT / "manifests" / "sample.toml"), "--set",
                             "stages.pytorch.variant=cu113"], cwd=ROOT, capture_output=True,
                            text=True, check=False, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "stages.pytorch.variant applies only to provider = \"wheel\"" in result.stderr
    assert "Traceback" not in result.stderr


def test_stale_dist_info_of_locked_packages_goes_and_nothing_else(tmp_path: Path) -> None:
    """What the real build found: the venv's setuptools 66.1.1 dist-info beside the locked
    84.2.1 one made `pip check` fail. The image's step, run here as the image runs it."""
    for info in ("setuptools-66.1.1", "setuptools-84.2.1", "pip-23.0.1", "pip-26.3",
                 "typing_extensions-4.16.0", "Typing_Extensions-4.1.0", "other-1.0"):
        (tmp_path / f"{info}.dist-info").mkdir()
    locked = [{"name": "setuptools", "version": "84.2.1"}, {"name": "pip", "version": "26.3"},
              {"name": "typing-extensions", "version": "4.16.0"}]
    line = pipinstall.drop_stale_dist_info(sys.executable, str(tmp_path), locked)
    command, _, rest = line.removeprefix("RUN ").partition(" <<'EOF'\n")
    script = rest.removesuffix("EOF")
    result = subprocess.run(f"{command} <<'EOF'\n{script}EOF\n", shell=True, check=True,
                            capture_output=True, text=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "other-1.0.dist-info", "pip-26.3.dist-info", "setuptools-84.2.1.dist-info",
        "typing_extensions-4.16.0.dist-info"]
    assert "removed stale setuptools-66.1.1.dist-info" in result.stdout


def test_the_training_image_drops_stale_dist_info(dockerfile: str) -> None:
    assert "setuptools==84.2.1" in dockerfile
    assert "removed stale" in dockerfile


def test_smddp_with_pytorch_2_6_or_newer_is_refused_with_its_source() -> None:
    def check(version: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([INVOKE, "check", "--manifest",
                               str(ROOT / "manifests" / "pt25-cu124.toml"), "--set",
                               f"stages.pytorch.version={version}"], cwd=ROOT,
                              capture_output=True, text=True, check=False, timeout=120)
    refused = check("2.6.0")
    assert refused.returncode == 3, refused.stderr
    assert "[smddp-no-pytorch-2-6] stages.smddp: SMDDP's last release is for PyTorch 2.5, but " \
           "stages.pytorch.version is 2.6.0." in refused.stdout + refused.stderr
    assert "PR #4619" in refused.stdout + refused.stderr
    assert "[smddp-no-pytorch-2-6]" not in (check("2.5.1").stdout + check("2.5.1").stderr)


@pytest.mark.parametrize(("manifest", "packages", "fix"), [
    ("real-pytorch", "torchvision==0.29.1", None),
    ("real-torch211", "torchvision==0.26.0,torchaudio==2.11.0", None),
    # 0.29.1's wheel requires torch>=2.14.0, so pip would take it beside a later torch too.
    ("real-pytorch", "torchvision==0.28.0",
     "torchvision 0.28.0 is built for PyTorch 2.13; use torchvision 0.29.x with PyTorch 2.14"),
    # torchaudio 2.11.0's wheel requires no torch at all; its last release is 2.11.
    ("real-pytorch", "torchaudio==2.11.0",
     "torchaudio 2.11.0 is made for PyTorch 2.11, and torchaudio has no release for PyTorch "
     "2.14 (its last is 2.11); drop it"),
    ("real-torch211", "torchaudio==2.10.0",
     "torchaudio 2.10.0 is made for PyTorch 2.10; use torchaudio 2.11.x"),
])
def test_companion_wheels_are_paired_with_torch(manifest: str, packages: str,
                                                fix: str | None) -> None:
    loaded = load(ROOT / "manifests" / f"{manifest}.toml", [f"stages.pytorch.packages={packages}"],
                  registry=STAGES)
    found = [v for v in compat.check(loaded, registry=STAGES)
             if v.rule == "torch-wheel-companions"]
    if fix is None:
        assert found == []
        return
    [violation] = found
    assert violation.key == "stages.pytorch.packages"
    assert violation.fix == fix
    assert "(stages.pytorch.version)" in violation.message


def test_companion_wheels_of_a_source_build_are_not_judged_by_the_wheel_rule() -> None:
    loaded = load(ROOT / "manifests/smddp.toml", [], registry=STAGES)
    assert [v for v in compat.check(loaded, registry=STAGES)
            if v.rule == "torch-wheel-companions"] == []


def test_the_waiver_example_names_the_rule_that_was_broken() -> None:
    loaded = load(ROOT / "manifests/real-pytorch.toml",
                  ["stages.pytorch.packages=torchvision==0.28.0"], registry=STAGES)
    with pytest.raises(CompatibilityError) as refused:
        rules.enforce(loaded, None, registry=STAGES)
    assert str(refused.value).splitlines()[-1].endswith(
        'e.g. [waive] torch-wheel-companions = "why".')


def plan_keys(*sets: str) -> dict[str, str]:
    args = [a for s in sets for a in ("--set", s)]
    result = subprocess.run([INVOKE, "plan", "--json", "--target", "training", "--manifest",
                             str(MANIFEST), *args], cwd=ROOT, capture_output=True, text=True,
                            check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    return {s["name"]: s["key"] for s in json.loads(result.stdout)["stages"]}


def test_an_nccl_bump_keeps_the_wheel_closures_key(dockerfile: str) -> None:
    """A wheel torch only links to the nccl stage's path, so NCCL is not among its deps: a
    new NCCL rebuilds NCCL and what is built against it, never the 4.7 GB wheel install."""
    before = plan_keys()
    after = plan_keys("stages.nccl.version=2.29.7", "waive.nccl-pytorch-pin=a test of keys")
    assert {n for n in before if before[n] != after[n]} == {
        "nccl", "aws-ofi-nccl", "nccl-tests", "training"}
    # The pytorch block copies no NCCL; the image gathers both, so the link resolves there.
    blocks = dict(part.split(" ----\n", 1) for part in dockerfile.split("\n# ---- ")[1:])
    assert "--from=nccl" not in blocks["pytorch"]
    assert "COPY --from=nccl " in blocks["training"]


def test_a_source_built_torch_still_keys_on_its_nccl() -> None:
    """The deps a setting picks (Stage.deps_for), each way: source builds compile against the
    nccl stage, and a source torchvision on a wheel torch needs it to import torch."""
    tables = {"pytorch": {"provider": "source"}}
    graph = chosen_deps(STAGES, tables)
    assert graph["pytorch"].deps == ("python", "nccl")
    assert graph["torchvision"].deps == ("python", "pytorch")
    wheel = chosen_deps(STAGES, {"pytorch": {"provider": "wheel"}})
    assert wheel["pytorch"].deps == ("python",)
    assert wheel["torchvision"].deps == ("python", "pytorch", "nccl")
    assert chosen_deps(STAGES, {}) == graph  # no table: the default provider, "source"
    # Every choice is among the declared deps, which static graphs (dag.closure) use.
    for name, stage in STAGES.items():
        for provider in ("source", "wheel"):
            chosen = chosen_deps(STAGES, {"pytorch": {"provider": provider}})[name].deps
            assert set(chosen) <= set(stage.deps), name

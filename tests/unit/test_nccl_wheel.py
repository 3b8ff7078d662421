"""`[stages.nccl] provider = "wheel"`: the library of the NCCL wheel the torch wheel pins, locked
by the sha256 its index publishes and unpacked into the nccl stage's prefix, with no NCCL
compiled. A real index on 127.0.0.1 serves the wheels (the stand-ins: real torch and NCCL
wheels are 554 MB and 196 MB; tests/integration/test_real_nccl_wheel.py unpacks the real NCCL
one)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from imageforge.app.project import prepare
from imageforge.errors import LockError, ManifestError
from imageforge.model.lockpin import Upstream
from imageforge.model.manifest import Manifest, load
from imageforge.model.sourcetypes import UrlSource
from imageforge.model.stage import Context, keyed_inputs
from stages import STAGES, nccl_pytorch_pin, pytorch_wheel
from tests.unit.test_wheelmeta import Index, build_wheel, serve

X86 = "cp311-cp311-manylinux_2_28_x86_64"
NCCL_X86 = "py3-none-manylinux_2_18_x86_64"
WHERE = Upstream(locate=lambda url: url, mirrors=Path("/nonexistent"))


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    """PyPI's layout: torch 2.14.1 requiring nvidia-nccl-cu13==2.30.7, and that NCCL wheel for
    two platforms beside an older release."""
    files = {}
    for project, version, tag, requires in [
            ("torch", "2.14.1", X86, ("nvidia-nccl-cu13==2.30.7",)),
            ("nvidia_nccl_cu13", "2.30.7", NCCL_X86, ()),
            ("nvidia_nccl_cu13", "2.30.7", "py3-none-manylinux_2_18_aarch64", ()),
            ("nvidia_nccl_cu13", "2.30.6", NCCL_X86, ())]:
        path = build_wheel(tmp_path, version, tag, requires=requires, project=project,
                           payload=b"x" * 1000)
        files[path.name] = path.read_bytes()
    with serve(Index(files=files, project="torch", also=("nvidia-nccl-cu13",))) as served:
        yield served


def manifest(tmp_path: Path, index: str = "https://pypi.org/simple", *,
             nccl: str = 'version = "auto"\nprovider = "wheel"',
             pytorch: str = 'provider = "wheel"', sets: tuple[str, ...] = ()) -> Manifest:
    path = tmp_path / "wheel-nccl.toml"
    path.write_text(f"""[image]
name = "wheel-nccl"
base = "imageforge/base:bookworm"
cuda = "13.0"
cuda_arch = ["9.0"]
python = "3.11"

[stages.python]
provider = "venv"

[stages.nccl]
{nccl}

[stages.pytorch]
version = "2.14.1"
index = "{index}"
{pytorch}
""")
    # What every command does once the lock is applied: each stage's own refusals.
    return prepare(load(path, sets, registry=STAGES), STAGES)


def test_the_pin_is_the_platforms_nccl_wheel_by_the_sha256_its_index_publishes(
        index: Index, tmp_path: Path) -> None:
    found = manifest(tmp_path, index.url)
    pin = nccl_pytorch_pin.resolve(found, STAGES, WHERE)
    wheel = f"nvidia_nccl_cu13-2.30.7-{NCCL_X86}.whl"
    assert pin["version"] == "2.30.7"
    assert pin["wheel_url"] == f"{index.url.removesuffix('/simple')}/files/{wheel}"
    assert pin["sha256"] == hashlib.sha256(index.files[wheel]).hexdigest()
    assert pin["evidence"]["requires"] == "nvidia-nccl-cu13==2.30.7"
    assert "commit" not in pin   # no git: nothing of NCCL's repository is read
    # Locked from the index page alone: the NCCL wheel itself is fetched only to build.
    assert index.served[f"/files/{wheel}"] == 0
    # A lock written before the provider existed stays current for a source build.
    origin = nccl_pytorch_pin.origin(found, STAGES)
    assert origin is not None
    assert origin["nccl_provider"] == "wheel"
    source = manifest(tmp_path, index.url, nccl='version = "auto"')
    assert "nccl_provider" not in (nccl_pytorch_pin.origin(source, STAGES) or {})


def test_the_stage_unpacks_that_wheel_into_its_prefix_and_compiles_nothing(
        index: Index, tmp_path: Path) -> None:
    found = manifest(tmp_path, index.url)
    applied = nccl_pytorch_pin.apply(found, nccl_pytorch_pin.resolve(found, STAGES, WHERE))
    # The refusals run again on the locked manifest: the ref filled in while the version was
    # "auto" is still the default, not a source-only key someone set.
    applied = prepare(applied, STAGES)
    inputs = applied.stages["nccl"]
    ctx = Context(image=applied.image, stages=applied.stages)
    [source] = STAGES["nccl"].sources(ctx)
    assert isinstance(source, UrlSource)
    assert (source.name, source.sha256) == ("src-nccl", inputs["sha256"])
    recipe = STAGES["nccl"].recipe(ctx)
    wheel = f"/tmp/nccl-wheel/nvidia_nccl_cu13-2.30.7-{NCCL_X86}.whl"
    assert f"echo '{inputs['sha256']}  {wheel}' | sha256sum -c --quiet" in recipe
    assert f"python3 -m zipfile -e {wheel} /tmp/nccl-wheel-tree" in recipe
    lib = "/out/usr/local/lib"
    assert f"mv /tmp/nccl-wheel-tree/nvidia/nccl/lib/libnccl.so.2 {lib}/libnccl.so.2.30.7" \
        in recipe
    assert f"ln -s libnccl.so.2.30.7 {lib}/libnccl.so.2" in recipe
    assert "make" not in recipe
    assert "nvcc" not in recipe.lower()
    # Where the wheel came from is not the key once its sha256 is; the sha256 and provider are.
    keyed = keyed_inputs(STAGES["nccl"], inputs)
    assert (keyed["provider"], keyed["sha256"]) == ("wheel", inputs["sha256"])
    assert "wheel_url" not in keyed
    # At their defaults (a source build) the three keys are not in the key at all.
    built = manifest(tmp_path, index.url, nccl='version = "auto"').stages["nccl"]
    assert not {"provider", "wheel_url", "sha256"} & keyed_inputs(STAGES["nccl"], built).keys()


def test_torch_links_its_copy_to_the_stage_and_its_check_names_the_wheel(
        index: Index, tmp_path: Path) -> None:
    found = manifest(tmp_path, index.url)
    applied = nccl_pytorch_pin.apply(found, nccl_pytorch_pin.resolve(found, STAGES, WHERE))
    ctx = Context(image=applied.image, stages=applied.stages)
    site = "/out/opt/conda/lib/python3.11/site-packages"
    assert (f"ln -sfn /usr/local/lib/libnccl.so.2 {site}/nvidia/nccl/lib/libnccl.so.2"
            in pytorch_wheel.recipe(ctx))
    names = [check.name for check in pytorch_wheel.checks(ctx)]
    assert "import torch maps one libnccl, the NCCL wheel's, at NCCL 2.30.7" in names


@pytest.mark.parametrize(("line", "key"), [
    ('only_funcs = "AllReduce Sum f32 * *"', "only_funcs"),
    ('repo = "https://example.com/nccl.git"', "repo"),
    ("static = true", "static"),
    ('commit = "' + "a" * 40 + '"', "commit"),
])
def test_a_source_only_key_with_the_wheel_provider_is_refused_naming_it(
        tmp_path: Path, line: str, key: str) -> None:
    with pytest.raises(ManifestError, match=rf"stages\.nccl\.{key} applies only to provider = "
                                            r'"source", and this table has provider = "wheel"'):
        manifest(tmp_path, nccl=f'version = "auto"\nprovider = "wheel"\n{line}')


def test_the_wheel_provider_needs_version_auto(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r'stages\.nccl\.version must be "auto" '
                                            r"\(it is '2\.30\.7'\)"):
        manifest(tmp_path, nccl='version = "2.30.7"\nprovider = "wheel"')


def test_a_wheel_url_for_a_source_build_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"stages\.nccl\.wheel_url applies only to "
                                            r'provider = "wheel"'):
        manifest(tmp_path, nccl='version = "auto"\nwheel_url = "https://example.com/n.whl"')


def test_the_wheel_provider_under_a_source_built_torch_is_refused(tmp_path: Path) -> None:
    found = manifest(tmp_path, pytorch='provider = "source"',
                     sets=("stages.pytorch.index=https://pypi.org/simple",))
    with pytest.raises(ManifestError, match=r'stages\.pytorch\.provider is "source"'):
        nccl_pytorch_pin.resolve(found, STAGES, WHERE)


@pytest.mark.parametrize(("entry", "key"), [
    ({"version": "2.30.7; curl x | sh", "sha256": "a" * 64,
      "wheel_url": "https://pypi.org/n.whl"}, "version"),
    ({"version": ["2.30.7"], "sha256": "a" * 64, "wheel_url": "https://pypi.org/n.whl"},
     "version"),
    ({"version": "2.30.7", "sha256": "nothex", "wheel_url": "https://pypi.org/n.whl"},
     "sha256"),
    ({"version": "2.30.7", "sha256": "a" * 64, "wheel_url": "https://x/$(id).whl"},
     "wheel_url"),
    ({"version": "2.30.7", "sha256": "a" * 64}, "wheel_url"),
])
def test_a_hostile_lock_entry_is_refused_before_it_reaches_a_recipe(
        tmp_path: Path, entry: dict[str, object], key: str) -> None:
    with pytest.raises(LockError, match=rf"the lock's nccl_pytorch_pin entry has no valid {key}"):
        nccl_pytorch_pin.apply(manifest(tmp_path), entry)


def test_a_hostile_commit_in_a_source_builds_entry_is_refused(tmp_path: Path) -> None:
    source = manifest(tmp_path, nccl='version = "auto"')
    with pytest.raises(LockError, match=r"no valid commit \(found 'main; id'\)"):
        nccl_pytorch_pin.apply(source, {"version": "2.30.7", "commit": "main; id"})

"""EFA installer 1.38 and later ship aws-ofi-nccl themselves; `[stages.aws-ofi-nccl] provider =
"efa"` takes that plugin instead of building a second one.

The sample's two such installers (1.38.0 and 1.43.0, `python -m sample efa-installer`) are run
here on the host into a root of their own, as the real installer's layout varies: each puts the
plugin in another directory, and the plugin must load against the libfabric that installer
brought. tests/integration/test_efa_plugin_image.py builds an image on each."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from imageforge.app.project import prepare
from imageforge.errors import ManifestError
from imageforge.model.manifest import Manifest, load
from imageforge.model.stage import Context, keyed_inputs
from sample.generate import BUNDLING_EFA_RELEASES, EfaRelease, efa_artifact
from stages import STAGES, aws_ofi_nccl_efa

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


@pytest.fixture(scope="module", params=BUNDLING_EFA_RELEASES, ids=lambda r: r.version)
def installed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[EfaRelease, Path]:
    """(release, root) of the installer run with EFA_INSTALL_ROOT=root."""
    release: EfaRelease = request.param
    work = tmp_path_factory.mktemp(f"efa-{release.version}")
    artifact = efa_artifact(release)
    (work / artifact.name).write_bytes(artifact.data)
    with tarfile.open(work / artifact.name) as tar:
        tar.extractall(work, filter="data")
    root = work / "root"
    done = subprocess.run(["./efa_installer.sh", "-y", "--skip-kmod", "-g"],
                          cwd=work / "aws-efa-installer", capture_output=True, text=True,
                          env={**os.environ, "EFA_INSTALL_ROOT": str(root)}, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "aws-ofi-nccl was installed in /opt/amazon/ofi-nccl" in done.stdout
    return release, root


def test_each_installer_puts_its_plugin_in_a_directory_of_its_own(
        installed: tuple[EfaRelease, Path]) -> None:
    release, root = installed
    shipped = sorted(str(p.relative_to(root)) for p in root.rglob("libnccl-net*.so"))
    where = f"opt/amazon/ofi-nccl/{release.plugin_dir}"
    assert shipped == [f"{where}/libnccl-net-ofi.so", f"{where}/libnccl-net.so"]
    assert os.readlink(root / where / "libnccl-net.so") == "libnccl-net-ofi.so"
    # The layouts differ, which is what the stage must not assume.
    assert len({r.plugin_dir for r in BUNDLING_EFA_RELEASES}) == len(BUNDLING_EFA_RELEASES)


# The head of NCCL's ncclNet_v4_t (name, init(logger), devices(int*)), as NCCL reads the
# plugin's ncclNetPlugin_v4 after dlopen.
PROBE = """
import ctypes, sys
class Net(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p),
                ("init", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)),
                ("devices", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int)))]
net = Net.in_dll(ctypes.CDLL(sys.argv[1]), "ncclNetPlugin_v4")
count = ctypes.c_int()
assert net.init(None) == 0 and net.devices(ctypes.byref(count)) == 0
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libfabric" in l})
print(net.name.decode().replace(" ", "_"), count.value, *maps)
"""


def test_the_shipped_plugin_initialises_on_the_installers_libfabric(
        installed: tuple[EfaRelease, Path]) -> None:
    """What NCCL does with it: dlopen by its name, ncclNetPlugin_v4, init, devices. In a child
    process, whose loader path is the installer's libfabric."""
    release, root = installed
    plugin = root / "opt/amazon/ofi-nccl" / release.plugin_dir / "libnccl-net.so"
    libfabric = root / "opt/amazon/efa/lib"
    run = subprocess.run([sys.executable, "-c", PROBE, str(plugin)], capture_output=True,
                         text=True, check=False,
                         env={**os.environ, "LD_LIBRARY_PATH": str(libfabric)})
    assert run.returncode == 0, run.stderr
    name, devices, mapped = run.stdout.split()
    assert name == "AWS_Libfabric"
    assert int(devices) > 0   # the sample libfabric lists an EFA device, as an EFA host does
    assert mapped.startswith(str(libfabric))
    assert f"aws-ofi-nccl {release.plugin}".encode() in plugin.resolve().read_bytes()


SAMPLE_PLUGIN = """version = "1.1.3-aws"
repo = "http://127.0.0.1:8741/git/aws-ofi-nccl.git"
commit = "cbb9da23d7d9c5e1a452f9a6521c9ded7979323e"
"""


def manifest(tmp_path: Path, plugin: str = SAMPLE_PLUGIN) -> Manifest:
    """The sample manifest on EFA 1.38.0 with `plugin` as its [stages.aws-ofi-nccl] table."""
    text = (MANIFESTS / "sample.toml").read_text()
    assert SAMPLE_PLUGIN in text
    path = tmp_path / "bundled.toml"
    path.write_text(text.replace(SAMPLE_PLUGIN, plugin))
    return prepare(load(path, ("stages.efa.version=1.38.0",), registry=STAGES), STAGES)


def context(loaded: Manifest) -> Context:
    return Context(image=loaded.image, stages=loaded.stages)


BUNDLED = 'provider = "efa"\nversion = "1.9.1"\n'


@pytest.mark.parametrize(("key", "value"), [
    ("configure_flags", '["--disable-tests"]'),
    ("repo", '"https://example.com/aws-ofi-nccl.git"'),
    ("url", '"https://example.com/aws-ofi-nccl-{version}.tar.gz"'),
    ("build_despite_bundled", "true"),
])
def test_source_only_keys_are_refused_with_the_installers_plugin(
        tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(ManifestError) as refused:
        manifest(tmp_path, f"{BUNDLED}{key} = {value}\n")
    assert f"stages.aws-ofi-nccl.{key} applies only to provider = \"source\"" in str(
        refused.value)
    assert str(tmp_path / "bundled.toml") in str(refused.value)


def test_the_installers_plugin_is_found_not_built(tmp_path: Path) -> None:
    loaded = manifest(tmp_path, BUNDLED)
    stage = STAGES["aws-ofi-nccl"]
    ctx = context(loaded)
    assert stage.sources(ctx) == []
    recipe = stage.recipe(ctx)
    assert "configure" not in recipe
    assert "make" not in recipe
    assert "find /opt/amazon -name 'libnccl-net*.so'" in recipe
    assert "/usr/local/lib/libnccl-net.so" in recipe
    assert "ln -s" in recipe
    names = [check.name for check in stage.checks(ctx)]
    assert "the plugin NCCL loads is the EFA installer's" in names
    assert "plugin's own version string is the pin" in names


def test_a_source_build_keeps_its_key(tmp_path: Path) -> None:
    """provider joined the stage after plugins were stored: at its default it is not keyed."""
    default = manifest(tmp_path)
    explicit = manifest(tmp_path, f'provider = "source"\n{SAMPLE_PLUGIN}')
    stage = STAGES["aws-ofi-nccl"]
    assert "provider" not in keyed_inputs(stage, default.stages["aws-ofi-nccl"])
    assert keyed_inputs(stage, default.stages["aws-ofi-nccl"]) == keyed_inputs(
        stage, explicit.stages["aws-ofi-nccl"])
    assert aws_ofi_nccl_efa.from_efa(manifest(tmp_path, BUNDLED).stages["aws-ofi-nccl"])

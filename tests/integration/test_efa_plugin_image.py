"""`[stages.aws-ofi-nccl] provider = "efa"` end to end: the efa-nccl image on an EFA installer
that ships aws-ofi-nccl (1.38 and later), with no second plugin built.

The sample's two such installers (tests/unit/test_efa_bundled_plugin.py) put the plugin in two
of the real installer's directories; a real HTTP server on 127.0.0.1 serves them beside the
session's sample upstream (not in it: a `~=1.14` policy elsewhere would take them as
upgrades). Each image is built with its checks, and NCCL itself, in all_reduce_perf, says
which plugin it loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sample.generate import BUNDLING_EFA_RELEASES, EfaRelease
from tests.checksummary import checks_passed
from tests.integration.conftest import ROOT, docker_out, invoke, served, untagging

RUN = uuid.uuid4().hex[:8]
SAMPLE_PLUGIN = """version = "1.1.3-aws"
repo = "{upstream}/git/aws-ofi-nccl.git"
commit = "cbb9da23d7d9c5e1a452f9a6521c9ded7979323e"
"""

remove_tags = untagging(RUN)


@pytest.fixture(scope="module")
def installers(tmp_path_factory: pytest.TempPathFactory, docker_ready: None) -> Iterator[str]:
    """Base URL of a server of the bundling installers."""
    del docker_ready  # requested for its Docker check only
    root = tmp_path_factory.mktemp("installers")
    (root / "git").mkdir()
    for release in BUNDLING_EFA_RELEASES:
        subprocess.run([sys.executable, "-m", "sample", "efa-installer", "--version",
                        release.version, "--out", str(root / "files")], check=True, cwd=ROOT,
                       capture_output=True)
    with served(root) as url:
        yield url


def bundled_manifest(sample_manifest: Path, upstream: str, installers: str,
                     release: EfaRelease, folder: Path) -> Path:
    """The session's sample manifest on `release`, aws-ofi-nccl the installer's."""
    text = sample_manifest.read_text()
    plugin = SAMPLE_PLUGIN.format(upstream=upstream)
    assert plugin in text
    text = text.replace(plugin, f'provider = "efa"\nversion = "{release.plugin}"\n')
    efa = text[text.index("[stages.efa]"):text.index("[stages.nccl]")]
    # The flags AWS's own images pass these installers (shared/reference/pytorch-wheels.md).
    text = text.replace(efa, f'[stages.efa]\nversion = "{release.version}"\n'
                             f'url = "{installers}/files/aws-efa-installer-{{version}}.tar.gz"\n'
                             'flags = ["-y", "--skip-kmod", "--skip-limit-conf", "--no-verify"]'
                             '\n\n')
    path = folder / "bundled.toml"
    path.write_text(text)
    lock = sample_manifest.with_name("sample.lock.json")
    path.with_name("bundled.lock.json").write_text(lock.read_text())
    return path


@pytest.fixture(scope="module", params=BUNDLING_EFA_RELEASES, ids=lambda r: r.version)
def image(request: pytest.FixtureRequest, sample_manifest: Path, upstream: str,
          installers: str, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[EfaRelease, str, str]:
    """(release, tag, build output) of the efa-nccl image with its checks."""
    release: EfaRelease = request.param
    path = bundled_manifest(sample_manifest, upstream, installers, release,
                            tmp_path_factory.mktemp(f"bundled-{release.version}"))
    locked = invoke("lock", "--manifest", str(path), cache=cache_dir)
    assert locked.returncode == 0, locked.stdout + locked.stderr
    tag = f"imageforge-test/efa-bundled:{release.version}-{RUN}"
    built = invoke("build", "--target", "efa-nccl", "--manifest", str(path), "--tag", tag,
                   "--progress", "plain", cache=cache_dir)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    return release, tag, built.stdout + built.stderr


def run_in(tag: str, script: str) -> str:
    return docker_out("run", "--rm", "--entrypoint", "bash", tag, "-c", script)


def test_the_image_checks_pass_on_the_installers_plugin(
        image: tuple[EfaRelease, str, str], cache_dir: Path) -> None:
    release, tag, output = image
    assert checks_passed(output), output[-3000:]
    (record,) = [json.loads(path.read_text()) for path in (cache_dir / "tests").glob("*.json")
                 if json.loads(path.read_text())["image"] == tag]
    results = {r["name"]: r for r in record["results"] if r["stage"] == "aws-ofi-nccl"}
    shipped = f"/opt/amazon/ofi-nccl/{release.plugin_dir}/libnccl-net-ofi.so"
    found = results["the plugin NCCL loads is the EFA installer's"]
    assert found["result"] == "ok"
    assert found["output"].splitlines() == [f"libnccl-net.so is {shipped}",
                                            f"dlopen(libnccl-net.so) maps {shipped}"]
    version = results["plugin's own version string is the pin"]
    assert version["output"] == f"imageforge-version|aws-ofi-nccl|{release.plugin}|{release.plugin}"


def test_one_plugin_on_disk_and_nccl_loads_it(image: tuple[EfaRelease, str, str]) -> None:
    release, tag, _ = image
    shipped = f"/opt/amazon/ofi-nccl/{release.plugin_dir}/libnccl-net-ofi.so"
    files = run_in(tag, "find / -xdev -name 'libnccl-net*.so' -type f | sort").split()
    assert files == [shipped]
    assert run_in(tag, "readlink -f /usr/local/lib/libnccl-net.so") == shipped
    # NCCL's own log: the plugin it dlopened says which release it is, through the link the
    # stage exported.
    log = run_in(tag, "NCCL_DEBUG=INFO all_reduce_perf -b 8 -e 128 -f 2 -g 1 2>&1; "
                      "NCCL_DEBUG=INFO LD_DEBUG=files all_reduce_perf -b 8 -e 8 -g 1 2>&1 "
                      "| grep 'calling init:.*libnccl-net'")
    assert f"NET/OFI Using aws-ofi-nccl {release.plugin}" in log
    assert "NET/Plugin: Loaded net plugin AWS Libfabric" in log
    assert "calling init: /usr/local/lib/libnccl-net.so" in log

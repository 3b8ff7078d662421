"""`lock --upgrade`: version policies against real listings (sample upstream, local API servers)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.errors import CompatibilityError, ManifestError, SourceError
from imageforge.model.manifest import load
from imageforge.sources import upstream
from imageforge.sources.upstream import Endpoints, newest, parse_version
from sample.serve import ServerHandle
from stages import STAGES
from tests.servers import ScriptedServer
from tests.unit.conftest import sample_manifest

pytestmark = pytest.mark.usefixtures("isolated_git")

EFA_POLICY = {"[stages.efa]\n": '[stages.efa]\npolicy = "~=1.14"\n'}
# The move to 2.11.4 leaves the NCCL PyTorch 1.10.2 pins: a rule the manifest must waive.
NCCL_POLICY = ("stages.nccl.version=2.10.3", "stages.nccl.policy=>=2.10,<2.12",
               "waive.nccl-pytorch-pin=upgrade test moves NCCL past the PyTorch pin")
TOKEN = "ghp_secret_token_value_1234"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def api() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def settings(manifest: Path, *overrides: str) -> Workspace:
    return Workspace(registry=STAGES, manifest=manifest, overrides=overrides,
                            cache_dir=manifest.parent / "cache")


def lock_json(manifest: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(manifest.with_name("sample.lock.json").read_text())
    return data


def test_upgrade_moves_efa_and_nccl_within_their_policies(
        sample_server: ServerHandle, sample_pins: dict[str, Any], tmp_path: Path) -> None:
    manifest = sample_manifest(tmp_path / "m", sample_server.url, EFA_POLICY)
    s = settings(manifest, *NCCL_POLICY)
    project.write_lock(s, upgrade=False)
    text_before = manifest.read_text()

    _, changes = project.write_lock(s, upgrade=True)

    assert "efa: 1.14.1 -> 1.15.1 (policy ~=1.14)" in changes
    assert "nccl: 2.10.3 -> 2.11.4 (policy >=2.10,<2.12)" in changes
    assert manifest.read_text() == text_before
    locked = lock_json(manifest)
    assert locked["upgraded"] == {
        "efa": {"from": {"version": "1.14.1", "policy": "~=1.14"}, "to": "1.15.1",
                "source": f"{sample_server.url}/files/"},
        "nccl": {"from": {"version": "2.10.3", "policy": ">=2.10,<2.12"}, "to": "2.11.4",
                 "source": f"{sample_server.url}/git/nccl.git"},
    }
    # Plans build the upgraded versions, with the upgraded files' own pins.
    efa = project.plan(s, "efa").stage("efa")
    assert efa.inputs["version"] == "1.15.1"
    assert efa.inputs["url"].endswith("/files/aws-efa-installer-1.15.1.tar.gz")
    assert efa.inputs["sha256"] == sample_pins["files"]["aws-efa-installer-1.15.1.tar.gz"][
        "sha256"]
    nccl = project.plan(s, "nccl").stage("nccl")
    assert (nccl.inputs["version"], nccl.inputs["ref"]) == ("2.11.4", "v2.11.4-1")
    assert nccl.inputs["commit"] == sample_pins["repos"]["nccl"]["tags"]["v2.11.4-1"]
    # Stages without a policy keep their version although boost 1.74.0 is upstream.
    assert project.plan(s, "boost").stage("boost").inputs["version"] == "1.73.0"


def test_check_judges_the_upgraded_versions(sample_server: ServerHandle, tmp_path: Path) -> None:
    manifest = sample_manifest(tmp_path / "m", sample_server.url)
    unwaived = settings(manifest, *NCCL_POLICY[:2])
    project.write_lock(unwaived, upgrade=False)
    assert "lock: sample.lock.json current" in project.check(unwaived)
    before = manifest.with_name("sample.lock.json").read_bytes()

    # PyTorch 1.10.2 pins NCCL 2.10.3: the upgrade needs a stated reason to pass.
    with pytest.raises(CompatibilityError, match=r"nccl\.version 2\.11\.4 differs"):
        project.write_lock(unwaived, upgrade=True)
    assert manifest.with_name("sample.lock.json").read_bytes() == before

    waived = settings(manifest, *NCCL_POLICY)
    project.write_lock(waived, upgrade=True)
    assert any(line.startswith("waived [nccl-pytorch-pin] stages.nccl.version: "
                               "stages.nccl.version 2.11.4 differs")
               for line in project.check(waived))


def test_a_nightly_upgrade_is_a_no_op_until_upstream_moves(
        sample_server: ServerHandle, tmp_path: Path) -> None:
    manifest = sample_manifest(tmp_path / "m", sample_server.url, EFA_POLICY)
    lock_file, first = project.write_lock(settings(manifest), upgrade=True)
    after_upgrade = lock_file.read_bytes()
    assert "efa: 1.14.1 -> 1.15.1 (policy ~=1.14)" in first

    assert project.write_lock(settings(manifest), upgrade=True) == (lock_file, [])
    assert project.write_lock(settings(manifest), upgrade=False) == (lock_file, [])
    assert lock_file.read_bytes() == after_upgrade


def test_stage_limits_the_upgrade(sample_server: ServerHandle, tmp_path: Path) -> None:
    manifest = sample_manifest(tmp_path / "m", sample_server.url, EFA_POLICY)
    s = settings(manifest, *NCCL_POLICY)

    _, changes = project.write_lock(s, upgrade=True, stages=["nccl"])

    assert "nccl: 2.10.3 -> 2.11.4 (policy >=2.10,<2.12)" in changes
    assert set(lock_json(manifest)["upgraded"]) == {"nccl"}
    _, later = project.write_lock(s, upgrade=True, stages=["efa"])
    assert later == ["efa: src-efa 24220cb0add4527f3e3797d4cb19e85aadca13c5b549902a19028aa19afd0a54"
                     " -> 9f53438df5b4ceba5931f1f1d9ad15b63345accb869514b04e52e48f6b1a9d6c",
                     "efa: 1.14.1 -> 1.15.1 (policy ~=1.14)"]
    assert set(lock_json(manifest)["upgraded"]) == {"efa", "nccl"}
    with pytest.raises(ManifestError, match=r"--stage nope: .* defines no such stage"):
        project.write_lock(s, upgrade=True, stages=["nope"])


def test_a_policy_on_auto_nccl_is_refused(sample_server: ServerHandle, tmp_path: Path) -> None:
    manifest = sample_manifest(tmp_path / "m", sample_server.url)
    with pytest.raises(ManifestError, match=r"stages\.nccl\.version 'auto' .*policy"):
        project.write_lock(settings(manifest, "stages.nccl.policy=~=2.10"), upgrade=True)


def test_a_bad_policy_is_a_manifest_error(tmp_path: Path) -> None:
    manifest = sample_manifest(tmp_path / "m", "http://127.0.0.1:9")
    with pytest.raises(ManifestError, match=r"--set stages\.efa\.policy=1\.14\.\*\.\*"):
        project.load_manifest(settings(manifest, "stages.efa.policy=1.14.*.*"))


def test_versions_order_flavours_and_skip_pre_releases() -> None:
    assert parse_version("1.1.3-aws") == parse_version("1.1.3")
    assert parse_version("v1") is not None
    assert parse_version("main") is None
    releases = ["1.14.1", "1.15.1", "1.16.0rc1", "1.15.2.dev0", "2.0.0", "1.1.3-aws"]
    assert newest(releases, "~=1.14") == "1.15.1"
    assert newest(["1.2.0-aws", "1.1.3-aws", "1.3.0-rc1"], ">=1.1") == "1.2.0-aws"
    assert newest(releases, ">=3") is None


def test_index_pages_give_the_versions_the_template_names(api: ScriptedServer) -> None:
    page = """<html><body>
      <a href="../">../</a>
      <a href="aws-efa-installer-1.14.1.tar.gz">aws-efa-installer-1.14.1.tar.gz</a>
      <a href="/pub/efa/aws-efa-installer-1.15.1.tar.gz">absolute link</a>
      <a href="aws-efa-installer-1.16.0.tar.gz.sig">a signature</a>
      <a href="aws-efa-installer-latest.tar.gz">latest</a>
      <a href="https://elsewhere.example/pub/efa/aws-efa-installer-9.9.9.tar.gz">other host</a>
    </body></html>"""
    api.route("/pub/efa/", page.encode())
    listing = upstream.url_releases(
        api.url("/pub/efa/aws-efa-installer-{version}.tar.gz"), Endpoints())
    assert listing.versions == ("1.14.1", "1.15.1")
    assert listing.source == api.url("/pub/efa/")
    # A directory per version, files named with underscores (boost's layout).
    api.route("/boost/", b'<a href="1.73.0/">1.73.0/</a> <a href="1.74.0/">1.74.0/</a>')
    boost = upstream.url_releases(
        api.url("/boost/{version}/boost_{version_underscored}.tar.gz/download"), Endpoints())
    assert boost.versions == ("1.73.0", "1.74.0")


def test_github_tags_api_with_token(api: ScriptedServer,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    tags = [{"name": n} for n in ("v1.12.1-aws", "v1.13.0-aws", "v1.14.0-rc1", "nightly")]
    api.route("/repos/aws/aws-ofi-nccl/tags", json.dumps(tags).encode())
    endpoints = Endpoints(github_api=api.url(""), github_token=TOKEN)
    url = ("https://github.com/aws/aws-ofi-nccl/releases/download/v{version}/"
           "aws-ofi-nccl-{version}.tar.gz")

    listing = upstream.url_releases(url, endpoints)

    assert listing.versions == ("1.12.1-aws", "1.13.0-aws", "1.14.0-rc1")
    assert newest(listing.versions, "~=1.12") == "1.13.0-aws"
    assert listing.source == "https://api.github.com/repos/aws/aws-ofi-nccl/tags"
    seen = api.requests_for("/repos/aws/aws-ofi-nccl/tags")
    assert [s.headers.get("Authorization") for s in seen] == [f"Bearer {TOKEN}"]
    api.route("/repos/aws/aws-ofi-nccl/tags", status=403)
    with pytest.raises(SourceError) as refused:
        upstream.url_releases(url, endpoints)
    assert "403" in str(refused.value)
    assert TOKEN not in str(refused.value)
    assert TOKEN not in "".join(capsys.readouterr())


def test_github_token_comes_from_the_environment(api: ScriptedServer,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    api.route("/repos/o/r/tags", b'[{"name": "v2.0.0"}]')
    upstream.url_releases("https://github.com/o/r/archive/refs/tags/v{version}.tar.gz",
                          Endpoints(github_api=api.url("/")))
    assert api.requests_for("/repos/o/r/tags")[0].headers["Authorization"] == f"Bearer {TOKEN}"


def test_pypi_releases_need_the_templated_file(api: ScriptedServer) -> None:
    wheel = "smdistributed_dataparallel-{}-cp311-cp311-linux_x86_64.whl"
    answer = {"releases": {
        "1.4.0": [{"filename": wheel.format("1.4.0"), "yanked": False}],
        "1.4.1": [{"filename": wheel.format("1.4.1"), "yanked": True}],
        "1.5.0": [{"filename": wheel.format("1.5.0").replace("cp311", "cp310")}],
        "1.4.2": [{"filename": wheel.format("1.4.2")}],
    }}
    api.route("/pypi/smdistributed-dataparallel/json", json.dumps(answer).encode())
    url = ("https://files.pythonhosted.org/packages/cp311/s/smdistributed-dataparallel/"
           + wheel.format("{version}"))

    listing = upstream.url_releases(url, Endpoints(pypi=api.url("")))

    assert listing.versions == ("1.4.0", "1.4.2")
    assert listing.source == "https://pypi.org/pypi/smdistributed-dataparallel/json"


def test_an_empty_listing_names_the_listing(api: ScriptedServer) -> None:
    api.route("/files/", b"<html><body>nothing here</body></html>")
    with pytest.raises(SourceError, match=r"/files/ lists no release"):
        upstream.url_releases(api.url("/files/x-{version}.tgz"), Endpoints())


def test_a_pip_installed_stage_upgrades_from_its_pypi_releases(api: ScriptedServer) -> None:
    answer = {"releases": {
        "5.1.4": [{"filename": "sagemaker_training-5.1.4.tar.gz"}],
        "5.2.0": [{"filename": "sagemaker_training-5.2.0.tar.gz", "yanked": True}],
        "5.1.9": [{"filename": "sagemaker_training-5.1.9.tar.gz"}],
        "6.0.0": [{"filename": "sagemaker_training-6.0.0.tar.gz"}],
        "5.3.0": [],
    }}
    api.route("/pypi/sagemaker-training/json", json.dumps(answer).encode())
    manifest = load(ROOT / "manifests" / "smddp.toml",
                    ("stages.sagemaker-training.policy=~=5.1",), registry=STAGES)
    found = upstream.upgrades(manifest, STAGES, ["sagemaker-training"],
                              Endpoints(pypi=api.url("")))
    assert [(u.stage, u.old, u.new) for u in found] == [("sagemaker-training", "5.1.4", "5.1.9")]
    assert found[0].source == "https://pypi.org/pypi/sagemaker-training/json"


def test_a_plugin_built_from_release_tarballs_upgrades_from_their_listing(
        api: ScriptedServer) -> None:
    # aws-ofi-nccl has both source kinds: with `url` set, its releases are the tarballs the
    # listing names, not the tags of a git repository nobody fetches.
    api.route("/ofi/", b'<a href="aws-ofi-nccl-1.19.0.tar.gz">1.19.0</a> '
                       b'<a href="aws-ofi-nccl-1.21.1.tar.gz">1.21.1</a>')
    manifest = load(ROOT / "manifests" / "real-efa-nccl.toml", (
        "stages.aws-ofi-nccl.version=1.19.0", "stages.aws-ofi-nccl.policy=>=1.19",
        f"stages.aws-ofi-nccl.url={api.url('/ofi/aws-ofi-nccl-{version}.tar.gz')}",
        "stages.aws-ofi-nccl.repo=http://127.0.0.1:9/unreachable.git"), registry=STAGES)
    found = upstream.upgrades(manifest, STAGES, ["aws-ofi-nccl"], Endpoints())
    assert [(u.stage, u.old, u.new) for u in found] == [("aws-ofi-nccl", "1.19.0", "1.21.1")]
    assert found[0].source == api.url("/ofi/")

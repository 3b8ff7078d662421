"""EFA installer signatures: a real gpg key, real signatures, served on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.errors import ManifestError, SourceError
from imageforge.model.sourcetypes import Signature, UrlSource
from imageforge.sources.sources import SourceCache
from sample.serve import ServerHandle
from stages import STAGES
from tests.payloads import random_tarball
from tests.servers import ScriptedServer
from tests.unit.conftest import sample_manifest

INSTALLER = random_tarball(40_000)
OTHER_FINGERPRINT = "0123456789ABCDEF0123456789ABCDEF01234567"


@dataclass(frozen=True)
class Signer:
    fingerprint: str
    key: bytes  # armored public key
    home: Path

    def sign(self, data: bytes, work: Path) -> bytes:
        (work / "data").write_bytes(data)
        gpg(self.home, "--yes", "--detach-sign", "--output", str(work / "data.sig"),
            str(work / "data"))
        return (work / "data.sig").read_bytes()


def gpg(home: Path, *args: str) -> str:
    return subprocess.run(["gpg", "--batch", "--homedir", str(home), *args], check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Signer]:
    home = tmp_path_factory.mktemp("signer")
    home.chmod(0o700)
    gpg(home, "--passphrase", "", "--quick-gen-key", "EFA Test Signer <efa@example.com>",
        "ed25519", "sign", "never")
    fingerprint = next(line.split(":")[9] for line in
                       gpg(home, "--with-colons", "--fingerprint", "--list-keys").splitlines()
                       if line.startswith("fpr:"))
    try:
        yield Signer(fingerprint, gpg(home, "--armor", "--export").encode(), home)
    finally:
        # Key generation started an agent for this keyring; stop exactly that one.
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def installer(server: ScriptedServer, fingerprint: str, data: bytes = INSTALLER) -> UrlSource:
    return UrlSource(
        name="src-efa", url=server.url("/aws-efa-installer-1.14.1.tar.gz"),
        sha256=hashlib.sha256(data).hexdigest(), filename="aws-efa-installer-1.14.1.tar.gz",
        signature=Signature(url=server.url("/aws-efa-installer-1.14.1.tar.gz.sig"),
                            key_url=server.url("/aws-efa-installer.key"),
                            fingerprint=fingerprint))


def publish(server: ScriptedServer, signer: Signer, work: Path, *, served: bytes = INSTALLER,
            signed: bytes = INSTALLER, sig: bool = True) -> None:
    server.route("/aws-efa-installer-1.14.1.tar.gz", served)
    server.route("/aws-efa-installer.key", signer.key)
    if sig:
        server.route("/aws-efa-installer-1.14.1.tar.gz.sig", signer.sign(signed, work))


def assert_not_cached(cache: SourceCache, source: UrlSource) -> None:
    entry = cache.path_for(source)
    assert not entry.exists()
    assert not entry.with_name(entry.name + ".complete").exists()


def test_a_good_signature_lets_the_file_in(server: ScriptedServer, signer: Signer,
                                           tmp_path: Path) -> None:
    publish(server, signer, tmp_path)
    spaced = " ".join(signer.fingerprint[i:i + 4] for i in range(0, 40, 4)).lower()
    source = installer(server, spaced)
    cache = SourceCache(tmp_path / "sources")

    entry = cache.materialize(source)

    assert (entry / source.filename).read_bytes() == INSTALLER
    assert os.listdir(entry) == [source.filename]
    marker = json.loads(entry.with_name(entry.name + ".complete").read_text())
    assert marker["signed_by"] == signer.fingerprint
    assert cache.materialize(source) == entry
    assert server.count("/aws-efa-installer-1.14.1.tar.gz.sig") == 1


def test_a_key_with_another_fingerprint_is_refused(server: ScriptedServer, signer: Signer,
                                                   tmp_path: Path) -> None:
    publish(server, signer, tmp_path)
    source = installer(server, OTHER_FINGERPRINT)
    cache = SourceCache(tmp_path / "sources")
    with pytest.raises(SourceError) as refused:
        cache.materialize(source)
    message = str(refused.value)
    assert f"holds {signer.fingerprint}, not the pinned fingerprint {OTHER_FINGERPRINT}" in message
    assert server.url("/aws-efa-installer.key") in message
    assert_not_cached(cache, source)


def test_a_tampered_file_is_refused(server: ScriptedServer, signer: Signer,
                                    tmp_path: Path) -> None:
    tampered = INSTALLER[:-1] + b"!"
    # The sha256 matches what is served: only the signature can tell.
    publish(server, signer, tmp_path, served=tampered)
    source = installer(server, signer.fingerprint, data=tampered)
    cache = SourceCache(tmp_path / "sources")
    with pytest.raises(SourceError) as refused:
        cache.materialize(source)
    message = str(refused.value)
    assert message.startswith("bad signature:")
    assert server.url("/aws-efa-installer-1.14.1.tar.gz") in message
    assert signer.fingerprint in message
    assert_not_cached(cache, source)


def test_a_missing_signature_is_refused(server: ScriptedServer, signer: Signer,
                                        tmp_path: Path) -> None:
    publish(server, signer, tmp_path, sig=False)
    source = installer(server, signer.fingerprint)
    cache = SourceCache(tmp_path / "sources")
    with pytest.raises(SourceError) as refused:
        cache.materialize(source)
    message = str(refused.value)
    assert server.url("/aws-efa-installer-1.14.1.tar.gz.sig") in message
    assert "404" in message
    assert signer.fingerprint in message
    assert_not_cached(cache, source)


def test_an_unsigned_cache_entry_is_verified_once_a_fingerprint_is_pinned(
        server: ScriptedServer, signer: Signer, tmp_path: Path) -> None:
    publish(server, signer, tmp_path)
    cache = SourceCache(tmp_path / "sources")
    signed = installer(server, signer.fingerprint)
    cache.materialize(replace(signed, signature=None))
    assert server.count("/aws-efa-installer-1.14.1.tar.gz.sig") == 0

    cache.materialize(signed)

    assert server.count("/aws-efa-installer-1.14.1.tar.gz.sig") == 1


def test_the_efa_stage_asks_for_the_signature(tmp_path: Path) -> None:
    manifest = sample_manifest(tmp_path, "http://127.0.0.1:9")
    fingerprint = "9c82 e37b 904d d5dd 810b 1175 dfbf 0b57 c761 858a"
    s = Workspace(registry=STAGES, manifest=manifest,
                         overrides=(f"stages.efa.gpg_fingerprint={fingerprint}",))
    (source,) = project.plan(s, "efa").stage("efa").sources
    assert isinstance(source, UrlSource)
    assert source.signature is not None
    assert source.signature == Signature(
        url="http://127.0.0.1:9/files/aws-efa-installer-1.14.1.tar.gz.sig",
        key_url="https://efa-installer.amazonaws.com/aws-efa-installer.key",
        fingerprint="9C82E37B904DD5DD810B1175DFBF0B57C761858A")
    unsigned = project.plan(Workspace(registry=STAGES,
                                             manifest=manifest), "efa").stage("efa")
    assert unsigned.key == project.plan(s, "efa").stage("efa").key
    with pytest.raises(ManifestError, match=r"gpg_fingerprint.*40-hex-digit"):
        project.plan(Workspace(registry=STAGES, manifest=manifest,
                                      overrides=("stages.efa.gpg_fingerprint=abc",)), "efa")


@pytest.mark.usefixtures("isolated_git")
def test_signed_sources_are_mirrored_with_signature_and_key(
        server: ScriptedServer, signer: Signer, sample_server: ServerHandle,
        tmp_path: Path) -> None:
    publish(server, signer, tmp_path)
    manifest = sample_manifest(tmp_path / "m", sample_server.url)
    overrides = (f"stages.efa.url={server.url('/aws-efa-installer-{version}.tar.gz')}",
                 f"stages.efa.sha256={hashlib.sha256(INSTALLER).hexdigest()}",
                 f"stages.efa.gpg_fingerprint={signer.fingerprint}",
                 f"stages.efa.gpg_key_url={server.url('/aws-efa-installer.key')}")
    online = Workspace(registry=STAGES,
                              manifest=manifest, overrides=overrides, cache_dir=tmp_path / "c")
    project.write_lock(online, upgrade=False)
    project.mirror_sync(online, tmp_path / "mirror")
    sample_server.stop()
    server.routes.clear()  # upstream is gone: everything must come from the mirror
    requests_before = len(server.seen)

    offline = replace(online, cache_dir=tmp_path / "offline", mirror=str(tmp_path / "mirror"))
    entry = project.fetch(offline, "efa")["src-efa"]

    marker = json.loads(entry.with_name(entry.name + ".complete").read_text())
    assert marker["signed_by"] == signer.fingerprint
    assert len(server.seen) == requests_before

"""Whether the registry already holds a --push build's image (imageforge/app/pushed.py and
registryhttp.Client.image_config), against a real HTTP server on 127.0.0.1 serving the
distribution API's documents as BuildKit pushes them: an index whose entries are the image and
its attestations, the image's manifest, its config. The server is a stand-in for a registry's
document layout only (the real registry answers in tests/integration/test_push_noop.py); here
each document can be made hostile: too large, not JSON, not what its digest names."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from imageforge.app.pushed import registry_image
from imageforge.cache import registryhttp
from tests.servers import ScriptedServer

LABELS = {"dev.imageforge.key.efa": "sha256:" + "ab" * 32, "dev.imageforge.target": "efa"}


def digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def document(value: Any) -> bytes:
    return json.dumps(value).encode()


class Pushed:
    """An image pushed as BuildKit pushes one: index -> (image manifest, attestation)."""

    def __init__(self, server: ScriptedServer, labels: dict[str, str],
                 platform: dict[str, str] | None = None) -> None:
        self.server = server
        self.config = document({"architecture": "amd64", "os": "linux",
                                "config": {"Labels": labels}})
        self.manifest = document({"schemaVersion": 2, "config": {"digest": digest(self.config)},
                                  "layers": []})
        attestation = document({"schemaVersion": 2, "config": {"digest": "sha256:" + "0" * 64}})
        self.index = document({"schemaVersion": 2, "manifests": [
            {"digest": digest(self.manifest),
             "platform": platform or {"os": "linux", "architecture": "amd64"}},
            {"digest": digest(attestation), "platform": {"os": "unknown",
                                                         "architecture": "unknown"}}]})
        server.route("/v2/team/app/manifests/v1", self.index)
        server.route(f"/v2/team/app/manifests/{digest(self.manifest)}", self.manifest)
        server.route(f"/v2/team/app/blobs/{digest(self.config)}", self.config)

    @property
    def tag(self) -> str:
        return f"127.0.0.1:{self.server.port}/team/app:v1"


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def test_the_image_whose_labels_all_match_is_found_by_its_index_digest(
        server: ScriptedServer) -> None:
    pushed = Pushed(server, {**LABELS, "org.opencontainers.image.vendor": "someone"})
    assert registry_image(pushed.tag, "linux/amd64", LABELS, {}) == digest(pushed.index)
    # The attestation's manifest is never read: only the image for the platform is.
    assert server.count(f"/v2/team/app/blobs/{'sha256:' + '0' * 64}") == 0


def test_any_label_that_differs_or_is_missing_means_another_image(
        server: ScriptedServer) -> None:
    pushed = Pushed(server, LABELS)
    other = {**LABELS, "dev.imageforge.key.efa": "sha256:" + "cd" * 32}
    assert registry_image(pushed.tag, "linux/amd64", other, {}) is None
    more = {**LABELS, "dev.imageforge.lock-digest": "sha256:" + "ef" * 32}
    assert registry_image(pushed.tag, "linux/amd64", more, {}) is None


def test_no_tag_and_no_image_for_the_platform_mean_the_build_runs(
        server: ScriptedServer) -> None:
    pushed = Pushed(server, LABELS, platform={"os": "linux", "architecture": "arm64"})
    assert registry_image(pushed.tag, "linux/amd64", LABELS, {}) is None
    assert registry_image(pushed.tag, "linux/arm64", LABELS, {}) == digest(pushed.index)
    server.route("/v2/team/app/manifests/v2", status=404)
    assert registry_image(pushed.tag.replace(":v1", ":v2"), "linux/arm64", LABELS, {}) is None
    # A tag by digest, or one naming no registry, is not asked about at all.
    assert registry_image(f"{pushed.tag}@{digest(pushed.index)}", "linux/arm64", LABELS,
                          {}) is None
    assert registry_image("team/app:v1", "linux/arm64", LABELS, {}) is None


def test_a_manifest_that_is_not_what_its_digest_names_proves_nothing(
        server: ScriptedServer) -> None:
    pushed = Pushed(server, LABELS)
    # The index names the manifest by digest; the registry serves another body under it.
    forged = pushed.manifest.replace(b'"layers": []', b'"layers": [] ')
    server.route(f"/v2/team/app/manifests/{digest(pushed.manifest)}", forged)
    client = registryhttp.Client(pushed.tag.split("/")[0], {})
    with pytest.raises(registryhttp.Unsupported, match="a document that is not sha256:"):
        client.image_config("team/app", "v1", platform="linux/amd64", timeout=10)
    assert registry_image(pushed.tag, "linux/amd64", LABELS, {}) is None


@pytest.mark.parametrize(("body", "why"), [
    (b"{" + b" " * registryhttp.MAX_DOCUMENT + b"}", "a document over"),
    (b"<html>not a registry</html>", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"schemaVersion": 2}', "is not an image manifest"),
    (b'{"manifests": "none"}', "0 linux/amd64 images"),
])
def test_hostile_documents_are_refused_and_the_build_runs(
        server: ScriptedServer, body: bytes, why: str) -> None:
    pushed = Pushed(server, LABELS)
    server.route("/v2/team/app/manifests/v1", body)
    client = registryhttp.Client(pushed.tag.split("/")[0], {})
    with pytest.raises(registryhttp.Unsupported, match=why):
        client.image_config("team/app", "v1", platform="linux/amd64", timeout=10)
    assert registry_image(pushed.tag, "linux/amd64", LABELS, {}) is None


def test_a_registry_that_fails_means_the_build_runs(server: ScriptedServer) -> None:
    pushed = Pushed(server, LABELS)
    server.route("/v2/team/app/manifests/v1", status=500)
    client = registryhttp.Client(pushed.tag.split("/")[0], {})
    with pytest.raises(registryhttp.Unavailable):
        client.image_config("team/app", "v1", platform="linux/amd64", timeout=10)
    assert registry_image(pushed.tag, "linux/amd64", LABELS, {}) is None

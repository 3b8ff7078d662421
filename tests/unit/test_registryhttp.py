"""The registry's HTTP API asked directly (imageforge/cache/registryhttp.py), against a real HTTP
server on 127.0.0.1 that speaks the distribution API's auth the way registries do: a bearer
challenge answered by a token service (Docker Hub, GHCR, Harbor), or a basic one (distribution
with htpasswd, ECR). The server is a stand-in for those registries' auth only, since none can
be reached from here; the real registry's answers are checked in
tests/integration/test_registry_http.py. Where the client cannot ask as docker would, the
Remote asks a `docker` on PATH instead (a stand-in executable that records it was run)."""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from imageforge.cache import registryhttp, remote
from imageforge.errors import CacheError

KEY = "sha256:" + "ab" * 32
DIGEST = "sha256:" + "cd" * 32
USER, SECRET = "robot", "s3cret"


class Registry(ThreadingHTTPServer):
    """`auth` "bearer" or "basic"; `tags` repository -> tag -> digest; `status` forces an
    answer to every manifest question; counts what clients asked."""

    def __init__(self, auth: str) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.auth = auth
        self.tags: dict[str, dict[str, str]] = {"cache/efa": {"ab" * 32: DIGEST}}
        self.status: int | None = None
        self.token_requests: list[str] = []
        self.manifest_requests: list[str | None] = []

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Registry

    def log_message(self, *args: object) -> None:
        pass

    def _basic_ok(self) -> bool:
        expected = "Basic " + base64.b64encode(f"{USER}:{SECRET}".encode()).decode()
        return self.headers.get("Authorization") == expected

    def do_GET(self) -> None:       # the token service
        self.server.token_requests.append(self.path)
        if not self._basic_ok():
            self.send_response(401)
            self.end_headers()
            return
        scope = parse_qs(urlsplit(self.path).query)["scope"][0]
        body = json.dumps({"token": f"tok-{scope}"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:      # /v2/<name>/manifests/<tag>
        auth = self.headers.get("Authorization")
        self.server.manifest_requests.append(auth)
        name, _, tag = self.path.removeprefix("/v2/").partition("/manifests/")
        allowed = self._basic_ok() if self.server.auth == "basic" else \
            auth == f"Bearer tok-repository:{name}:pull"
        if not allowed:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="registry"'
                             if self.server.auth == "basic" else
                             f'Bearer realm="http://{self.server.host}/token",'
                             'service="registry.test"')
            self.end_headers()
            return
        if self.server.status is not None:
            self.send_response(self.server.status)
            self.end_headers()
            return
        digest = self.server.tags.get(name, {}).get(tag)
        self.send_response(200 if digest else 404)
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()


@pytest.fixture(params=["bearer", "basic"])
def registry(request: pytest.FixtureRequest) -> Iterator[Registry]:
    server = Registry(request.param)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A docker config directory, empty until a test writes its config.json."""
    directory = tmp_path / "docker-config"
    directory.mkdir()
    return directory


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `docker` on PATH that answers every inspect with a digest and records each run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text(f"#!/bin/sh\necho run >> {tmp_path}/docker-runs\n"
                      f"echo '\"sha256:{'ee' * 32}\"'\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "docker-runs"


def _auths(config: Path, host: str, entry: dict[str, str]) -> None:
    (config / "config.json").write_text(json.dumps({"auths": {host: entry}}))


def _basic_entry() -> dict[str, str]:
    return {"auth": base64.b64encode(f"{USER}:{SECRET}".encode()).decode()}


def test_the_digest_comes_from_the_registry_with_dockers_credentials_and_no_docker_run(
        registry: Registry, config: Path, docker: Path) -> None:
    _auths(config, registry.host, _basic_entry())
    r = remote.Remote(repository=f"{registry.host}/cache", env={"DOCKER_CONFIG": str(config)})
    assert r.digest("efa", KEY) == DIGEST
    assert r.digest("nccl", KEY) is None
    assert r.holds([("efa", KEY), ("nccl", KEY)]) == [True, False]
    assert not docker.exists()
    # One challenge per host (basic) or per repository (bearer); every later question carries
    # what answered it.
    if registry.auth == "bearer":
        assert registry.token_requests == [
            "/token?scope=repository%3Acache%2Fefa%3Apull&service=registry.test",
            "/token?scope=repository%3Acache%2Fnccl%3Apull&service=registry.test"]
    else:
        assert registry.token_requests == []
    assert registry.manifest_requests.count(None) == (2 if registry.auth == "bearer" else 1)


def test_a_credential_helper_gives_the_credentials(
        registry: Registry, config: Path, docker: Path, tmp_path: Path) -> None:
    helper = docker.parent / "bin" / "docker-credential-test"
    helper.write_text(f"#!/bin/sh\nread host\necho \"$host\" > {tmp_path}/asked\n"
                      f"echo '{{\"Username\": \"{USER}\", \"Secret\": \"{SECRET}\"}}'\n")
    helper.chmod(0o755)
    (config / "config.json").write_text(json.dumps({"credHelpers": {registry.host: "test"}}))
    r = remote.Remote(repository=f"{registry.host}/cache", env={"DOCKER_CONFIG": str(config)})
    assert r.digest("efa", KEY) == DIGEST
    assert (tmp_path / "asked").read_text().strip() == registry.host
    assert not docker.exists()


def test_credentials_the_registry_refuses_are_a_cache_error(
        registry: Registry, config: Path, docker: Path) -> None:
    _auths(config, registry.host,
           {"auth": base64.b64encode(f"{USER}:wrong".encode()).decode()})
    r = remote.Remote(repository=f"{registry.host}/cache", env={"DOCKER_CONFIG": str(config)})
    with pytest.raises(CacheError) as info:
        r.digest("efa", KEY)
    assert str(info.value) == (
        f"registry {registry.host} refused our credentials; check IMAGEFORGE_REGISTRY_USER/"
        "IMAGEFORGE_REGISTRY_PASSWORD or `docker login`.")
    assert not docker.exists()


def test_no_credentials_for_a_registry_that_wants_them_is_refused(
        registry: Registry, config: Path, docker: Path) -> None:
    r = remote.Remote(repository=f"{registry.host}/cache", env={"DOCKER_CONFIG": str(config)})
    with pytest.raises(CacheError, match="refused our credentials"):
        r.digest("efa", KEY)
    assert not docker.exists()


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_a_registry_that_fails_is_unavailable(registry: Registry, config: Path,
                                              docker: Path, status: int) -> None:
    _auths(config, registry.host, _basic_entry())
    registry.status = status
    r = remote.Remote(repository=f"{registry.host}/cache", env={"DOCKER_CONFIG": str(config)})
    with pytest.raises(remote.RemoteUnavailable) as info:
        r.digest("efa", KEY)
    assert str(info.value).startswith(str(status))
    assert not docker.exists()


@pytest.mark.parametrize("entry", [{"identitytoken": "refresh-me"}, {"auth": "bm90LXVzZXI="},
                                   {"auth": "%%%"}])
def test_what_only_docker_knows_how_to_use_is_asked_of_docker(
        registry: Registry, config: Path, docker: Path, entry: dict[str, str]) -> None:
    _auths(config, registry.host, entry)
    r = remote.Remote(repository=f"{registry.host}/cache", env={"DOCKER_CONFIG": str(config)})
    assert r.digest("efa", KEY) == "sha256:" + "ee" * 32
    assert docker.read_text() == "run\n"


def test_a_missing_or_failing_credential_helper_is_left_to_docker(
        registry: Registry, config: Path, docker: Path) -> None:
    (config / "config.json").write_text(json.dumps({"credsStore": "absent"}))
    r = remote.Remote(repository=f"{registry.host}/cache", env={"DOCKER_CONFIG": str(config)})
    assert r.digest("efa", KEY) == "sha256:" + "ee" * 32
    assert docker.read_text() == "run\n"


def test_a_registry_with_no_connection_is_left_to_docker(config: Path, docker: Path) -> None:
    # Nothing listens there: docker decides (its answer and its errors are the reference).
    r = remote.Remote(repository="127.0.0.1:9/cache", env={"DOCKER_CONFIG": str(config)})
    assert r.digest("efa", KEY) == "sha256:" + "ee" * 32
    r = remote.Remote(repository="reg.invalid/cache", env={"DOCKER_CONFIG": str(config)})
    assert r.digest("efa", KEY) == "sha256:" + "ee" * 32
    assert docker.read_text() == "run\nrun\n"


def test_only_a_loopback_registry_may_answer_over_plain_http() -> None:
    assert registryhttp.Client("127.0.0.1:5000", {})._schemes() == ["https", "http"]
    assert registryhttp.Client("localhost:5000", {})._schemes() == ["https", "http"]
    assert registryhttp.Client("[::1]:5000", {})._schemes() == ["https", "http"]
    assert registryhttp.Client("reg.io:5000", {})._schemes() == ["https"]
    assert registryhttp.Client("127.0.0.1.evil.io", {})._schemes() == ["https"]

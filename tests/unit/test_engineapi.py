"""imageforge/engineapi.py and its callers: the local engine asked through its API socket,
the docker CLI only where the socket is not the engine the CLI would use.

A stand-in engine API on a real unix socket (tests/engine_socket.py); PATH holds no docker,
so any question that reached the CLI fails the test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from imageforge import docker, engineapi
from imageforge.cache.imagestore import ImageStore
from imageforge.errors import DockerError
from tests.engine_socket import ID, TAG, serve_engine

OTHER = "sha256:" + "2" * 64


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    monkeypatch.setenv("PATH", str(tmp_path / "no-docker-here"))
    labels = {TAG: {"io.imageforge.target": "smddp"}}
    with serve_engine(tmp_path, monkeypatch, labels) as images:
        images[TAG] = ID
        yield images


@pytest.mark.usefixtures("engine")
def test_images_and_their_labels_come_from_the_socket() -> None:
    assert docker.local_image(TAG) == (ID, {"io.imageforge.target": "smddp"})
    assert docker.local_image("imageforge/gone:1") == (None, None)
    assert engineapi.image_ids([TAG, "imageforge/gone:1"]) == {TAG: ID,
                                                               "imageforge/gone:1": None}


def test_artifact_images_are_listed_in_one_question(engine: dict[str, str]) -> None:
    engine["imageforge-artifact/n1/efa:1"] = OTHER
    engine["imageforge-artifact/n1/python:2"] = ID
    engine["imageforge-artifact/n2/efa:1"] = ID
    assert ImageStore().ids("n1") == {"imageforge-artifact/n1/efa:1": OTHER,
                                      "imageforge-artifact/n1/python:2": ID}


@pytest.mark.usefixtures("engine")
def test_a_daemon_that_answers_its_socket_is_ready_without_the_cli() -> None:
    docker.ensure_daemon()


def test_no_daemon_on_the_socket_falls_back_to_the_cli_and_its_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'nobody.sock'}")
    monkeypatch.setenv("PATH", str(tmp_path / "no-docker-here"))
    with pytest.raises(engineapi.Unreachable):
        engineapi.image_ids([TAG])
    with pytest.raises(DockerError, match="docker is not installed"):
        docker.ensure_daemon()


@pytest.mark.parametrize(("variable", "value"), [("DOCKER_CONTEXT", "second"),
                                                 ("DOCKER_HOST", "tcp://10.0.0.1:2375"),
                                                 ("DOCKER_HOST", "ssh://builder")])
@pytest.mark.usefixtures("engine")
def test_only_the_engine_the_cli_would_use_is_asked(monkeypatch: pytest.MonkeyPatch,
                                                    variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    assert engineapi.socket_path() is None
    with pytest.raises(engineapi.Unreachable, match="not the local engine"):
        engineapi.Engine()


@pytest.mark.usefixtures("engine")
def test_the_cli_config_names_the_context_in_use(tmp_path: Path) -> None:
    config = tmp_path / "docker-config"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"currentContext": "remote"}))
    assert engineapi.socket_path() is None
    (config / "config.json").write_text(json.dumps({"currentContext": "default"}))
    assert engineapi.socket_path() == str(tmp_path / "docker.sock")
    (config / "config.json").write_text("{not json")
    assert engineapi.socket_path() == str(tmp_path / "docker.sock")


def test_the_default_socket_is_the_engine_s_own(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert engineapi.socket_path() == "/var/run/docker.sock"

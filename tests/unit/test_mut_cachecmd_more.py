"""cache.push / cache.pull / explain with a remote cache (imageforge/app/cachecmd.py), in process,
against a stand-in `docker` on PATH that is a registry kept in a directory: `buildx imagetools
inspect` answers from it as a real one does (found, "not found", or "connection refused" while
the registry is down), `buildx bake` copies the OCI layouts an artifact bake pushes into it and
exports the ones a pull bake asks for out of it, or fails a push with BuildKit's wording.
Every question and transfer it saw is logged, so the tests check what the registry saw."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from imageforge.app import cachecmd, project
from imageforge.app.workspace import Workspace
from imageforge.cache import remote as remote_mod
from imageforge.errors import CacheError
from stages import STAGES as STAGE_REGISTRY
from tests.oci_layout import oci_layout

EFA_NCCL = Path(__file__).resolve().parents[2] / "manifests/efa-nccl.toml"
REPO = "127.0.0.1:5000/cache"
STAGES = ["base", "efa", "nccl", "aws-ofi-nccl", "nccl-tests", "efa-nccl"]

FAKE_DOCKER = '''#!{python} -IS
import json, os, shutil, sys, time, uuid
from pathlib import Path

REG = Path({registry!r})
args = sys.argv[1:]


def log(line):
    with open(REG / "log", "a") as handle:
        handle.write(line + "\\n")


def where(ref):
    return REG / "store" / ref.replace("/", "_").replace(":", "@")


if args[:1] == ["info"]:
    print("27.0.0")
    sys.exit(0)
if args[:3] == ["buildx", "imagetools", "inspect"]:
    ref = args[3]
    if (REG / "hold").exists():
        marker = REG / "inflight" / uuid.uuid4().hex
        marker.touch()
        while (REG / "hold").exists():
            time.sleep(0.002)
        marker.unlink()
    log("inspect " + ref)
    if (REG / "down").exists():
        sys.stderr.write('ERROR: failed to do request: Head "https://127.0.0.1:5000/v2/x": '
                         "dial tcp 127.0.0.1:5000: connect: connection refused\\n")
        sys.exit(1)
    if where(ref).exists():
        index = json.loads((where(ref) / "index.json").read_text())
        print(json.dumps(index["manifests"][0]["digest"]))
        sys.exit(0)
    sys.stderr.write("ERROR: " + ref + ": not found\\n")
    sys.exit(1)
if args[:3] == ["buildx", "bake", "-f"]:
    bake = json.loads(Path(args[3]).read_text())
    for target in bake["target"].values():
        output = target["output"][0]
        context = target["contexts"]["artifact"]
        if output.startswith("type=registry,name="):
            ref = output.removeprefix("type=registry,name=")
            if (REG / "refuse-push").exists():
                sys.stderr.write("ERROR: failed to solve: failed to push " + ref + ": "
                                 "unexpected status from PUT request to "
                                 "https://127.0.0.1:5000/v2/x: 500 Internal Server Error\\n")
                sys.exit(1)
            layout = context.removeprefix("oci-layout://").split("@")[0]
            shutil.copytree(layout, where(ref), ignore=shutil.ignore_patterns("meta.json"))
            log("push " + ref)
        else:
            dest = output.split(",")[1].removeprefix("dest=")
            ref = context.removeprefix("docker-image://")
            if not where(ref).exists():
                sys.stderr.write("ERROR: failed to solve: " + ref + ": not found\\n")
                sys.exit(1)
            shutil.copytree(where(ref), dest)
            log("pull " + ref)
    sys.exit(0)
sys.stderr.write("stand-in docker: unexpected " + " ".join(args) + "\\n")
sys.exit(2)
'''


@dataclass
class Registry:
    """The stand-in registry's directory and what it saw."""

    root: Path

    def ref(self, stage: str, key: str) -> str:
        return remote_mod.Remote(repository=REPO).ref(stage, key)

    def path(self, stage: str, key: str) -> Path:
        return self.root / "store" / self.ref(stage, key).replace("/", "_").replace(":", "@")

    def publish(self, stage: str, key: str) -> Path:
        """Put an artifact of `stage` under `key` in the registry, as a push would."""
        return oci_layout(self.path(stage, key), [os.urandom(256)])

    def holds(self, stage: str, key: str) -> bool:
        return self.path(stage, key).exists()

    def seen(self, what: str) -> list[str]:
        """The references of every `what` (inspect, push, pull) in the order they came."""
        log = self.root / "log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [line.split(" ", 1)[1] for line in lines if line.split(" ", 1)[0] == what]

    def in_flight(self) -> int:
        return len(list((self.root / "inflight").iterdir()))


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    root = tmp_path / "registry"
    (root / "store").mkdir(parents=True)
    (root / "inflight").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text(FAKE_DOCKER.format(python=sys.executable, registry=str(root)))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # No engine API either: only this docker answers.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/imageforge.sock")
    monkeypatch.delenv("IMAGEFORGE_REGISTRY_USER", raising=False)
    monkeypatch.delenv("IMAGEFORGE_REGISTRY_PASSWORD", raising=False)
    return Registry(root)


@pytest.fixture
def settings(tmp_path: Path) -> Workspace:
    return Workspace(registry=STAGE_REGISTRY,
                            manifest=EFA_NCCL, cache_dir=tmp_path / "cache", remote=REPO)


@pytest.fixture
def keys(settings: Workspace) -> dict[str, str]:
    return {s.name: s.key for s in project.plan(settings, "efa-nccl").stages}


def _store_locally(settings: Workspace, stage: str, key: str) -> str:
    """Add an artifact of `stage` to the local store; its top digest."""
    layout = oci_layout(settings.cache_dir.parent / "layouts" / stage, [os.urandom(256)])
    entry = settings.store.add(key=key, stage=stage, inputs={},
                                                 layout=layout, build_seconds=1.0)
    return entry.digest


def _index(layout: Path) -> object:
    return json.loads((layout / "index.json").read_text())


def test_pull_fetches_the_stages_to_build_that_the_registry_holds(
        settings: Workspace, registry: Registry, keys: dict[str, str]) -> None:
    for name in ("base", "efa"):
        _store_locally(settings, name, keys[name])
    for name in ("efa", "nccl", "nccl-tests"):
        registry.publish(name, keys[name])
    assert cachecmd.pull(settings, "efa-nccl") == f"pulled 2 artifacts from {REPO}"
    # Only the stages that would be built were asked about; the two it has were pulled.
    to_build = ["nccl", "aws-ofi-nccl", "nccl-tests", "efa-nccl"]
    assert sorted(registry.seen("inspect")) == sorted(registry.ref(n, keys[n]) for n in to_build)
    assert sorted(registry.seen("pull")) == sorted(
        registry.ref(n, keys[n]) for n in ("nccl", "nccl-tests"))
    store = settings.store
    for name in ("nccl", "nccl-tests"):
        entry = store.get(keys[name])
        assert entry is not None
        assert entry.stage == name
        assert _index(entry.path) == _index(registry.path(name, keys[name]))
    assert {e.stage for e in store.all_entries()} == {"base", "efa", "nccl", "nccl-tests"}


def test_pull_with_nothing_in_the_registry_pulls_nothing(
        settings: Workspace, registry: Registry, keys: dict[str, str]) -> None:
    assert cachecmd.pull(settings, "nccl") == f"pulled 0 artifacts from {REPO}"
    assert sorted(registry.seen("inspect")) == sorted(
        registry.ref(n, keys[n]) for n in ("base", "nccl"))
    assert registry.seen("pull") == []
    assert settings.store.all_entries() == []


def test_pull_from_an_unreachable_registry_pulls_nothing_and_says_to_retry(
        settings: Workspace, registry: Registry, keys: dict[str, str]) -> None:
    registry.publish("nccl", keys["nccl"])
    (registry.root / "down").touch()
    with pytest.raises(CacheError) as info:
        cachecmd.pull(settings, "nccl")
    assert str(info.value) == (
        f"remote cache {REPO} is unreachable (error: failed to do request: head "
        '"https://127.0.0.1:5000/v2/x": dial tcp 127.0.0.1:5000: connect: connection refused); '
        "nothing was pulled: run cache.pull again once it answers.")
    assert registry.seen("pull") == []
    assert settings.store.all_entries() == []


def _wait(check: Callable[[], bool], worker: threading.Thread, what: str) -> None:
    """Wait until `check` holds (the stand-in docker's files change), failing at once if the
    command under test has ended instead."""
    deadline = time.monotonic() + 20
    while not check():
        assert worker.is_alive(), f"the command ended before {what}"
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.002)


@pytest.fixture
def holding(registry: Registry) -> Iterator[Path]:
    """While the yielded file exists, every registry question waits."""
    hold = registry.root / "hold"
    hold.touch()
    try:
        yield hold
    finally:
        hold.unlink(missing_ok=True)


def test_pull_asks_the_registry_at_most_four_questions_at_once(
        settings: Workspace, registry: Registry, keys: dict[str, str],
        holding: Path) -> None:
    registry.publish("efa-nccl", keys["efa-nccl"])
    before = set(threading.enumerate())
    result: dict[str, str] = {}
    worker = threading.Thread(target=lambda: result.update(out=cachecmd.pull(settings,
                                                                             "efa-nccl")))
    worker.start()
    try:
        _wait(lambda: registry.in_flight() >= 4, worker, "four questions")
        # Every thread asking is now stuck in its question: their number is the limit.
        askers = [t for t in set(threading.enumerate()) - before if t is not worker]
        _wait(lambda: registry.in_flight() >= len(askers), worker, "every asker to ask")
        assert (len(askers), registry.in_flight()) == (4, 4)
    finally:
        holding.unlink()
        worker.join()
    assert result == {"out": f"pulled 1 artifacts from {REPO}"}
    assert len(registry.seen("inspect")) == 6
    assert registry.seen("pull") == [registry.ref("efa-nccl", keys["efa-nccl"])]


def test_push_without_a_target_sends_every_local_artifact(
        settings: Workspace, registry: Registry, keys: dict[str, str]) -> None:
    for name in ("efa", "nccl"):
        _store_locally(settings, name, keys[name])
    assert cachecmd.push(settings, None) == f"pushed 2 of 2 artifacts to {REPO}"
    assert sorted(registry.seen("push")) == sorted(
        registry.ref(n, keys[n]) for n in ("efa", "nccl"))
    store = settings.store
    for name in ("efa", "nccl"):
        entry = store.get(keys[name])
        assert entry is not None
        assert _index(registry.path(name, keys[name])) == _index(entry.path)


def test_push_for_a_target_sends_only_its_stages_that_are_cached(
        settings: Workspace, registry: Registry, keys: dict[str, str]) -> None:
    for name in ("base", "efa"):
        _store_locally(settings, name, keys[name])
    other = "sha256:" + "0f" * 32  # an artifact of no stage efa-nccl needs
    _store_locally(settings, "other", other)
    assert cachecmd.push(settings, "efa-nccl") == f"pushed 2 of 2 artifacts to {REPO}"
    assert sorted(registry.seen("push")) == sorted(
        registry.ref(n, keys[n]) for n in ("base", "efa"))
    assert not registry.holds("other", other)
    assert not registry.holds("nccl", keys["nccl"])


@pytest.mark.usefixtures("keys")
def test_push_with_nothing_cached_for_the_target_pushes_nothing(
        settings: Workspace, registry: Registry) -> None:
    _store_locally(settings, "other", "sha256:" + "0f" * 32)
    assert cachecmd.push(settings, "nccl") == f"pushed 0 of 0 artifacts to {REPO}"
    assert registry.seen("push") == []


def test_push_refused_by_the_registry_is_an_error_naming_its_cause(
        settings: Workspace, registry: Registry, keys: dict[str, str]) -> None:
    for name in ("efa", "nccl"):
        _store_locally(settings, name, keys[name])
    (registry.root / "refuse-push").touch()
    with pytest.raises(CacheError) as info:
        cachecmd.push(settings, "efa-nccl")
    assert str(info.value) == (
        f"could not push 2 artifact(s) to {REPO} (500 Internal Server Error); the local cache "
        "is unchanged: run cache.push again once the registry answers.")
    assert registry.seen("push") == []
    assert {e.stage for e in settings.store.all_entries()} == {"efa", "nccl"}


def test_explain_counts_what_the_registry_holds_as_cached(
        settings: Workspace, registry: Registry, keys: dict[str, str]) -> None:
    for name in STAGES:
        registry.publish(name, keys[name])
    assert cachecmd.explain(settings, "efa-nccl") == \
        "efa-nccl: nothing to build; every stage needed is cached"
    assert sorted(registry.seen("inspect")) == sorted(registry.ref(n, keys[n]) for n in STAGES)


def test_explain_names_only_the_stages_the_registry_lacks(
        settings: Workspace, registry: Registry, keys: dict[str, str]) -> None:
    for name in STAGES[:-1]:
        registry.publish(name, keys[name])
    assert cachecmd.explain(settings, "efa-nccl") == "efa-nccl: never built with this cache"


# ---- cache_trust = "verified": only artifacts a rebuild verified count ----------------------


@pytest.fixture
def trusting(settings: Workspace) -> Workspace:
    """The same workspace under cache_trust = "verified"; no rebuild has verified anything."""
    return dataclasses.replace(settings, trust_verified=True)


def test_pull_under_verified_trust_leaves_unverified_artifacts_in_the_registry(
        trusting: Workspace, registry: Registry, keys: dict[str, str]) -> None:
    for name in ("nccl", "nccl-tests"):
        registry.publish(name, keys[name])
    assert cachecmd.pull(trusting, "efa-nccl") == f"pulled 0 artifacts from {REPO}"
    assert sorted(registry.seen("inspect")) == sorted(registry.ref(n, keys[n]) for n in STAGES)
    assert registry.seen("pull") == []
    assert trusting.store.all_entries() == []


def test_explain_under_verified_trust_counts_unverified_artifacts_as_not_cached(
        trusting: Workspace, registry: Registry, keys: dict[str, str]) -> None:
    for name in STAGES:
        registry.publish(name, keys[name])
    assert cachecmd.explain(trusting, "efa-nccl").splitlines() == [
        f"{name}: never built with this cache" for name in STAGES]
    assert sorted(registry.seen("inspect")) == sorted(registry.ref(n, keys[n]) for n in STAGES)

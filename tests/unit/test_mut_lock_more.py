"""More of the lock modules (imageforge/sources/lock*.py), in process: `lockresolve.resolve`
against real upstreams on this host (a PEP 503 index on 127.0.0.1, git repositories on disk,
a scripted `docker` on PATH), what `settle` does with stages that read the image's settings or
have no table, how `--upgrade` forgets entries, and what a registry too slow to answer leaves
pinned."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from imageforge.errors import CompatibilityError, LockError
from imageforge.model.manifest import Manifest, load
from imageforge.model.sourcetypes import Source, UrlSource
from imageforge.model.stage import Context, Stage, git_source
from imageforge.sources import lockfile, lockresolve, locksettle, piplock
from imageforge.sources.sources import SourceCache
from imageforge.sources.upstream import Endpoints
from stages import STAGES, nccl_pytorch_pin
from tests.servers import ScriptedServer
from tests.unit.conftest import ROOT
from tests.unit.test_mut_lock import (
    SHA_A,
    SHA_B,
    Recording,
    Upgrading,
    _extending,
    _git,
    _labels,
    _Rewrite,
    _smddp,
    entry,
)
from tests.unit.test_piplock import _wheel

NCCL_PIN = (nccl_pytorch_pin.ENTRY,)

A = "a" * 40
LOCAL_ID = "sha256:" + "3" * 64
# Every git source of the SMDDP image pinned by the manifest: nothing asks a git server.
COMMITS = tuple(f"stages.{s}.commit={A}" for s in ("nccl", "aws-ofi-nccl", "pytorch",
                                                    "torchvision"))
TORCH_PIP = ("pip", "pytorch")
TORCH_ORIGIN: dict[str, object] = {"requirements": ["typing-extensions"], "python": "3.8",
                "platform": "linux/amd64"}
EXTENDS_REF = "registry.example/efa:1"


# ---- a real package index on 127.0.0.1 -----------------------------------------------------------


class Index:
    """A PEP 503 index of real wheels under /INDEX/simple/ that records every path asked."""

    def __init__(self, root: Path) -> None:
        self.pages: dict[str, tuple[str, bytes]] = {}
        self.seen: list[str] = []
        self.hashes: dict[str, str] = {}
        for version in ("3.0.0", "4.0.0"):
            wheel = _wheel(root, "typing_extensions", version)
            body = wheel.read_bytes()
            self.hashes[version] = "sha256:" + hashlib.sha256(body).hexdigest()
            self.pages[f"/files/{wheel.name}"] = ("application/octet-stream", body)
        names = {v: f"typing_extensions-{v}-py3-none-any.whl" for v in self.hashes}
        links = "".join(f'<a href="/files/{names[v]}#{h.replace(":", "=")}">{names[v]}</a>\n'
                        for v, h in self.hashes.items())
        self.pages["/INDEX/simple/typing-extensions/"] = (
            "text/html", f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode())
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(send_body=False)

            def do_GET(self) -> None:
                self._answer(send_body=True)

            def _answer(self, *, send_body: bool) -> None:
                index.seen.append(self.path)
                kind, body = index.pages.get(self.path, ("text/plain", b""))
                self.send_response(200 if self.path in index.pages else 404)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    @property
    def pypi(self) -> str:
        """The index as an endpoint names it: ending in a slash (and in an X)."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/INDEX/"

    def packages(self, version: str) -> list[dict[str, object]]:
        return [{"name": "typing-extensions", "version": version,
                 "hashes": [self.hashes[version]]}]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    served = Index(tmp_path_factory.mktemp("wheels"))
    thread = threading.Thread(target=served.httpd.serve_forever, kwargs={"poll_interval": 0.02},
                              daemon=True)
    thread.start()
    try:
        yield served
    finally:
        served.httpd.shutdown()
        served.httpd.server_close()


# ---- a docker CLI on PATH ------------------------------------------------------------------------


def _docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, ref: str = EXTENDS_REF,
            remote: object = None) -> None:
    """A `docker` whose registry holds only `ref` (answering `imagetools inspect` with the JSON
    of `remote`); no local image store."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "remote.json").write_text(json.dumps(remote) if remote is not None else "")
    (bin_dir / "docker").write_text(f"""#!/bin/sh
[ "$1" = buildx ] && [ "$4" = '{ref}' ] && [ -s {tmp_path}/remote.json ] || {{
  echo "no such image" >&2; exit 1; }}
cat {tmp_path}/remote.json
""")
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # No engine API either: only this docker answers.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/imageforge.sock")


def _registry_answer(digest: str) -> dict[str, object]:
    return {"manifest": {"digest": digest},
            "image": {"config": {"Labels": _labels(python="3.8", efa="")}}}


# ---- lockresolve.resolve ----------------------------------------------------------------


def _previous(manifest: Manifest, **replace: lockfile.Entry | None) -> lockfile.Lock:
    """A lock of `manifest` as an earlier `invoke lock` left it; `replace` sets (or, with
    None, drops) entries by their dotted name."""
    entries = dict(locksettle.settle(manifest, None, STAGES, Recording()).entries)  # type: ignore[arg-type]
    for dotted, value in replace.items():
        path = next(p for p in entries if lockfile.name(p) == dotted.replace("__", "."))
        if value is None:
            del entries[path]
        else:
            entries[path] = value
    return lockfile.Lock(entries=entries)


def test_resolve_keeps_the_previous_pins_and_resolves_the_missing_pip_set_at_the_index(
        index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _docker(tmp_path, monkeypatch)  # no registry knows the base image
    manifest = _smddp(*COMMITS)
    base = entry({"ref": str(manifest.image["base"])}, digest=None)
    previous = _previous(manifest, base=base, pip__pytorch=None)
    asked: list[str] = []

    def local_id(ref: str) -> str:
        asked.append(ref)
        return LOCAL_ID

    index.seen.clear()
    settled = lockresolve.resolve(manifest, STAGES, SourceCache(tmp_path / "cache"), previous,
                           upgrade=False, endpoints=Endpoints(pypi=index.pypi),
                           local_id=local_id)
    assert settled.entries[TORCH_PIP] == lockfile.Entry(origin=TORCH_ORIGIN,
                                                    pin={"packages": index.packages("4.0.0")})
    assert {p: e for p, e in settled.entries.items() if p != TORCH_PIP} == previous.entries
    assert settled.stale == (TORCH_PIP,)
    assert "/INDEX/simple/typing-extensions/" in index.seen
    assert asked == [str(manifest.image["base"])]
    assert settled.manifest.image["base_image_id"] == LOCAL_ID


def test_upgrading_one_stage_resolves_its_pip_set_anew_and_keeps_every_other_pin(
        index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _docker(tmp_path, monkeypatch)
    manifest = _smddp(*COMMITS)
    old = entry(TORCH_ORIGIN, packages=index.packages("3.0.0"))
    previous = _previous(manifest, pip__pytorch=old)
    settled = lockresolve.resolve(manifest, STAGES, SourceCache(tmp_path / "cache"), previous,
                           upgrade=True, only=("pytorch",), endpoints=Endpoints(pypi=index.pypi))
    # what the pytorch stage installs: the set resolved now, at the newest version
    assert settled.manifest.stages["pytorch"][piplock.INPUT] == index.packages("4.0.0")
    # and what the lock file records: the same set (the old entry once came back over it,
    # so the written lock stayed stale for ever)
    assert settled.entries[TORCH_PIP] == lockfile.Entry(origin=TORCH_ORIGIN,
                                                    pin={"packages": index.packages("4.0.0")})
    again = locksettle.settle(manifest, settled.lock(), STAGES)
    assert (again.stale, again.unused) == ((), ())
    assert {p: e for p, e in settled.entries.items() if p != TORCH_PIP} == {
        p: e for p, e in previous.entries.items() if p != TORCH_PIP}


def test_resolve_asks_the_registry_again_for_an_extended_image_the_lock_has(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`invoke lock` revisits current entries: an extended image that moved is pinned anew."""
    manifest = load(_extending(tmp_path, None), COMMITS, registry=STAGES)
    was = entry({"ref": EXTENDS_REF}, digest="sha256:" + SHA_A, provides=["efa", "python"],
                versions={"python": "3.8"})
    previous = locksettle.settle(manifest, lockfile.Lock(entries={lockfile.EXTENDS: was}), STAGES,
                           Recording()).lock()  # type: ignore[arg-type]
    _docker(tmp_path, monkeypatch, remote=_registry_answer("sha256:" + SHA_B))
    settled = lockresolve.resolve(manifest, STAGES, SourceCache(tmp_path / "cache"), previous,
                           upgrade=False)
    assert settled.entries[lockfile.EXTENDS] == entry(
        {"ref": EXTENDS_REF}, digest="sha256:" + SHA_B, provides=["python", "efa"],
        versions={"python": "3.8"})
    assert {p: e for p, e in settled.entries.items() if p != lockfile.EXTENDS} == {
        p: e for p, e in previous.entries.items() if p != lockfile.EXTENDS}


def test_an_extended_image_is_inspected_by_its_reference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _docker(tmp_path, monkeypatch, remote=_registry_answer("sha256:" + SHA_A))
    manifest = load(_extending(tmp_path, None), registry=STAGES)
    assert lockresolve._inspect_extended(manifest, STAGES) == {
        "digest": "sha256:" + SHA_A, "provides": ["python", "efa"],
        "versions": {"python": "3.8"}}


# ---- Upstream.pip --------------------------------------------------------------------------------


def test_pip_requirements_without_a_solution_are_refused_naming_the_stage(
        index: Index, tmp_path: Path) -> None:
    up = lockresolve.Upstream(cache=SourceCache(tmp_path), stages=STAGES,
                       endpoints=Endpoints(pypi=index.pypi))
    origin = {**TORCH_ORIGIN, "requirements": ["typing-extensions>=9"]}
    with pytest.raises(LockError) as info:
        up.pip("pytorch", origin, None)
    message = str(info.value)
    assert message.startswith("stages.pytorch: pip requirements typing-extensions>=9 have no "
                              "solution for Python 3.8 (")
    assert message.endswith("); fix them in the manifest.")



def test_a_pip_set_whose_origin_names_an_index_is_resolved_there_not_at_pypi(
        index: Index, tmp_path: Path) -> None:
    # The endpoints' PyPI answers nothing: only the origin's own index can resolve the set.
    up = lockresolve.Upstream(cache=SourceCache(tmp_path), stages=STAGES,
                              endpoints=Endpoints(pypi="http://127.0.0.1:9/nothing/"))
    index.seen.clear()
    origin = {**TORCH_ORIGIN, "index": index.pypi + "simple"}
    assert up.pip("pytorch", origin, None) == {"packages": index.packages("4.0.0")}
    assert "/INDEX/simple/typing-extensions/" in index.seen


# ---- _settle_pip: a stage's own index ------------------------------------------------------------


WHEEL_INDEX = "https://download.pytorch.org/whl/cu130"
TORCH_WHEELS: list[dict[str, object]] = [
    {"name": "torch", "version": "2.14.1", "hashes": ["sha256:" + SHA_A]},
    {"name": "torchvision", "version": "0.29.1", "hashes": ["sha256:" + SHA_B]}]


def _wheel_lock(origin: dict[str, object]) -> lockfile.Lock:
    return lockfile.Lock(entries={TORCH_PIP: entry(origin, packages=TORCH_WHEELS)})


def test_a_pip_entry_is_current_only_when_it_was_resolved_at_the_stages_own_index() -> None:
    manifest = load(ROOT / "manifests/real-pytorch.toml",
                    (f"stages.pytorch.index={WHEEL_INDEX}/",), registry=STAGES)
    origin: dict[str, object] = {"requirements": ["torch==2.14.1", "torchvision==0.29.1"],
                                 "python": "3.11", "platform": "linux/amd64"}
    settled = locksettle.settle(manifest, _wheel_lock({**origin, "index": WHEEL_INDEX}), STAGES)
    assert TORCH_PIP not in settled.stale
    assert settled.manifest.stages["pytorch"][piplock.INPUT] == TORCH_WHEELS
    # The same set resolved at PyPI is not this stage's: it is resolved again.
    elsewhere = locksettle.settle(manifest, _wheel_lock(origin), STAGES)
    assert TORCH_PIP in elsewhere.stale
    assert piplock.INPUT not in elsewhere.manifest.stages["pytorch"]


# ---- Upstream.upgrades ---------------------------------------------------------------------------


def test_upgrades_read_listings_where_the_caches_rewrite_rules_send_them(tmp_path: Path) -> None:
    with ScriptedServer() as api:
        api.route("/ofi/", b'<a href="aws-ofi-nccl-1.19.0.tar.gz">1.19.0</a> '
                           b'<a href="aws-ofi-nccl-1.21.1.tar.gz">1.21.1</a>')
        manifest = load(ROOT / "manifests" / "real-efa-nccl.toml", (
            "stages.aws-ofi-nccl.version=1.19.0", "stages.aws-ofi-nccl.policy=>=1.19",
            "stages.aws-ofi-nccl.url=http://upstream.invalid/ofi/aws-ofi-nccl-{version}.tar.gz"),
            registry=STAGES)
        rewrite = _Rewrite("http://upstream.invalid", api.url(""))
        cache = SourceCache(tmp_path, rewrite)
        found = lockresolve.Upstream(cache=cache, stages=STAGES).upgrades(manifest, STAGES,
                                                                  ["aws-ofi-nccl"])
        assert api.count("/ofi/") == 1
    assert [(u.stage, u.old, u.new, u.source) for u in found] == [
        ("aws-ofi-nccl", "1.19.0", "1.21.1", "http://upstream.invalid/ofi/")]


# ---- Upstream.nccl_pin against git repositories on disk ------------------------------------------


def _commit_all(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str, str]:
    """An NCCL repository tagged v2.21.5-1 and v2.26.2-1, and a PyTorch commit that pins
    both ways: its submodule at NCCL 2.21.5, its CUDA 12 pin file at v2.26.2-1 (CUDA 11:
    v2.21.5-1, and no pin file for other CUDAs)."""
    root = tmp_path_factory.mktemp("git")
    nccl, pytorch = root / "nccl", root / "pytorch"
    commits = []
    for repo in (nccl, pytorch):
        repo.mkdir()
        _git(repo, "init", "-q", "-b", "main")
    (nccl / "makefiles").mkdir()
    for minor, patch in (("21", "5"), ("26", "2")):
        (nccl / "makefiles" / "version.mk").write_text(
            f"NCCL_MAJOR := 2\nNCCL_MINOR := {minor}\nNCCL_PATCH := {patch}\nNCCL_SUFFIX :=\n")
        commits.append(_commit_all(nccl, f"2.{minor}.{patch}"))
        _git(nccl, "tag", f"v2.{minor}.{patch}-1")
    pins = pytorch / ".ci/docker/ci_commit_pins"
    pins.mkdir(parents=True)
    (pins / "nccl-cu11.txt").write_text("v2.21.5-1\n")
    (pins / "nccl-cu12.txt").write_text("# the CUDA 12 builds\nv2.26.2-1\n")
    _git(pytorch, "add", "-A")
    _git(pytorch, "update-index", "--add", "--cacheinfo",
         f"160000,{commits[0]},third_party/nccl/nccl")
    _git(pytorch, "commit", "-q", "-m", "pins")
    return nccl, pytorch, _git(pytorch, "rev-parse", "HEAD"), commits[1]


def _nccl_pin(repos: tuple[Path, Path, str, str], cache: SourceCache, *overrides: str
              ) -> dict[str, object]:
    nccl, pytorch, commit, _ = repos
    manifest = _smddp(f"stages.nccl.repo={nccl}", f"stages.pytorch.repo={pytorch}",
                      "stages.pytorch.ref=release/2.7", f"stages.pytorch.commit={commit}",
                      *overrides)
    return dict(lockresolve.Upstream(cache=cache, stages=STAGES).lock_pin(
        nccl_pytorch_pin.PIN, manifest, STAGES, None))


@pytest.mark.usefixtures("isolated_git")
def test_the_nccl_pin_follows_the_pin_file_of_the_images_cuda(
        repos: tuple[Path, Path, str, str], tmp_path: Path) -> None:
    newer = repos[3]
    cache = SourceCache(tmp_path / "cache")
    pin = _nccl_pin(repos, cache, "stages.pytorch.version=2.7.0", "image.cuda=12.1")
    assert (pin["version"], pin["commit"]) == ("2.26.2", newer)
    evidence = pin["evidence"]
    assert isinstance(evidence, dict)
    assert {k: evidence[k] for k in ("pytorch_ref", "method", "path", "pin")} == {
        "pytorch_ref": "release/2.7", "method": "pin-file",
        "path": ".ci/docker/ci_commit_pins/nccl-cu12.txt", "pin": "v2.26.2-1"}
    # both repositories are read through mirrors kept in the source cache
    assert len(list((tmp_path / "cache" / "mirrors").glob("*.git"))) == 2
    with pytest.raises(CompatibilityError) as info:
        _nccl_pin(repos, cache, "stages.pytorch.version=2.7.0", "image.cuda=10.2")
    assert str(info.value) == (
        "PyTorch release/2.7 pins NCCL per CUDA version in .ci/docker/ci_commit_pins "
        "(nccl-cu11.txt, nccl-cu12.txt) and none of them is for CUDA 10.2; set image.cuda to "
        "a CUDA those files cover, or set stages.nccl.version explicitly.")


@pytest.mark.usefixtures("isolated_git")
def test_the_nccl_pin_of_a_pytorch_before_2_7_is_its_submodule(
        repos: tuple[Path, Path, str, str], tmp_path: Path) -> None:
    nccl, _, _, _ = repos
    pin = _nccl_pin(repos, SourceCache(tmp_path / "cache"), "image.cuda=12.1")
    older = _git(nccl, "rev-parse", "v2.21.5-1")
    assert (pin["version"], pin["commit"]) == ("2.21.5", older)
    evidence = pin["evidence"]
    assert isinstance(evidence, dict)
    assert evidence["method"] == "submodule"


# ---- settle --------------------------------------------------------------------------------------


def test_a_lock_entry_that_disagrees_with_the_manifests_own_pin_is_stale(tmp_path: Path) -> None:
    given = "sha256:" + SHA_A
    manifest = _smddp(f"image.base_digest={given}")
    first = locksettle.settle(manifest, None, STAGES, Recording())  # type: ignore[arg-type]
    assert first.entries[lockfile.BASE].pin == {"digest": given}
    other = lockfile.Entry(origin=first.entries[lockfile.BASE].origin,
                           pin={"digest": "sha256:" + SHA_B})
    the_lock = lockfile.Lock(entries={**first.entries, lockfile.BASE: other})
    settled = locksettle.settle(manifest, the_lock, STAGES)
    assert settled.stale == (lockfile.BASE,)
    assert settled.entries[lockfile.BASE].pin == {"digest": given}
    path = tmp_path / "smddp.lock.json"
    with pytest.raises(LockError) as info:
        locksettle.check(manifest, the_lock, path, registry=STAGES)
    assert str(info.value) == (f"{path} is stale for {manifest.path} (with its --set "
                               "overrides): stale entries base; run `invoke lock` with the "
                               "same overrides.")


def test_the_nccl_pin_of_an_image_without_cuda_records_no_cuda(tmp_path: Path) -> None:
    path = tmp_path / "cpu.toml"
    path.write_text((ROOT / "manifests/smddp.toml").read_text().replace(
        'base = "nvidia/cuda:11.3.1-cudnn8-devel-ubuntu20.04"\ncuda = "11.3"\n',
        'base = "ubuntu:20.04"\n'))
    manifest = load(path, (f"stages.pytorch.commit={A}",), registry=STAGES)
    origin: dict[str, object] = {"pytorch_version": "1.10.2", "pytorch_commit": A, "cuda": None}
    pinned = entry(origin, version="2.10.3", commit="5" * 40)
    settled = locksettle.settle(manifest, lockfile.Lock(entries={NCCL_PIN: pinned}), STAGES)
    assert NCCL_PIN not in settled.stale
    assert settled.entries[NCCL_PIN] == pinned
    assert json.loads(lockfile.text(settled.lock(), manifest))["nccl_pytorch_pin"]["from"] == origin


def _miniconda_for_the_images_python(ctx: Context) -> Sequence[Source]:
    """Miniconda's installer is built per Python: the one for the image's."""
    python = str(ctx.image["python"]).replace(".", "")
    url = f"https://repo.example/miniconda/Miniconda3-py{python}_24.1-Linux-x86_64.sh"
    return [UrlSource(name="src-python", url=url, sha256=ctx.of("python").get("sha256"),
                      filename=url.rsplit("/", 1)[1])]


def test_a_stage_without_a_table_is_pinned_from_its_defaults_and_the_images_settings(
        tmp_path: Path) -> None:
    registry = {**STAGES, "python": dataclasses.replace(
        STAGES["python"], sources=_miniconda_for_the_images_python)}
    text = (ROOT / "manifests/smddp.toml").read_text()
    table = text[text.index("[stages.python]"):text.index("[stages.efa]")]
    path = tmp_path / "no-python-table.toml"
    path.write_text(text.replace(table, ""))
    manifest = load(path, registry=registry)
    assert not manifest.has_stage("python")
    url = "https://repo.example/miniconda/Miniconda3-py38_24.1-Linux-x86_64.sh"
    pinned = entry({"url": url}, sha256=SHA_A)
    settled = locksettle.settle(manifest, lockfile.Lock(entries={("stages", "python", "src-python"):
                                                       pinned}), registry)
    assert ("stages", "python", "src-python") not in settled.stale
    defaults = {key: field.default for key, field in registry["python"].fields.items()}
    assert settled.manifest.stages["python"] == {**defaults, "sha256": SHA_A}


def _pytorch_for_the_images_cuda(ctx: Context) -> Sequence[Source]:
    """A PyTorch fork with one release branch per CUDA."""
    cuda = str(ctx.image["cuda"]).replace(".", "")
    source = git_source("pytorch", ctx.of("pytorch"))
    return [dataclasses.replace(source, ref=f"{source.ref}-cu{cuda}")]


def test_the_nccl_pin_reads_pytorch_with_the_images_settings() -> None:
    pytorch: Stage = dataclasses.replace(STAGES["pytorch"], sources=_pytorch_for_the_images_cuda)
    registry = {**STAGES, "pytorch": pytorch}
    manifest = load(ROOT / "manifests/smddp.toml", (f"stages.pytorch.commit={A}",),
                    registry=registry)
    origin: dict[str, object] = {"pytorch_version": "1.10.2", "pytorch_commit": A,
                                 "cuda": "11.3"}
    pinned = entry(origin, version="2.10.3", commit="5" * 40)
    settled = locksettle.settle(manifest, lockfile.Lock(entries={NCCL_PIN: pinned}), registry)
    assert settled.entries[NCCL_PIN] == pinned
    assert settled.entries[("stages", "pytorch", "src-pytorch")].origin == {
        "repo": manifest.stages["pytorch"]["repo"], "ref": "v1.10.2-cu113"}


# ---- lock --upgrade: what it forgets -------------------------------------------------------------


def test_an_upgrade_that_finds_no_newer_release_drops_the_earlier_move() -> None:
    manifest = _smddp("stages.efa.policy=~=1.14")
    first = locksettle.settle(manifest, None, STAGES, Recording())  # type: ignore[arg-type]
    moved = entry({"version": "1.14.1", "policy": "~=1.14"}, to="1.14.9", source="listing")
    earlier = lockfile.Lock(entries={**first.entries, ("upgraded", "efa"): moved})
    again = locksettle.settle(manifest, earlier, STAGES)
    assert again.manifest.stages["efa"]["version"] == "1.14.9"
    settled = locksettle.settle(manifest, earlier, STAGES,
                                Upgrading(["efa"], {}))  # type: ignore[arg-type]
    assert settled.manifest.stages["efa"]["version"] == "1.14.1"
    assert ("upgraded", "efa") not in settled.entries


def test_an_upgrade_leaves_an_entry_without_a_stage_to_the_unused_ones() -> None:
    manifest = _smddp()
    first = locksettle.settle(manifest, None, STAGES, Recording())  # type: ignore[arg-type]
    odd = ("upgraded",)  # {"upgraded": {"from": ...}} in the file: an entry of no stage
    the_lock = lockfile.Lock(entries={**first.entries, odd: entry({"version": "1"}, to="2")})
    settled = locksettle.settle(manifest, the_lock, STAGES, Upgrading(["efa"], {}))  # type: ignore[arg-type]
    assert settled.unused == (odd,)


def test_upgrading_every_stage_keeps_the_nccl_pin_while_pytorch_stays() -> None:
    manifest = _smddp()
    first = locksettle.settle(manifest, None, STAGES, Recording())  # type: ignore[arg-type]
    kept = lockfile.Entry(origin=first.entries[NCCL_PIN].origin,
                      pin={**first.entries[NCCL_PIN].pin, "evidence": {"method": "submodule"}})
    the_lock = lockfile.Lock(entries={**first.entries, NCCL_PIN: kept})
    settled = locksettle.settle(manifest, the_lock, STAGES, Upgrading(None, {}))  # type: ignore[arg-type]
    assert settled.entries[NCCL_PIN] == kept


# ---- diff and the base digest --------------------------------------------------------------------


def test_diff_words_an_unknown_pin_field_by_field() -> None:
    new = lockfile.Lock(entries={("custom", "thing"): entry({}, level=3, kind="x", tags=["a"])})
    assert lockfile.diff(None, new) == ["custom.thing: (none) -> level 3, kind x"]


def test_a_registry_that_does_not_answer_in_time_leaves_the_base_unpinned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # Answers, but only after 3 s: far past the timeout below.
    (bin_dir / "docker").write_text(f"#!{sys.executable}\nimport time\ntime.sleep(3)\n"
                                    f"print('\"sha256:{SHA_A}\"')\n")
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # No engine API either: only this docker answers.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/imageforge.sock")
    assert lockresolve._base_digest("img:1", timeout=0.3) is None
    assert lockresolve._base_digest("img:1@sha256:" + SHA_B, timeout=0.3) == "sha256:" + SHA_B

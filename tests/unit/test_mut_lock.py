"""The lock's own bookkeeping, fast and in process (imageforge/sources/lock*.py): how a lock
file is written (whole, indented, beside the manifest's lock), what `diff` says for every kind of
entry, when pins moved, how stale and unused entries are named, and what the upstream
resolver answers from an entry it already has without asking upstream."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer

from imageforge.errors import DockerError, LockError, ManifestError, SourceError
from imageforge.model.manifest import Manifest, load
from imageforge.model.sourcetypes import GitSource, UrlSource
from imageforge.sources import extended, lockfile, lockresolve, locksettle, piplock, upstream
from imageforge.sources.sources import SourceCache
from sample.serve import ServerHandle
from stages import STAGES, nccl_pytorch_pin
from tests.unit.conftest import ROOT, sample_manifest

NCCL_PIN = (nccl_pytorch_pin.ENTRY,)

SAMPLE = ROOT / "manifests/sample.toml"
A = "a" * 40
B = "b" * 40
SHA_A = "1" * 64
SHA_B = "2" * 64
NCCL_COMMIT = "507f9c571bb959fce87c3bfce0e3da9afa344c65"  # what the sample's PyTorch pins


def entry(origin: dict[str, object], **pin: object) -> lockfile.Entry:
    return lockfile.Entry(origin=origin, pin=pin)


def test_text_is_the_lock_as_two_space_indented_json_with_a_final_newline() -> None:
    manifest = load(SAMPLE, registry=STAGES)
    the_lock = lockfile.Lock(entries={("stages", "efa", "src-efa"): entry({"url": "u"}, sha256="x"),
                                  lockfile.BASE: entry({"ref": "r"}, digest=None)},
                         source_date_epoch=7)
    written = lockfile.text(the_lock, manifest)
    assert written == json.dumps(the_lock.to_json(manifest), indent=2) + "\n"
    assert written.startswith('{\n  "format": 2,\n  "manifest": "sample.toml",\n')
    assert json.loads(written)["stages"]["efa"]["src-efa"] == {"from": {"url": "u"},
                                                                "sha256": "x"}


def test_write_replaces_the_file_whole_and_leaves_no_temp_file(tmp_path: Path) -> None:
    manifest = load(SAMPLE, registry=STAGES)
    path = tmp_path / "sample.lock.json"
    path.write_text("old")
    the_lock = lockfile.Lock(entries={lockfile.BASE: entry({"ref": "r"}, digest="sha256:" + SHA_A)})
    lockfile.write(path, the_lock, manifest)
    assert path.read_text() == lockfile.text(the_lock, manifest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sample.lock.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    manifest = load(SAMPLE, registry=STAGES)
    path = tmp_path / "sample.lock.json"
    path.write_text("old")
    # A pin that JSON cannot hold: text() fails while the temp file is open.
    broken = lockfile.Lock(entries={lockfile.BASE: entry({"ref": "r"}, digest=object())})
    with pytest.raises(TypeError):
        lockfile.write(path, broken, manifest)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sample.lock.json"]


def test_write_makes_its_temp_file_beside_the_lock(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside it, so the final rename is atomic (same file system) and hidden meanwhile."""
    manifest = load(SAMPLE, registry=STAGES)
    path = tmp_path / "sample.lock.json"
    renames: list[tuple[Path, Path]] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        renames.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    lockfile.write(path, lockfile.Lock(entries={}), manifest)
    (src, dst), = renames
    assert dst == path
    assert src.parent == tmp_path
    assert src.name.startswith(".sample.lock.json.")
    assert src.name.endswith(".tmp")


def test_check_refuses_a_missing_lock_naming_both_files(tmp_path: Path) -> None:
    manifest = load(SAMPLE, registry=STAGES)
    with pytest.raises(LockError) as info:
        locksettle.check(manifest, None, tmp_path / "x.lock.json", registry=STAGES)
    assert str(info.value) == (f"{tmp_path / 'x.lock.json'}: no lock file for {manifest.path}; "
                               "run `invoke lock`.")


def _settled(stale: tuple[lockfile.EntryPath, ...], unused: tuple[lockfile.EntryPath, ...]
             ) -> locksettle.Settled:
    return locksettle.Settled(manifest=load(SAMPLE, registry=STAGES), entries={}, stale=stale,
                        unresolved=(), unused=unused)


def test_describe_names_stale_and_unused_entries() -> None:
    s = ("stages", "efa", "src-efa")
    n = ("stages", "nccl", "src-nccl")
    assert locksettle.describe(_settled((s, lockfile.BASE), ())) == \
        "stale entries stages.efa.src-efa, base"
    assert locksettle.describe(_settled((), (n, NCCL_PIN))) == \
        "unused entries stages.nccl.src-nccl, nccl_pytorch_pin"
    assert locksettle.describe(_settled((s,), (n,))) == \
        "stale entries stages.efa.src-efa; unused entries stages.nccl.src-nccl"
    assert locksettle.describe(_settled((), ())) == ""


def test_section_and_versions_read_the_upgraded_entries() -> None:
    the_lock = lockfile.Lock(entries={
        ("upgraded", "efa"): entry({"version": "1.14.1", "policy": "minor"}, to="1.15.0"),
        ("upgraded", "nccl"): entry({"version": "2.10.3", "policy": "patch"}, to="2.10.4"),
        ("stages", "efa", "src-efa"): entry({"url": "u"}, sha256="x"),
        ("upgraded",): entry({}, to="never"),
    })
    assert the_lock.section("upgraded") == {
        "efa": the_lock.entries[("upgraded", "efa")],
        "nccl": the_lock.entries[("upgraded", "nccl")]}
    assert the_lock.versions() == {"efa": "1.15.0", "nccl": "2.10.4"}
    assert the_lock.section("stages") == {}


def test_pins_moved_only_when_a_pin_differs_or_an_entry_goes() -> None:
    old = lockfile.Lock(entries={lockfile.BASE: entry({"ref": "r"}, digest="d1"),
                             ("stages", "efa", "src-efa"): entry({"url": "u1"}, sha256="x")})
    same_pins_new_origin = lockfile.Lock(entries={
        lockfile.BASE: entry({"ref": "r"}, digest="d1"),
        ("stages", "efa", "src-efa"): entry({"url": "mirror"}, sha256="x")})
    assert not lockfile.pins_moved(old, same_pins_new_origin)
    assert lockfile.pins_moved(old, lockfile.Lock(entries={
        lockfile.BASE: entry({"ref": "r"}, digest="d2"),
        ("stages", "efa", "src-efa"): entry({"url": "u1"}, sha256="x")}))
    assert lockfile.pins_moved(
        old, lockfile.Lock(entries={lockfile.BASE: entry({"ref": "r"}, digest="d1")}))
    assert lockfile.pins_moved(None, old)
    assert not lockfile.pins_moved(None, lockfile.Lock(entries={}))


def test_diff_describes_each_kind_of_entry() -> None:
    src = ("stages", "efa", "src-efa")
    git = ("stages", "nccl", "src-nccl")
    old = lockfile.Lock(entries={
        src: entry({"url": "u1"}, sha256=SHA_A),
        git: entry({"repo": "r", "ref": "v1"}, commit=A),
        lockfile.BASE: entry({"ref": "img:1"}, digest="sha256:" + SHA_A),
        ("upgraded", "efa"): entry({"version": "1.14.1", "policy": "minor"}, to="1.15.0"),
        NCCL_PIN: entry({"pytorch_commit": A}, version="2.10.3", commit=A),
        ("extends",): entry({"ref": "x"}, digest=None, provides=["a"]),
    })
    new = lockfile.Lock(entries={
        src: entry({"url": "u2"}, sha256=SHA_A),
        git: entry({"repo": "r", "ref": "v2"}, commit=B),
        lockfile.BASE: entry({"ref": "img:1"}, digest="sha256:" + SHA_B),
        ("upgraded", "nccl"): entry({"version": "2.10.3", "policy": "patch"}, to="2.10.4"),
        NCCL_PIN: entry({"pytorch_commit": B}, version="2.18.1", commit=B),
        ("extends",): entry({"ref": "x"}, digest=None, provides=["a"], versions={}),
    })
    assert lockfile.diff(old, new, STAGES) == [
        "base: sha256:" + SHA_A + " -> sha256:" + SHA_B,
        "extends: digest None -> digest None",
        f"nccl pinned by pytorch: 2.10.3 -> 2.18.1 ({B})",
        "efa: src-efa same pin, now from url u2".replace("efa: src-efa ", "stages.efa.src-efa: "),
        f"nccl: src-nccl {A} -> {B}",
        "efa: 1.15.0 -> 1.14.1 (the manifest's version)",
        "nccl: 2.10.3 -> 2.10.4 (policy patch)",
    ]


def test_diff_from_nothing_and_to_nothing() -> None:
    src = ("stages", "efa", "src-efa")
    new = lockfile.Lock(entries={
        src: entry({"url": "u"}, sha256=SHA_A),
        NCCL_PIN: entry({}, version="2.10.3", commit=A),
        ("upgraded", "efa"): entry({"version": "1.14.1", "policy": "minor"}, to="1.15.0"),
        ("custom", "thing"): entry({}, level=3, nested={"x": 1}),
    })
    assert lockfile.diff(None, new, STAGES) == [
        "custom.thing: (none) -> level 3",
        f"nccl pinned by pytorch: None -> 2.10.3 ({A})",
        f"efa: src-efa (none) -> {SHA_A}",
        "efa: 1.14.1 -> 1.15.0 (policy minor)",
    ]
    assert lockfile.diff(new, lockfile.Lock(entries={}), STAGES) == [
        "custom.thing: level 3 -> (none)",
        "nccl pinned by pytorch: 2.10.3 -> None (None)",
        f"efa: src-efa {SHA_A} -> (none)",
        "efa: 1.15.0 -> 1.14.1 (the manifest's version)",
    ]
    assert lockfile.diff(new, new) == []


def test_renewed_is_every_stage_or_the_named_ones_and_refuses_unknown(tmp_path: Path) -> None:
    manifest = load(SAMPLE, registry=STAGES)
    cache = SourceCache(tmp_path)
    names = ["base", "efa", "nccl"]
    assert lockresolve.Upstream(cache=cache, stages=STAGES).renewed(manifest, names) == []
    up = lockresolve.Upstream(cache=cache, stages=STAGES, upgrade=True)
    assert up.renewed(manifest, names) == names
    only = lockresolve.Upstream(cache=cache, stages=STAGES, upgrade=True, only=("nccl",))
    assert only.renewed(manifest, names) == ["nccl"]
    bad = lockresolve.Upstream(cache=cache, stages=STAGES, upgrade=True, only=("nccl", "gdr", "x"))
    with pytest.raises(ManifestError) as info:
        bad.renewed(manifest, names)
    assert str(info.value) == (f"--stage gdr: {manifest.path} defines no such stage; use one "
                               "of base, efa, nccl.")


def test_the_resolver_keeps_what_an_entry_already_pins(tmp_path: Path) -> None:
    up = lockresolve.Upstream(cache=SourceCache(tmp_path), stages=STAGES)
    manifest = load(SAMPLE, registry=STAGES)
    old_url = entry({"url": "u"}, sha256=SHA_A, extra=1)
    url = UrlSource(name="src-x", url=str(tmp_path / "nowhere.bin"), sha256=None,
                    filename="nowhere.bin")
    assert up.source(url, old_url) == {"sha256": SHA_A, "extra": 1}
    assert up.base("img:1", entry({"ref": "img:1"}, digest="d")) == {"digest": "d"}
    assert up.base("img@sha256:" + SHA_B, None) == {"digest": "sha256:" + SHA_B}
    pinned = entry({}, version="2.10.3", commit=A, evidence={"e": 1})
    assert up.lock_pin(nccl_pytorch_pin.PIN, manifest, STAGES, pinned) == {
        "version": "2.10.3", "commit": A, "evidence": {"e": 1}}
    packages = entry({}, packages=[{"name": "p"}])
    assert up.pip("smddp", {}, packages) == {"packages": [{"name": "p"}]}


def test_a_base_digest_comes_from_the_reference_or_the_registry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert lockresolve._base_digest("img:1@sha256:" + SHA_A) == "sha256:" + SHA_A
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/args\n"
                      f"cat {tmp_path}/out\nexit $(cat {tmp_path}/code)\n")
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # No engine API either: only this docker answers.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/imageforge.sock")

    def answer(code: int, out: str) -> str | None:
        (tmp_path / "code").write_text(str(code))
        (tmp_path / "out").write_text(out)
        return lockresolve._base_digest("img:1")

    assert answer(0, json.dumps("sha256:" + SHA_B)) == "sha256:" + SHA_B
    assert (tmp_path / "args").read_text().splitlines() == [
        "buildx", "imagetools", "inspect", "img:1", "--format", "{{json .Manifest.Digest}}"]
    assert answer(1, json.dumps("sha256:" + SHA_B)) is None
    assert answer(0, json.dumps("md5:abc")) is None
    assert answer(0, json.dumps({"digest": "sha256:" + SHA_B})) is None
    assert answer(0, "") is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    # No engine API either: only this docker answers.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/imageforge.sock")
    assert lockresolve._base_digest("img:1") is None


def test_apply_is_the_manifest_with_the_current_entries() -> None:
    manifest = load(SAMPLE, registry=STAGES)
    base = entry({"ref": str(manifest.image["base"])}, digest="sha256:" + SHA_A)
    applied = locksettle.apply(manifest, lockfile.Lock(entries={lockfile.BASE: base}), STAGES)
    assert applied.image["base_digest"] == "sha256:" + SHA_A
    stale = entry({"ref": "another:tag"}, digest="sha256:" + SHA_A)
    assert locksettle.apply(manifest, lockfile.Lock(entries={lockfile.BASE: stale}),
                      STAGES).image.get("base_digest") == manifest.image.get("base_digest") is None


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x"}
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_an_unpinned_file_is_hashed_once_and_kept_in_the_source_cache(tmp_path: Path) -> None:
    body = b"release bytes" * 100
    release = tmp_path / "up" / "tool-1.0.bin"
    release.parent.mkdir()
    release.write_bytes(body)
    cache = SourceCache(tmp_path / "cache")
    up = lockresolve.Upstream(cache=cache, stages=STAGES)
    source = UrlSource(name="src-tool", url=str(release), sha256=None, filename="tool-1.0.bin")
    digest = hashlib.sha256(body).hexdigest()
    assert up.source(source, None) == {"sha256": digest}
    assert up.source(source, entry({"url": "old"}, sha256=None)) == {"sha256": digest}
    kept = cache.path_for(dataclasses.replace(source, sha256=digest)) / "tool-1.0.bin"
    assert kept.read_bytes() == body
    # only the cache entry and its bookkeeping: the temporary download is gone
    assert all(not p.name.startswith("tmp") for p in (tmp_path / "cache").iterdir())


def test_an_unpinned_hostile_tarball_is_refused_naming_its_url(tmp_path: Path) -> None:
    bad = tmp_path / "evil.tar"
    with tarfile.open(bad, "w") as archive:
        info = tarfile.TarInfo("../escape")
        data = b"x"
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    cache = SourceCache(tmp_path / "cache")
    source = UrlSource(name="src-evil", url=str(bad), sha256=None, filename="evil.tar")
    with pytest.raises(SourceError) as err:
        lockresolve.Upstream(cache=cache, stages=STAGES).source(source, None)
    assert str(err.value).startswith(f"source src-evil ({bad}) was refused: member '../escape'")
    assert not (tmp_path / "cache" / "sha256").exists() or \
        list((tmp_path / "cache" / "sha256").iterdir()) == []


def test_a_ref_resolves_to_its_commit_and_a_moved_tag_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "f").write_text("1")
    _git(repo, "add", "f")
    _git(repo, "commit", "-q", "-m", "one")
    _git(repo, "tag", "v1")
    first = _git(repo, "rev-parse", "HEAD")
    up = lockresolve.Upstream(cache=SourceCache(tmp_path / "cache"), stages=STAGES)
    source = GitSource(name="src-x", repo=str(repo), ref="v1", commit=None)
    assert up.source(source, None) == {"commit": first}
    assert up.source(source, entry({"repo": str(repo), "ref": "v1"}, commit=first)) == \
        {"commit": first}
    (repo / "f").write_text("2")
    _git(repo, "commit", "-q", "-am", "two")
    _git(repo, "tag", "-f", "v1")
    second = _git(repo, "rev-parse", "HEAD")
    with pytest.raises(LockError) as info:
        up.source(source, entry({"repo": str(repo), "ref": "v1"}, commit=first))
    assert str(info.value) == (
        f"{repo} v1 now points to {second}, but the lock says {first}; if the move is "
        "expected run `invoke lock --upgrade`, otherwise pin `commit` in the manifest.")


def test_the_nccl_pin_is_read_from_pytorch_and_recorded_with_redacted_repos(
        sample_server: ServerHandle, tmp_path: Path) -> None:
    url = sample_server.url.replace("http://", "http://bot:s3cret@")
    manifest = load(sample_manifest(tmp_path / "m", url), registry=STAGES)
    pytorch = manifest.stages["pytorch"]
    source = GitSource(name="src-pytorch", repo=str(pytorch["repo"]),
                       ref=f"v{pytorch['version']}", commit=str(pytorch["commit"]))
    assert nccl_pytorch_pin._pytorch(manifest, STAGES)[1] == source
    up = lockresolve.Upstream(cache=SourceCache(tmp_path / "cache"), stages=STAGES)
    pin = up.lock_pin(nccl_pytorch_pin.PIN, manifest, STAGES, None)
    assert (pin["version"], pin["commit"]) == ("2.10.3", NCCL_COMMIT)
    evidence = pin["evidence"]
    assert evidence["pytorch_repo"] == str(pytorch["repo"]).replace("bot:s3cret@", "***@")
    assert evidence["nccl_repo"] == str(manifest.stages["nccl"]["repo"]).replace(
        "bot:s3cret@", "***@")
    assert evidence["pytorch_commit"] == pytorch["commit"]
    assert "s3cret" not in json.dumps(pin)


def _extending(tmp_path: Path, provides: str | None) -> Path:
    line = 'extends = "registry.example/efa:1"'
    if provides is not None:
        line += f"\nprovides = {provides}"
    path = tmp_path / "on-efa.toml"
    path.write_text((ROOT / "manifests/smddp.toml").read_text().replace(
        'base = "nvidia/cuda:11.3.1-cudnn8-devel-ubuntu20.04"', line))
    return path


def _docker_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, local: object = None,
                   remote: object = None) -> None:
    """A `docker` on PATH whose image store holds `local` and registry holds `remote` (the
    JSON `image inspect` / `imagetools inspect` print), None for no such image."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, value in (("local", local), ("remote", remote)):
        (tmp_path / f"{name}.json").write_text(json.dumps(value) if value is not None else "")
    (bin_dir / "docker").write_text(f"""#!/bin/sh
case "$1" in
  image) f={tmp_path}/local.json ;;
  buildx) f={tmp_path}/remote.json ;;
  *) exit 2 ;;
esac
[ -s "$f" ] || {{ echo "no such image" >&2; exit 1; }}
cat "$f"
""")
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # No engine API either: only this docker answers.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/imageforge.sock")


def _labels(**versions: str) -> dict[str, str]:
    labels = {f"{extended.KEY_LABEL}{n}": "sha256:" + "0" * 64 for n in versions}
    labels.update({f"{extended.VERSION_LABEL}{n}": v for n, v in versions.items() if v})
    return labels


def test_an_extended_image_in_a_registry_is_pinned_by_digest_with_its_labels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    digest = "sha256:" + SHA_A
    _docker_images(tmp_path, monkeypatch, remote={
        "manifest": {"digest": digest},
        "image": {"config": {"Labels": _labels(python="3.8", efa="")}}})
    manifest = load(_extending(tmp_path, None), registry=STAGES)
    up = lockresolve.Upstream(cache=SourceCache(tmp_path / "cache"), stages=STAGES)
    in_stage_order = [n for n in STAGES if n in ("efa", "python")]
    assert up.extended(manifest, None) == {"digest": digest, "provides": in_stage_order,
                                           "versions": {"python": "3.8"}}
    declared = load(_extending(tmp_path, '["efa"]'), registry=STAGES)
    assert lockresolve._inspect_extended(declared, STAGES) == {
        "digest": digest, "provides": ["efa"], "versions": {"python": "3.8"}}


def test_a_local_extended_image_is_recorded_without_its_machine_local_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _docker_images(tmp_path, monkeypatch, local={
        "Id": "sha256:" + SHA_B, "Config": {"Labels": _labels(efa="1.14.1")}})
    manifest = load(_extending(tmp_path, None), registry=STAGES)
    assert lockresolve._inspect_extended(manifest, STAGES) == {
        "digest": None, "provides": ["efa"], "versions": {"efa": "1.14.1"}}


def test_an_extended_image_nowhere_to_be_seen_needs_declared_provides(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _docker_images(tmp_path, monkeypatch)
    with pytest.raises(DockerError):
        lockresolve._inspect_extended(load(_extending(tmp_path, None), registry=STAGES), STAGES)
    declared = load(_extending(tmp_path, '["efa", "python"]'), registry=STAGES)
    assert lockresolve._inspect_extended(declared, STAGES) == {
        "digest": None, "provides": ["efa", "python"], "versions": {}}


def test_an_extended_image_with_another_version_than_the_manifest_pins_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _docker_images(tmp_path, monkeypatch, local={
        "Id": "sha256:" + SHA_B, "Config": {"Labels": _labels(efa="1.0.0")}})
    manifest = load(_extending(tmp_path, None), registry=STAGES)
    with pytest.raises(ManifestError, match=r"already has efa 1\.0\.0"):
        lockresolve._inspect_extended(manifest, STAGES)


@pytest.mark.parametrize(("data", "why"), [
    ({"format": 2, "base": "sha256:x"}, "base is not a table"),
    ({"format": 2, "stages": {"efa": {"src-efa": 3}}}, "stages.efa.src-efa is not a table"),
    ({"format": 2, "stages": {"efa": {"src-efa": {"from": "u"}}}},
     "stages.efa.src-efa.from is not a table"),
])
def test_a_malformed_lock_names_the_entry(tmp_path: Path, data: object, why: str) -> None:
    path = tmp_path / "x.lock.json"
    path.write_text(json.dumps(data))
    with pytest.raises(LockError) as info:
        lockfile.read(path)
    assert str(info.value) == (f"{path}: not a valid imageforge lock file ({why}); delete it and "
                               "run `invoke lock`.")


def test_fill_takes_the_lock_pin_unless_the_manifest_gives_one() -> None:
    url = UrlSource(name="src-smddp", url="https://h/w.whl", sha256=None, filename="w.whl")
    s3 = UrlSource(name="src-smddp-s3", url="https://h/p.whl", sha256=None, filename="p.whl",
                   pin_key="s3_plugin_sha256")
    git = GitSource(name="src-nccl", repo="r", ref="v1", commit=None)
    values: dict[str, object] = {"sha256": None}
    locksettle._fill(values, url, {"sha256": SHA_A, "commit": A})
    locksettle._fill(values, s3, {"sha256": SHA_B})
    locksettle._fill(values, git, {"commit": B, "sha256": SHA_A})
    assert values == {"sha256": SHA_A, "s3_plugin_sha256": SHA_B, "commit": B}
    given: dict[str, object] = {"sha256": "given", "commit": "given"}
    locksettle._fill(given, url, {"sha256": SHA_A})
    locksettle._fill(given, git, {"commit": B})
    locksettle._fill(given, s3, {})
    assert given == {"sha256": "given", "commit": "given"}


def test_settle_pins_each_source_from_the_lock_and_names_what_is_missing() -> None:
    manifest = load(ROOT / "manifests/smddp.toml", registry=STAGES)
    first = locksettle.settle(manifest, None, STAGES)
    assert NCCL_PIN in first.stale
    assert NCCL_PIN in first.unresolved
    assert None not in first.stale
    assert None not in first.unresolved
    smddp = manifest.stages["smddp"]
    entries: dict[lockfile.EntryPath, lockfile.Entry] = {
        ("stages", "smddp", "src-smddp"): entry({"url": smddp["url"]}, sha256=SHA_A),
        ("stages", "smddp", "src-smddp-s3"): entry({"url": smddp["s3_plugin_url"]},
                                                  sha256=SHA_B),
    }
    settled = locksettle.settle(manifest, lockfile.Lock(entries=entries), STAGES)
    assert settled.manifest.stages["smddp"]["sha256"] == SHA_A
    assert settled.manifest.stages["smddp"]["s3_plugin_sha256"] == SHA_B
    assert ("stages", "smddp", "src-smddp") not in settled.stale


def test_the_locks_own_sections_pins() -> None:
    assert lockfile.Lock(entries={}).pins() == {}
    the_lock = lockfile.Lock(entries={NCCL_PIN: entry({}, version="2.10.3", commit=A,
                                                  evidence={"method": "submodule"}),
                                  ("stages", "efa", "src-efa"): entry({}, sha256=SHA_A)})
    assert the_lock.pins() == {nccl_pytorch_pin.ENTRY: {
        "version": "2.10.3", "commit": A, "evidence": {"method": "submodule"}}}


def test_with_nccl_pin_replaces_auto_only() -> None:
    auto = load(ROOT / "manifests/smddp.toml", ["stages.nccl.version=auto"], registry=STAGES)
    pin = lockfile.Lock(entries={NCCL_PIN: entry({}, version="2.10.3", commit=A)}).pins()[
        nccl_pytorch_pin.ENTRY]
    resolved = nccl_pytorch_pin.apply(auto, pin)
    assert {k: resolved.stages["nccl"][k] for k in ("version", "commit", "ref")} == {
        "version": "2.10.3", "commit": A, "ref": A}
    explicit = load(ROOT / "manifests/smddp.toml", registry=STAGES)
    assert nccl_pytorch_pin.apply(explicit, pin) is explicit


class Recording:
    """A resolver (locksettle.Resolver) that answers from the source's name and records what it
    was asked: settle is what is under test, upstream is not."""

    def __init__(self, *, revisit: bool = False) -> None:
        self.revisit = revisit
        self.calls: list[tuple[str, str, lockfile.Entry | None]] = []

    def renewed(self, _manifest: object, _names: object) -> list[str]:
        return []

    def upgrades(self, _manifest: object, _registry: object, _names: object) -> list[object]:
        return []

    def source(self, source: UrlSource | GitSource, old: lockfile.Entry | None) -> dict[str, str]:
        self.calls.append(("source", source.name, old))
        digest = hashlib.sha256(source.name.encode()).hexdigest()
        return {"sha256": digest} if isinstance(source, UrlSource) else {"commit": digest[:40]}

    def base(self, ref: str, old: lockfile.Entry | None) -> dict[str, str]:
        self.calls.append(("base", ref, old))
        return {"digest": "sha256:" + SHA_B}

    def extended(self, _manifest: object, _old: lockfile.Entry | None) -> dict[str, object]:
        raise AssertionError("nothing here extends an image")

    def lock_pin(self, pin: object, manifest: object, _registry: object,
                 old: lockfile.Entry | None) -> dict[str, object]:
        assert pin is nccl_pytorch_pin.PIN
        assert isinstance(manifest, Manifest)
        self.calls.append(("nccl_pin", str(manifest.stages["pytorch"]["commit"]), old))
        return {"version": "2.10.3", "commit": NCCL_COMMIT, "evidence": {}}

    def pip(self, stage: str, _origin: object, old: lockfile.Entry | None) -> dict[str, object]:
        self.calls.append(("pip", stage, old))
        return {"packages": []}


def _smddp(*overrides: str) -> Manifest:
    return load(ROOT / "manifests/smddp.toml", overrides, registry=STAGES)


def test_settle_asks_the_resolver_once_for_each_missing_pin() -> None:
    resolver = Recording()
    settled = locksettle.settle(_smddp(), None, STAGES, resolver)  # type: ignore[arg-type]
    assert settled.unresolved == ()
    asked = [(kind, what) for kind, what, _ in resolver.calls]
    assert len(asked) == len(set(asked))
    assert all(old is None for _, _, old in resolver.calls)
    sources = {what for kind, what in asked if kind == "source"}
    assert {"src-efa", "src-nccl", "src-pytorch", "src-smddp", "src-smddp-s3"} <= sources
    assert ("base", str(_smddp().image["base"])) in asked
    assert [w for k, w in asked if k == "nccl_pin"] == [
        settled.manifest.stages["pytorch"]["commit"]]
    assert settled.manifest.image["base_digest"] == "sha256:" + SHA_B
    assert settled.manifest.stages["efa"]["sha256"] == hashlib.sha256(b"src-efa").hexdigest()
    assert settled.manifest.stages["smddp"]["s3_plugin_sha256"] == \
        hashlib.sha256(b"src-smddp-s3").hexdigest()
    assert settled.manifest.stages["nccl"]["commit"] == \
        hashlib.sha256(b"src-nccl").hexdigest()[:40]
    assert set(settled.stale) == set(settled.entries)

    again = Recording()
    current = locksettle.settle(_smddp(), settled.lock(), STAGES, again)  # type: ignore[arg-type]
    assert again.calls == []
    assert current.stale == ()
    assert current.unused == ()
    assert current.manifest == settled.manifest

    revisit = Recording(revisit=True)
    locksettle.settle(_smddp(), settled.lock(), STAGES, revisit)  # type: ignore[arg-type]
    assert sorted((k, w) for k, w, _ in revisit.calls) == sorted(asked)
    for kind, what, old in revisit.calls:
        path = {"base": lockfile.BASE, "nccl_pin": NCCL_PIN}.get(kind)
        if path is None:
            path = next(p for p in settled.entries if p[-1] == what)
        assert old == settled.entries[path], (kind, what)


def test_with_nccl_auto_every_stage_is_still_pinned() -> None:
    resolver = Recording()
    auto = locksettle.settle(_smddp("stages.nccl.version=auto"), None, STAGES,
                       resolver)  # type: ignore[arg-type]
    plain = locksettle.settle(_smddp(), None, STAGES, Recording())  # type: ignore[arg-type]
    assert auto.unresolved == ()
    assert set(auto.entries) == set(plain.entries) | {NCCL_PIN}
    assert auto.manifest.stages["nccl"]["version"] == "2.10.3"
    pins = [c for c in resolver.calls if c[0] == "nccl_pin"]
    assert len(pins) == 1
    assert pins[0][1] == auto.manifest.stages["pytorch"]["commit"]


def test_a_base_digest_the_manifest_gives_is_not_asked_for() -> None:
    given = "sha256:" + SHA_A
    manifest = _smddp()
    manifest = dataclasses.replace(manifest, image={**manifest.image, "base_digest": given})
    resolver = Recording()
    settled = locksettle.settle(manifest, None, STAGES, resolver)  # type: ignore[arg-type]
    assert not [c for c in resolver.calls if c[0] == "base"]
    assert settled.manifest.image["base_digest"] == given
    assert settled.entries[lockfile.BASE].pin == {"digest": given}
    # without a resolver, the lock's current base entry pins it
    base = lockfile.Entry(origin={"ref": str(manifest.image["base"])}, pin={"digest": "sha256:"
                                                                         + SHA_B})
    unpinned = _smddp()
    assert locksettle.settle(unpinned, lockfile.Lock(entries={lockfile.BASE: base}), STAGES
                       ).manifest.image["base_digest"] == "sha256:" + SHA_B


def test_an_upgrade_applies_while_its_version_and_policy_are_the_manifests() -> None:
    manifest = _smddp("stages.efa.policy=~=1.14")
    efa = manifest.stages["efa"]
    moved = lockfile.Entry(origin={"version": str(efa["version"]), "policy": "~=1.14"},
                       pin={"to": "1.14.9", "source": "x"})
    settled = locksettle.settle(manifest, lockfile.Lock(entries={("upgraded", "efa"): moved}),
                                STAGES)
    assert settled.manifest.stages["efa"]["version"] == "1.14.9"
    assert ("upgraded", "efa") in settled.entries
    other = _smddp("stages.efa.policy=~=1.15")
    stale = locksettle.settle(other, lockfile.Lock(entries={("upgraded", "efa"): moved}), STAGES)
    assert stale.manifest.stages["efa"]["version"] == efa["version"]
    assert ("upgraded", "efa") not in stale.entries


class _Rewrite:
    """A Locator (imageforge.sources.sources) moving one URL prefix to another, as rewrite
    rules do."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def url(self, url: str) -> str:
        return self.new + url.removeprefix(self.old) if url.startswith(self.old) else url

    def source(self, source: UrlSource | GitSource) -> UrlSource | GitSource:
        if isinstance(source, UrlSource):
            return dataclasses.replace(source, url=self.url(source.url))
        return dataclasses.replace(source, repo=self.url(source.repo))

    def session(self) -> None:
        return None

    def git_config(self) -> dict[str, str]:
        return {}


def test_the_nccl_pin_records_the_manifests_repos_not_where_rewrites_sent_us(
        sample_server: ServerHandle, tmp_path: Path) -> None:
    manifest = load(sample_manifest(tmp_path / "m", "http://upstream.invalid"), registry=STAGES)
    pytorch = manifest.stages["pytorch"]
    source = GitSource(name="src-pytorch", repo=str(pytorch["repo"]),
                       ref=f"v{pytorch['version']}", commit=str(pytorch["commit"]))
    cache = SourceCache(tmp_path / "cache", _Rewrite("http://upstream.invalid", sample_server.url))
    assert nccl_pytorch_pin._pytorch(manifest, STAGES)[1] == source
    pin = lockresolve.Upstream(cache=cache, stages=STAGES).lock_pin(nccl_pytorch_pin.PIN, manifest,
                                                             STAGES, None)
    assert pin["version"] == "2.10.3"
    assert pin["evidence"]["pytorch_repo"] == "http://upstream.invalid/git/pytorch.git"
    assert pin["evidence"]["nccl_repo"] == str(manifest.stages["nccl"]["repo"])
    assert pin["evidence"]["pytorch_ref"] == f"v{pytorch['version']}"


def test_an_unpinned_file_is_downloaded_once(httpserver: HTTPServer, tmp_path: Path) -> None:
    body = b"release" * 100
    httpserver.expect_request("/tool-1.0.bin").respond_with_data(body)
    source = UrlSource(name="src-tool", url=httpserver.url_for("/tool-1.0.bin"), sha256=None,
                       filename="tool-1.0.bin")
    cache = SourceCache(tmp_path / "new" / "cache" / "sources")  # nothing of it exists yet
    digest = lockresolve.Upstream(cache=cache, stages=STAGES).source(source, None)["sha256"]
    assert digest == hashlib.sha256(body).hexdigest()
    assert len(httpserver.log) == 1
    kept = cache.path_for(dataclasses.replace(source, sha256=digest)) / "tool-1.0.bin"
    assert kept.read_bytes() == body


def test_diff_skips_equal_entries_and_names_pip_and_upgrade_moves() -> None:
    same = entry({"ref": "x"}, digest="d")
    old = lockfile.Lock(entries={
        ("aaa",): same,
        ("pip", "smddp"): entry({"r": 1}, packages=[{"name": "a", "version": "1"}]),
        ("upgraded", "efa"): entry({"version": "1.14.1", "policy": "minor"}, to="1.15.0"),
    })
    new = lockfile.Lock(entries={
        ("aaa",): same,
        ("pip", "smddp"): entry({"r": 1}, packages=[{"name": "a", "version": "2"}]),
        ("upgraded", "efa"): entry({"version": "1.14.1", "policy": "minor"}, to="1.16.0"),
    })
    assert lockfile.diff(old, new) == [
        "smddp: pip " + piplock.moves(old.entries[("pip", "smddp")].pin,
                                      new.entries[("pip", "smddp")].pin),
        "efa: 1.15.0 -> 1.16.0 (policy minor)",
    ]
    only = lockfile.Lock(entries={("pip", "x"): new.entries[("pip", "smddp")]})
    assert lockfile.diff(None, only) \
        == ["x: pip " + piplock.moves({}, new.entries[("pip", "smddp")].pin)]
    gone = lockfile.Lock(entries={("pip", "x"): new.entries[("pip", "smddp")]})
    assert lockfile.diff(gone, lockfile.Lock(entries={})) == [
        "x: pip " + piplock.moves(new.entries[("pip", "smddp")].pin, {})]


def test_an_entry_that_pins_nothing_moves_no_pin() -> None:
    assert not lockfile.pins_moved(None, lockfile.Lock(entries={("custom",): entry({"a": 1})}))


def test_settle_records_where_each_pin_came_from_and_what_the_manifest_gives() -> None:
    sample = load(SAMPLE, registry=STAGES)
    settled = locksettle.settle(sample, None, STAGES)
    nccl_tests = sample.stages["nccl-tests"]
    assert settled.entries[("stages", "nccl-tests", "src-nccl-tests")] == entry(
        {"repo": nccl_tests["repo"], "ref": str(nccl_tests["ref"]).replace(
            "{version}", str(nccl_tests["version"]))}, commit=nccl_tests["commit"])
    efa = sample.stages["efa"]
    url_entry = settled.entries[("stages", "efa", "src-efa")]
    assert url_entry.pin == {"sha256": efa["sha256"]}
    assert list(url_entry.origin) == ["url"]


DIGEST = "sha256:" + "d" * 64


def test_read_gives_the_entries_and_when_they_were_first_resolved(tmp_path: Path) -> None:
    path = tmp_path / "x.lock.json"
    assert lockfile.read(path) is None
    path.write_text(json.dumps({"format": 2, "manifest": "x.toml", "source_date_epoch": 1234,
                                "base": {"from": {"ref": "r"}, "digest": DIGEST}}))
    read = lockfile.read(path)
    assert read == lockfile.Lock(entries={lockfile.BASE: entry({"ref": "r"}, digest=DIGEST)},
                             source_date_epoch=1234)
    for text, why in (("[1, 2]", "not a JSON object"), ("{broken", None)):
        path.write_text(text)
        with pytest.raises(LockError) as info:
            lockfile.read(path)
        message = str(info.value)
        assert message.startswith(f"{path}: not a valid imageforge lock file (")
        assert message.endswith("); delete it and run `invoke lock`.")
        if why:
            assert f"({why})" in message
    path.write_text(json.dumps({"format": 1}))
    assert lockfile.read(path, old_ok=True) is None
    with pytest.raises(LockError) as info:
        lockfile.read(path)
    assert str(info.value) == (f"{path} is in lock format 1, not 2; run `invoke lock` to "
                               "rewrite it.")


def test_settle_names_unused_entries_and_keeps_unknown_sections() -> None:
    manifest = _smddp()
    first = locksettle.settle(manifest, None, STAGES, Recording())  # type: ignore[arg-type]
    gone = ("stages", "removed-stage", "src-x")
    custom = ("newer-kind", "thing")
    entries = {**first.entries, gone: entry({"url": "u"}, sha256=SHA_A),
               custom: entry({"a": 1}, b=2)}
    settled = locksettle.settle(manifest, lockfile.Lock(entries=entries), STAGES)
    assert settled.unused == (gone,)
    assert settled.entries[custom] == entries[custom]
    assert gone not in settled.entries
    # a stale entry is named stale, not unused
    moved = {**first.entries, lockfile.BASE: entry({"ref": "another:1"}, digest="d")}
    stale = locksettle.settle(manifest, lockfile.Lock(entries=moved), STAGES)
    assert lockfile.BASE in stale.stale
    assert stale.unused == ()


def test_a_local_base_image_id_is_asked_for_only_without_a_digest_or_id() -> None:
    asked: list[str] = []

    def local_id(ref: str) -> str:
        asked.append(ref)
        return "sha256:" + SHA_A

    manifest = _smddp()
    settled = locksettle.settle(manifest, None, STAGES, local_id=local_id)
    assert asked == [str(manifest.image["base"])]
    assert settled.manifest.image["base_image_id"] == "sha256:" + SHA_A
    with_id = dataclasses.replace(manifest, image={**manifest.image, "base_image_id": "x"})
    assert locksettle.settle(with_id, None, STAGES, local_id=local_id).manifest.image[
        "base_image_id"] == "x"
    assert len(asked) == 1


def test_an_extended_image_is_resolved_once_and_revisited_with_its_entry(tmp_path: Path) -> None:
    class Extending(Recording):
        def extended(self, manifest: object, old: lockfile.Entry | None) -> dict[str, object]:
            self.calls.append(("extended", str(getattr(manifest, "path", "")), old))
            return {"digest": None, "provides": ["efa", "python"], "versions": {}}

    manifest = load(_extending(tmp_path, None), registry=STAGES)
    resolver = Extending()
    settled = locksettle.settle(manifest, None, STAGES, resolver)  # type: ignore[arg-type]
    assert [c for c in resolver.calls if c[0] == "extended"] == [
        ("extended", str(manifest.path), None)]
    assert settled.entries[lockfile.EXTENDS].pin["provides"] == ["efa", "python"]
    assert not [c for c in resolver.calls if c[0] == "base"]
    again = Extending(revisit=True)
    locksettle.settle(manifest, settled.lock(), STAGES, again)  # type: ignore[arg-type]
    assert [c[2] for c in again.calls if c[0] == "extended"] == [settled.entries[lockfile.EXTENDS]]


class Upgrading(Recording):
    """lock --upgrade for `renew` (every stage when None), moving the versions in `moves`."""

    def __init__(self, renew: list[str] | None, moves: dict[str, str]) -> None:
        super().__init__()
        self.renew, self.moves = renew, moves
        self.asked_upgrades: list[list[str]] = []

    def renewed(self, manifest: object, names: object) -> list[str]:
        assert isinstance(manifest, Manifest)
        return list(names) if self.renew is None else self.renew  # type: ignore[call-overload]

    def upgrades(self, _manifest: object, _registry: object, names: object) -> list[object]:
        self.asked_upgrades.append(list(names))  # type: ignore[call-overload]
        return [upstream.Upgrade(stage=s, old="?", new=v, policy="~=1.0", source="listing")
                for s, v in self.moves.items()]


def test_an_upgrade_resolves_the_renewed_stages_anew_and_keeps_the_rest() -> None:
    manifest = _smddp("stages.efa.policy=~=1.14")
    first = locksettle.settle(manifest, None, STAGES, Recording())  # type: ignore[arg-type]
    resolver = Upgrading(["efa"], {"efa": "1.14.9"})
    settled = locksettle.settle(manifest, first.lock(), STAGES, resolver)  # type: ignore[arg-type]
    assert resolver.asked_upgrades == [["efa"]]
    assert settled.manifest.stages["efa"]["version"] == "1.14.9"
    assert settled.entries[("upgraded", "efa")] == entry(
        {"version": str(manifest.stages["efa"]["version"]), "policy": "~=1.14"},
        to="1.14.9", source="listing")
    assert ("upgraded", "efa") in settled.stale
    asked = [(k, w) for k, w, _ in resolver.calls]
    assert asked == [("source", "src-efa")]  # only the renewed stage's pin, asked anew
    assert all(old is None for _, _, old in resolver.calls)


def test_upgrading_every_stage_resolves_the_base_anew_too() -> None:
    manifest = _smddp()
    first = locksettle.settle(manifest, None, STAGES, Recording())  # type: ignore[arg-type]
    resolver = Upgrading(None, {})
    locksettle.settle(manifest, first.lock(), STAGES, resolver)  # type: ignore[arg-type]
    asked = [(k, w, old) for k, w, old in resolver.calls]
    assert ("base", str(manifest.image["base"]), None) in asked
    assert {w for k, w, _ in asked if k == "source"} == \
        {w for k, w, _ in first_calls(manifest) if k == "source"}


def first_calls(manifest: Manifest) -> list[tuple[str, str, lockfile.Entry | None]]:
    resolver = Recording()
    locksettle.settle(manifest, None, STAGES, resolver)  # type: ignore[arg-type]
    return resolver.calls


def test_an_nccl_pin_entry_without_evidence_still_applies() -> None:
    sample = load(SAMPLE, registry=STAGES)
    assert sample.stages["nccl"]["version"] == "auto"
    origin = {"pytorch_version": "1.10.2", "pytorch_commit": sample.stages["pytorch"]["commit"],
              "cuda": "11.3"}
    the_lock = lockfile.Lock(entries={NCCL_PIN: entry(origin, version="2.10.3",
                                                       commit=NCCL_COMMIT)})
    settled = locksettle.settle(sample, the_lock, STAGES)
    assert NCCL_PIN not in settled.stale
    assert (settled.manifest.stages["nccl"]["version"],
            settled.manifest.stages["nccl"]["commit"]) == ("2.10.3", NCCL_COMMIT)

"""Full-image artifacts as names in an engine's image store (cache/imagestore.py and the
artifact store's image entries), in process.

Stand-in: `docker` on PATH is a script that keeps an image store in a directory (one file per
name, holding the image's ID and size) and logs every command with its --context. The real
engine is exercised by tests/integration/test_uptodate_build.py; these run under mutation testing,
where each must answer in milliseconds."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from imageforge.cache.artifacts import ArtifactStore
from imageforge.cache.imagestore import ImageStore
from imageforge.errors import CacheError
from tests.oci_layout import key_of, oci_layout

STANDIN = '''#!{python} -IS
import sys
from pathlib import Path

STORE = Path({store!r})
args = sys.argv[1:]
context = "-"
if args[:1] == ["--context"]:
    context, args = args[1], args[2:]
with open(STORE.parent / "log", "a") as handle:
    handle.write(context + " " + " ".join(args) + "\\n")


def path(ref):
    return STORE / ref.replace("/", "_").replace(":", "@")


if args[:2] == ["image", "ls"]:
    prefix = args[args.index("--filter") + 1].removeprefix("reference=").split("*")[0]
    for item in sorted(STORE.iterdir()):
        ref = item.name.replace("_", "/").replace("@", ":")
        if ref.startswith(prefix):
            print(ref, item.read_text().split()[0])
    sys.exit(0)
if args[:2] == ["image", "inspect"]:
    code = 0
    for ref in args[4:]:
        if path(ref).exists():
            print(path(ref).read_text().strip())
        else:
            sys.stderr.write("Error: No such image: " + ref + "\\n")
            code = 1
    sys.exit(code)
if args[:2] == ["image", "rm"]:
    if not path(args[2]).exists():
        sys.stderr.write("Error: No such image: " + args[2] + "\\n")
        sys.exit(1)
    path(args[2]).unlink()
    sys.exit(0)
sys.exit(2)
'''


@dataclass
class Engine:
    root: Path

    @property
    def store(self) -> Path:
        return self.root / "images"

    def tag(self, ref: str, image_id: str, size: int = 100) -> None:
        (self.store / ref.replace("/", "_").replace(":", "@")).write_text(f"{image_id} {size}")

    def has(self, ref: str) -> bool:
        return (self.store / ref.replace("/", "_").replace(":", "@")).exists()

    def log(self) -> list[str]:
        path = self.root / "log"
        lines = path.read_text().splitlines() if path.exists() else []
        path.write_text("")
        return lines


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Engine:
    root = tmp_path / "engine"
    (root / "images").mkdir(parents=True)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "docker"
    script.write_text(STANDIN.format(python=sys.executable, store=str(root / "images")))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    # No engine on the socket: every question goes through the CLI, the stand-in.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-engine.sock'}")
    return Engine(root)


ID = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def stored(store: ArtifactStore, engine: Engine, stage: str = "efa",
           image_id: str = ID, size: int = 700) -> tuple[str, str]:
    key = key_of(stage)
    ref = store.image_ref(stage, key)
    engine.tag(ref, image_id, size)
    store.add_image(key=key, stage=stage, inputs={"v": 1}, ref=ref, digest=image_id,
                    size=size, build_seconds=1.234)
    return key, ref


def test_an_image_entry_is_its_name_and_digest_read_by_name(tmp_path: Path,
                                                            engine: Engine) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    key, ref = stored(store, engine)
    assert ref == f"imageforge-artifact/{store.namespace}/efa:{key[7:]}"
    entry = store.get(key)
    assert entry is not None
    assert (entry.image, entry.digest, entry.size, entry.build_seconds) == (ref, ID, 700, 1.23)
    assert entry.inputs == {"v": 1}
    assert entry.context == f"docker-image://{ref}"
    assert sorted(p.name for p in entry.path.iterdir()) == ["meta.json"]
    assert json.loads((entry.path / "meta.json").read_text())["image"] == ref
    assert store.verify(key) == entry
    assert list((tmp_path / "artifacts" / "tmp").iterdir()) == []


def test_the_engine_is_asked_once_for_every_image_entry(tmp_path: Path,
                                                        engine: Engine) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    efa, _ = stored(store, engine, "efa")
    python, _ = stored(store, engine, "python", OTHER)
    engine.log()
    assert store.verify(efa) is not None
    assert store.verify(python) is not None
    assert store.verify(efa) is not None
    assert engine.log() == [f"- image ls --no-trunc --filter reference=imageforge-artifact/"
                            f"{store.namespace}/*:* --format {{{{.Repository}}}}:{{{{.Tag}}}} "
                            "{{.ID}}"]


def test_a_name_pointing_at_other_content_is_discarded_and_untagged(
        tmp_path: Path, engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    key, ref = stored(store, engine)
    engine.tag(ref, OTHER)
    assert store.verify(key) is None
    assert store.get(key) is None
    err = capsys.readouterr().err
    assert f"cached artifact of efa ({key[:19]}) names other content (sha256:bbbbbbbbbbbb)" \
        in err
    assert "the stage will be rebuilt" in err
    assert not engine.has(ref)
    assert list((tmp_path / "artifacts" / "entries").iterdir()) == []


def test_a_name_gone_from_the_engine_is_discarded(tmp_path: Path, engine: Engine,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    key, ref = stored(store, engine)
    (engine.store / ref.replace("/", "_").replace(":", "@")).unlink()
    assert store.verify(key) is None
    assert store.get(key) is None
    assert "is gone from the image store" in capsys.readouterr().err


def test_a_store_without_an_image_store_does_not_see_image_entries_and_replaces_them(
        tmp_path: Path, engine: Engine) -> None:
    key, ref = stored(ArtifactStore(tmp_path / "artifacts"), engine)
    engine.log()
    blind = ArtifactStore(tmp_path / "artifacts", None)
    assert blind.get(key) is None
    assert blind.all_entries() == []
    entry = blind.add(key=key, stage="efa", inputs={}, layout=oci_layout(tmp_path / "l", [b"x"]),
                      build_seconds=0.0)
    assert entry.image is None
    assert blind.get(key) == entry
    assert (entry.path / "index.json").exists()
    # Its image stays where it is: this store does not reach that engine.
    assert engine.has(ref)
    assert engine.log() == []


def test_image_entries_of_another_context_are_asked_there(tmp_path: Path,
                                                          engine: Engine) -> None:
    store = ArtifactStore(tmp_path / "artifacts", ImageStore("second"))
    key, ref = stored(store, engine)
    engine.log()
    assert store.verify(key) is not None
    store.remove(key)
    assert engine.log() == [
        f"second image ls --no-trunc --filter reference=imageforge-artifact/{store.namespace}/"
        "*:* --format {{.Repository}}:{{.Tag}} {{.ID}}",
        f"second image rm {ref}"]
    assert not engine.has(ref)
    assert store.get(key) is None


def test_removing_a_layout_entry_asks_the_engine_nothing(tmp_path: Path,
                                                         engine: Engine) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    key = key_of("nccl")
    store.add(key=key, stage="nccl", inputs={}, layout=oci_layout(tmp_path / "l", [b"x"]),
              build_seconds=0.0)
    store.remove(key)
    assert store.get(key) is None
    assert engine.log() == []


def test_size_counts_image_entries_at_their_image_size(tmp_path: Path, engine: Engine) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    stored(store, engine, "efa", size=700)
    layout = oci_layout(tmp_path / "l", [b"x" * 50])
    blobs = sum(p.stat().st_size for p in (layout / "blobs" / "sha256").iterdir())
    store.add(key=key_of("nccl"), stage="nccl", inputs={}, layout=layout, build_seconds=0.0)
    assert store.size() == 700 + blobs


def test_prune_untags_the_images_of_the_entries_it_removes(tmp_path: Path,
                                                           engine: Engine) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    _, ref = stored(store, engine, "efa", size=700)
    removed = store.prune(max_size=0)
    assert [e.stage for e in removed] == ["efa"]
    assert not engine.has(ref)
    assert store.all_entries() == []


def test_a_verified_entry_stays_known_after_another_is_added(tmp_path: Path,
                                                             engine: Engine) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    efa, _ = stored(store, engine, "efa")
    assert store.verify(efa) is not None       # the engine's names are now read
    python, _ = stored(store, engine, "python", OTHER)
    engine.log()
    assert store.verify(python) is not None    # added by this store: known without asking
    assert engine.log() == []


def test_sizes_reads_id_and_size_of_each_name(engine: Engine) -> None:
    efa, python = "imageforge-artifact/n/efa:1", "imageforge-artifact/n/python:2"
    engine.tag(efa, ID, 11)
    engine.tag(python, OTHER, 22)
    engine.tag("imageforge-artifact/m/efa:1", OTHER, 33)   # another store's
    images = ImageStore()
    assert images.sizes([efa, python]) == {efa: (ID, 11), python: (OTHER, 22)}
    # One missing: the engine's lines would not line up with the names, so none is trusted.
    assert images.sizes([efa, "imageforge-artifact/n/gone:3"]) == {}
    assert images.sizes([]) == {}
    assert images.ids("n") == {efa: ID, python: OTHER}


def test_a_second_add_of_the_same_key_keeps_the_first(tmp_path: Path, engine: Engine) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    key, ref = stored(store, engine)
    again = store.add_image(key=key, stage="efa", inputs={}, ref=ref, digest=OTHER, size=1,
                            build_seconds=0.0)
    assert again.digest == ID
    assert list((tmp_path / "artifacts" / "tmp").iterdir()) == []


@pytest.mark.usefixtures("engine")
def test_a_key_that_is_no_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CacheError, match="is not a stage key"):
        ArtifactStore(tmp_path / "artifacts").add_image(
            key="sha256:xyz", stage="efa", inputs={}, ref="r", digest=ID, size=1,
            build_seconds=0.0)


def test_a_name_gone_from_the_engine_is_named_in_a_whole_warning(
        tmp_path: Path, engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    key, ref = stored(store, engine)
    (engine.store / ref.replace("/", "_").replace(":", "@")).unlink()
    capsys.readouterr()
    assert store.verify(key) is None
    assert capsys.readouterr().err == (
        f"imageforge: warning: cached artifact of efa ({key[:19]}) is gone from the image "
        "store; discarding it, the stage will be rebuilt.\n")


def test_a_name_this_store_untagged_is_not_trusted_from_its_memory(
        tmp_path: Path, engine: Engine) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    key, ref = stored(store, engine)
    assert store.verify(key) is not None     # the engine's names are now known
    store.remove(key)
    assert not engine.has(ref)
    # Another process records the same name again, but the engine no longer has it.
    ArtifactStore(tmp_path / "artifacts").add_image(key=key, stage="efa", inputs={}, ref=ref,
                                                    digest=ID, size=1, build_seconds=0.0)
    assert store.verify(key) is None
    assert store.get(key) is None


def test_size_adds_up_every_image_entry(tmp_path: Path, engine: Engine) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    stored(store, engine, "efa", size=700)
    stored(store, engine, "python", OTHER, size=300)
    stored(store, engine, "nccl", size=20)
    assert store.size() == 1020


@pytest.mark.parametrize("meta", ['{"image": 5}', '{"image": ["a"]}', '{"image": ""}',
                                  '["imageforge-artifact/x/efa:1"]', '"text"'])
def test_a_broken_record_in_the_way_is_replaced_without_asking_the_engine(
        tmp_path: Path, engine: Engine, meta: str) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    key = key_of("efa")
    broken = store.entry_root / key[7:]
    broken.mkdir(parents=True)
    (broken / "meta.json").write_text(meta)
    engine.log()
    entry = store.add(key=key, stage="efa", inputs={}, layout=oci_layout(tmp_path / "l", [b"x"]),
                      build_seconds=0.0)
    assert store.get(key) == entry
    assert entry.image is None
    assert engine.log() == []

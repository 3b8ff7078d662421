"""Files imageforge wrote earlier are input too: a lock, an artifact's meta.json, a verified
rebuild's record, a test record, an up-to-date build's record and the invoke config. Each is
fed mutated copies of the real thing (a value replaced by a hostile one of any type, a key
deleted, the whole document replaced). The property: never an exception other than imageforge's
own (FatalError, one documented exit code), never an unescaped control character in a message,
and a mutated lock that is accepted renders a Dockerfile of the same instructions as the
committed lock (a lock can change a pin, never add a step)."""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imageforge import uptodate
from imageforge.app import project
from imageforge.app.options import CONFIG_DEFAULTS
from imageforge.app.workspace import Workspace
from imageforge.cache import verified
from imageforge.cache.artifacts import ArtifactStore, key_hex
from imageforge.errors import FatalError
from imageforge.image import checkreport
from stages import STAGES
from tests.dockerfile_shape import parse

ROOT = Path(__file__).resolve().parents[2]
TORCH = ROOT / "manifests" / "real-torch211.toml"
TARGET = "training"
KEY = "sha256:" + "ab" * 32
DIGEST = "sha256:" + "cd" * 32
# Exit codes the README documents (0 included: a mutation may be harmless).
DOCUMENTED = {0, *range(1, 14), 130}

HOSTILE: st.SearchStrategy[Any] = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["1.0; curl x | sh", "$(id)", "a\nRUN evil", "\x1b[2J", "sha256:nothex",
                     "../../etc/passwd", "x\x00y", "", "-rf", "2.28.9\r\nRUN x", "/dev/zero"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def node_paths(doc: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON document a value sits: dict keys and list indices."""
    children: Any = (doc.items() if isinstance(doc, dict) else
                     enumerate(doc) if isinstance(doc, list) else ())
    for key, value in children:
        yield (*at, key)
        yield from node_paths(value, (*at, key))


@st.composite
def mutated(draw: st.DrawFn, original: Any, places: list[tuple[Any, ...]]) -> Any:
    """`original` with one to three of its values replaced or deleted, or replaced whole."""
    if draw(st.integers(0, 19)) == 0:
        return draw(HOSTILE)
    doc = copy.deepcopy(original)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(places))
        parent = doc
        try:
            for part in path[:-1]:
                parent = parent[part]
            if draw(st.booleans()) and isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent[path[-1]] = draw(HOSTILE)
        except (KeyError, IndexError, TypeError):
            continue   # an earlier mutation of this example removed the place
    return doc


def clean(message: str) -> None:
    """A message shows file content escaped: no terminal control, no NUL, no carriage return."""
    assert not any(c in message for c in "\x1b\x00\r\x07"), repr(message)


# ---- the lock -------------------------------------------------------------------------------

LOCK = json.loads(TORCH.with_name(TORCH.stem + ".lock.json").read_text())
LOCK_PLACES = list(node_paths(LOCK))
COUNTER = itertools.count()


def instructions(text: str) -> list[str]:
    return [ins.keyword for ins in parse(text)]


def planned_dockerfile(folder: Path, lock: Any) -> str:
    """The training image's Dockerfile planned --locked from `lock` beside the manifest."""
    folder.mkdir(parents=True)
    manifest = folder / TORCH.name
    manifest.write_text(TORCH.read_text())
    (folder / f"{TORCH.stem}.lock.json").write_text(json.dumps(lock))
    chosen = Workspace(registry=STAGES, manifest=manifest, cache_dir=folder / "cache",
                              locked=True)
    return project.dockerfile(project.plan(chosen, TARGET))


@pytest.fixture(scope="module")
def lock_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("locks")


@pytest.fixture(scope="module")
def baseline(lock_root: Path) -> list[str]:
    return instructions(planned_dockerfile(lock_root / "committed", LOCK))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lock=mutated(LOCK, LOCK_PLACES))
def test_a_mutated_lock_is_refused_or_renders_the_same_steps(lock: Any, lock_root: Path,
                                                             baseline: list[str]) -> None:
    try:
        text = planned_dockerfile(lock_root / str(next(COUNTER)), lock)
    except FatalError as exc:
        refused: FatalError | None = exc
    else:
        refused = None
    if refused is not None:
        assert refused.return_code in DOCUMENTED
        clean(str(refused))
        return
    assert instructions(text) == baseline
    assert "\r" not in text
    assert "\x00" not in text


# ---- the artifact store's meta.json -----------------------------------------------------------

META = {"key": KEY, "stage": "nccl", "inputs": {"version": "2.28.9"}, "size": 10,
        "digest": DIGEST, "build_seconds": 1.5, "created": 1.0, "last_used": 2.0, "hits": 1,
        "image": None}


@settings(max_examples=150, deadline=None)
@given(meta=mutated(META, list(node_paths(META))))
def test_a_mutated_meta_json_is_an_entry_of_its_shape_or_ignored(
        meta: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("store")
    entry = root / "entries" / key_hex(KEY)
    entry.mkdir(parents=True)
    (entry / "meta.json").write_text(json.dumps(meta))
    store = ArtifactStore(root, None)
    found = store.get(KEY)
    assert store.all_entries() == ([] if found is None else [found])
    if found is not None:
        assert found.key == KEY
        assert isinstance(found.size, int)
        assert isinstance(found.inputs, dict)
        assert store.size() >= 0


def test_a_meta_json_that_is_a_link_to_dev_zero_is_ignored_unread(tmp_path: Path) -> None:
    entry = tmp_path / "entries" / key_hex(KEY)
    entry.mkdir(parents=True)
    (entry / "meta.json").symlink_to("/dev/zero")
    assert ArtifactStore(tmp_path, None).get(KEY) is None


# ---- a verified rebuild's record ------------------------------------------------------------

VERIFIED = {"key": KEY, "stage": "nccl", "digest": DIGEST,
            "remotes": {"127.0.0.1:5000/cache": DIGEST}, "verified_at": 1.0}


@settings(max_examples=100, deadline=None)
@given(record=mutated(VERIFIED, list(node_paths(VERIFIED))))
def test_a_mutated_verified_record_proves_nothing_it_does_not_say(
        record: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    cache = tmp_path_factory.mktemp("cache")
    path = cache / "artifacts" / "verified" / f"{key_hex(KEY)}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    digest = verified.verified_remote_digest(cache, KEY, "127.0.0.1:5000/cache")
    assert digest is None or digest == record["remotes"]["127.0.0.1:5000/cache"]
    # A new verification writes over whatever was there, and reads back.
    verified.record(cache, key=KEY, stage="nccl", digest=DIGEST, remote="r/c",
                    remote_digest=DIGEST)
    assert verified.verified_remote_digest(cache, KEY, "r/c") == DIGEST


# ---- a test record --------------------------------------------------------------------------

TESTED = {"digest": DIGEST, "passed": True, "target": "training", "checks": [
    {"name": "nccl present", "passed": True, "output": ""}]}


@settings(max_examples=100, deadline=None)
@given(record=mutated(TESTED, list(node_paths(TESTED))))
def test_a_mutated_test_record_passes_only_when_it_says_so(
        record: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    cache = tmp_path_factory.mktemp("cache")
    path = checkreport.record_path(cache, DIGEST)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    found = checkreport.passed_record(cache, DIGEST)
    assert found is None or (found["passed"] is True and found["digest"] == DIGEST)


# ---- an up-to-date build's record -----------------------------------------------------------

ARGV = ["build", "--target", "smddp"]


def uptodate_record(folder: Path) -> dict[str, Any]:
    """A record as `remember` writes one, of files that exist and are unchanged."""
    manifest = folder / "sample.toml"
    manifest.write_text("[image]\n")
    (folder / "cache" / "artifacts").mkdir(parents=True)
    info = manifest.stat()
    return {"version": uptodate.VERSION,
            "files": [[str(manifest), [info.st_size, info.st_mtime_ns, info.st_ino]]],
            "dirs": [], "images": {}, "entries": [], "cache_dir": str(folder / "cache"),
            "report": {"target": "smddp", "image_digest": None, "stages": []},
            "stdout": "nothing rebuilt"}


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_mutated_up_to_date_record_answers_or_sends_to_the_full_build(
        data: st.DataObject, tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("uptodate")
    original = uptodate_record(folder)
    record = data.draw(mutated(original, list(node_paths(original))))
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(folder / "xdg")
    # In the example's folder: a record that named a relative cache directory wrote its
    # report under the working directory, the checkout.
    here = Path.cwd()
    os.chdir(folder)
    try:
        uptodate.records_dir().mkdir(parents=True)
        (uptodate.records_dir() / f"{uptodate.record_name(ARGV)}.json").write_text(
            json.dumps(record))
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            answered = uptodate.answer(ARGV)
    finally:
        os.chdir(here)
        if saved is None:
            os.environ.pop("XDG_CACHE_HOME")
        else:
            os.environ["XDG_CACHE_HOME"] = saved
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["cache", "sample.toml", "xdg"])
    if answered:
        assert isinstance(record, dict)
        (report,) = Path(record["cache_dir"], "reports").glob("*.json")
        assert report.name.endswith(f"-{record['report']['target']}.json")
        clean(printed.getvalue())
    else:
        assert printed.getvalue() == ""


# ---- the invoke config ----------------------------------------------------------------------

# Relative text only: a value may become the cache directory, made under the test's folder.
CONFIG_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["a", "cache_dir"]), st.integers(), max_size=2),
    st.text(st.characters(blacklist_characters="/", blacklist_categories=["Cs"]), max_size=12),
    st.sampled_from(["ftp://x", "http://user:secret@127.0.0.1:1/cache", "image-store",
                     "verified", "oci-layout", "\x1b[2J", "a\nb"]),
)


@settings(max_examples=12, deadline=None)
@given(table=st.dictionaries(st.sampled_from([*sorted(CONFIG_DEFAULTS), "cachedir"]),
                             CONFIG_VALUE, min_size=1, max_size=3))
def test_a_hostile_invoke_config_is_one_sentence_never_a_traceback(
        table: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("config")
    config = folder / "invoke.yaml"
    config.write_text(yaml.safe_dump({"imageforge": table}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_IMAGEFORGE_")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "-f", str(config), "plan",
         "--target", "nccl", "--manifest", str(ROOT / "manifests" / "sample.toml")],
        cwd=folder, capture_output=True, text=True, env=env, check=False, timeout=120)
    assert result.returncode in DOCUMENTED, result.stderr
    assert "Traceback" not in result.stderr
    assert "secret" not in result.stdout + result.stderr
    clean(result.stderr)
    if result.returncode != 0:
        assert result.stdout == ""
        assert result.stderr.splitlines()[-1].startswith("imageforge: error: ")

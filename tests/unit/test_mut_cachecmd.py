"""cache.ls / cache.prune by hand (imageforge/app/cachecmd.py), in process: the sizes and ages the
flags accept, how sizes and ages are shown, and what prune removes and reports, on a real
artifact store holding real OCI layouts (only their bytes are made up)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from imageforge.app import cachecmd, project
from imageforge.app.workspace import Workspace
from imageforge.cache.artifacts import ArtifactStore, Entry
from imageforge.errors import UsageError
from stages import STAGES
from tests.oci_layout import key_of, oci_layout


def _add(settings: Workspace, name: str, stage: str, *, age: float,
         layer_bytes: int = 4096) -> Entry:
    """An entry of `stage` last used and created `age` seconds ago."""
    store = settings.store
    entry = store.add(key=key_of(name), stage=stage, inputs={"name": name}, build_seconds=1.0,
                      layout=oci_layout(settings.cache_dir.parent / "layouts" / name,
                                        [os.urandom(layer_bytes)]))
    meta_path = entry.path / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["last_used"] = meta["created"] = time.time() - age
    meta_path.write_text(json.dumps(meta))
    found = store.get(entry.key)
    assert found is not None
    return found


@pytest.fixture
def settings(tmp_path: Path) -> Workspace:
    return Workspace(registry=STAGES, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize(("text", "size"), [
    ("100", 100), ("100B", 100), ("1K", 1024), ("1.5K", 1536), ("2kb", 2048),
    ("500M", 500 << 20), (" 20G ", 20 << 30), ("3 g", 3 << 30), ("1T", 1 << 40),
    ("0.5M", 1 << 19),
])
def test_parse_size_reads_binary_units_in_any_case(text: str, size: int) -> None:
    assert cachecmd.parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "", "M", "5X", "-1G", "1GG", "1.G"])
def test_parse_size_refuses_what_is_not_a_size_naming_the_flag(text: str) -> None:
    with pytest.raises(UsageError) as info:
        cachecmd.parse_size(text)
    assert str(info.value) == f"--max-size {text}: expected a size like 500M or 20G."


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30.0), ("1.5m", 90.0), ("12h", 43200.0), (" 3H ", 10800.0), ("7d", 604800.0),
    ("2w", 1209600.0), ("2 D", 172800.0),
])
def test_parse_age_reads_seconds_to_weeks_in_any_case(text: str, seconds: float) -> None:
    assert cachecmd.parse_age(text) == seconds


@pytest.mark.parametrize("text", ["soon", "", "7", "d", "7y", "-1d"])
def test_parse_age_refuses_what_is_not_an_age_naming_the_flag(text: str) -> None:
    with pytest.raises(UsageError) as info:
        cachecmd.parse_age(text)
    assert str(info.value) == f"--older-than {text}: expected an age like 12h or 7d."


@pytest.mark.parametrize(("size", "shown"), [
    (0, "0B"), (1023, "1023B"), (1024, "1.0K"), (1536, "1.5K"), ((1 << 20) - 1, "1024.0K"),
    (1 << 20, "1.0M"), (5 << 20, "5.0M"), (3 << 30, "3.0G"), (1 << 40, "1.0T"),
    (2.5 * (1 << 40), "2.5T"),
])
def test_human_size_uses_the_largest_unit_under_1024(size: float, shown: str) -> None:
    assert cachecmd.human_size(size) == shown


@pytest.mark.parametrize(("seconds", "shown"), [
    (0, "0s"), (59, "59s"), (60, "1m"), (150, "2m"), (3599, "60m"), (3600, "1h"),
    (7200, "2h"), (86399, "24h"), (86400, "1d"), (30 * 86400, "30d"),
])
def test_human_age_uses_the_largest_unit_reached(seconds: float, shown: str) -> None:
    assert cachecmd.human_age(seconds) == shown


def test_prune_needs_a_size_or_an_age(settings: Workspace) -> None:
    with pytest.raises(UsageError) as info:
        cachecmd.prune(settings, max_size=None, older_than=None, keep_last=0)
    assert str(info.value) == "cache.prune needs --max-size and/or --older-than."


def test_prune_by_age_removes_only_older_entries_and_reports_each(
        settings: Workspace) -> None:
    old = _add(settings, "old", "nccl", age=3 * 86400)
    new = _add(settings, "new", "nccl", age=3600)
    out = cachecmd.prune(settings, max_size=None, older_than="2d", keep_last=0)
    store = settings.store
    assert store.get(old.key) is None
    assert store.get(new.key) is not None
    lines = out.splitlines()
    assert lines[0] == f"removed nccl {old.key[:19]} ({cachecmd.human_size(old.size)})"
    assert lines[1] == f"1 removed; {cachecmd.human_size(store.size())} left"
    assert len(lines) == 2


def test_prune_by_size_removes_the_least_recently_used_first(
        settings: Workspace) -> None:
    entries = [_add(settings, f"e{i}", "efa", age=1000 - i, layer_bytes=64 << 10)
               for i in range(3)]
    store = settings.store
    one = store.size([entries[2]])
    out = cachecmd.prune(settings, max_size=str(one + 100), older_than=None, keep_last=0)
    assert [e.key for e in store.all_entries()] == [entries[2].key]
    assert out.splitlines()[-1] == f"2 removed; {cachecmd.human_size(store.size())} left"
    assert [line.split()[2] for line in out.splitlines()[:-1]] == \
        [entries[0].key[:19], entries[1].key[:19]]


def test_prune_keep_last_protects_the_newest_of_each_stage(
        settings: Workspace) -> None:
    a_old = _add(settings, "a-old", "nccl", age=9 * 86400)
    a_new = _add(settings, "a-new", "nccl", age=8 * 86400)
    b_only = _add(settings, "b-only", "efa", age=9 * 86400)
    cachecmd.prune(settings, max_size=None, older_than="1d", keep_last=1)
    left = {e.key for e in settings.store.all_entries()}
    assert left == {a_new.key, b_only.key}
    assert a_old.key not in left
    # keep_last 0 means no protection at all
    out = cachecmd.prune(settings, max_size=None, older_than="1d", keep_last=0)
    assert settings.store.all_entries() == []
    assert out.splitlines()[-1].startswith("2 removed; ")


def test_list_entries_table_sorts_by_stage_then_most_recent(
        settings: Workspace) -> None:
    b = _add(settings, "b", "nccl", age=7200)
    a_old = _add(settings, "a-old", "efa", age=2 * 86400)
    a_new = _add(settings, "a-new", "efa", age=120)
    lines = cachecmd.list_entries(settings).splitlines()
    assert lines[0] == f"{'stage':<18} {'key':<19} {'size':>8} {'age':>6} {'used':>6} {'hits':>5}"
    assert [line.split()[1] for line in lines[1:4]] == [a_new.key[:19], a_old.key[:19],
                                                        b.key[:19]]
    assert lines[1].split() == ["efa", a_new.key[:19], cachecmd.human_size(a_new.size),
                                "2m", "2m", "0"]
    assert lines[2].split()[3:5] == ["2d", "2d"]
    store = ArtifactStore(settings.cache_dir / "artifacts")
    assert lines[4] == (f"3 artifacts, {cachecmd.human_size(store.size())} on disk in "
                        f"{store.root}")
    assert len(lines) == 5


def test_list_entries_json_is_every_entrys_meta(settings: Workspace) -> None:
    b = _add(settings, "b", "nccl", age=10)
    a = _add(settings, "a", "efa", age=20)
    data = json.loads(cachecmd.list_entries(settings, as_json=True))
    assert data == [a.meta(), b.meta()]


def test_differences_name_each_changed_input_with_unset_for_missing() -> None:
    old = {"version": "1.0", "sha256": "aa", "same": 1, "gone": "x"}
    new = {"version": "1.1", "sha256": "aa", "same": 1, "added": None, "fresh": "y"}
    assert cachecmd._differences(old, new) == [
        "fresh (unset) -> y", "gone x -> (unset)", "version 1.0 -> 1.1"]
    assert cachecmd._differences(new, new) == []


def test_list_entries_json_is_indented_by_two(settings: Workspace) -> None:
    entry = _add(settings, "b", "nccl", age=10)
    assert cachecmd.list_entries(settings, as_json=True) == json.dumps([entry.meta()], indent=2)


EFA_NCCL = Path(__file__).resolve().parents[2] / "manifests/efa-nccl.toml"


def _last(settings: Workspace, name: str, record: dict[str, object]) -> None:
    last = settings.cache_dir / "artifacts" / "last"
    last.mkdir(parents=True, exist_ok=True)
    (last / f"{name}.json").write_text(json.dumps(record))


def test_explain_gives_each_rebuild_its_reason(tmp_path: Path) -> None:
    settings = Workspace(registry=STAGES, manifest=EFA_NCCL, cache_dir=tmp_path / "cache")
    plan = project.plan(settings, "efa-nccl")
    order = [s.name for s in plan.stages]
    assert order == ["base", "efa", "nccl", "aws-ofi-nccl", "nccl-tests", "efa-nccl"]

    def record(name: str, **changes: object) -> dict[str, object]:
        stage = plan.stage(name)
        return {"inputs": dict(stage.inputs), "deps": {d: plan.stage(d).key for d in stage.deps},
                "recipe": stage.recipe, "key": stage.key, **changes}

    efa_inputs = {**plan.stage("efa").inputs, "version": "0.9", "gone": "x"}
    efa_inputs.pop("url")
    _last(settings, "efa", record("efa", inputs=efa_inputs))
    nccl = record("nccl")
    del nccl["deps"]  # written before deps were recorded: every dependency counts as changed
    _last(settings, "nccl", nccl)
    _last(settings, "aws-ofi-nccl", record("aws-ofi-nccl", recipe="RUN old"))
    _last(settings, "nccl-tests", record("nccl-tests"))
    _last(settings, "efa-nccl", record("efa-nccl", key="sha256:other"))
    efa = plan.stage("efa").inputs
    assert cachecmd.explain(settings, "efa-nccl").splitlines() == [
        "base: never built with this cache",
        f"efa: gone x -> (unset); url (unset) -> {efa['url']}; version 0.9 -> {efa['version']}",
        "nccl: dependency base changed",
        "aws-ofi-nccl: its recipe (stage code) changed",
        "nccl-tests: built before, but its artifact is no longer cached",
        "efa-nccl: base image or platform changed",
    ]


def test_explain_with_everything_cached_says_so(tmp_path: Path) -> None:
    settings = Workspace(registry=STAGES, manifest=EFA_NCCL, cache_dir=tmp_path / "cache")
    store = settings.store
    for i, stage in enumerate(project.plan(settings, "efa-nccl").stages):
        store.add(key=stage.key, stage=stage.name, inputs=dict(stage.inputs), build_seconds=1,
                  layout=oci_layout(tmp_path / "layouts" / str(i), [os.urandom(64)]))
    assert cachecmd.explain(settings, "efa-nccl") == \
        "efa-nccl: nothing to build; every stage needed is cached"


def test_push_and_pull_need_a_remote(settings: Workspace) -> None:
    with pytest.raises(UsageError) as info:
        cachecmd.push(settings, None)
    assert str(info.value) == "cache.push needs --remote (or imageforge.remote in invoke.yaml)."
    with pytest.raises(UsageError) as info:
        cachecmd.pull(settings, "efa-nccl")
    assert str(info.value) == "cache.pull needs --remote (or imageforge.remote in invoke.yaml)."


def test_explain_takes_a_record_whose_deps_are_not_a_table_as_no_record(tmp_path: Path) -> None:
    settings = Workspace(registry=STAGES, manifest=EFA_NCCL, cache_dir=tmp_path / "cache")
    plan = project.plan(settings, "nccl")
    nccl = plan.stage("nccl")
    _last(settings, "nccl", {"inputs": dict(nccl.inputs), "deps": [plan.stage("base").key],
                             "recipe": nccl.recipe, "key": "sha256:other"})
    assert cachecmd.explain(settings, "nccl").splitlines() == [
        "base: never built with this cache", "nccl: never built with this cache"]


def test_differences_show_each_value_cut_at_400_characters() -> None:
    long, whole = "x" * 401, "y" * 400
    assert cachecmd._differences({"v": long, "w": whole}, {"v": "1", "w": "2"}) == [
        f"v {'x' * 400}\N{HORIZONTAL ELLIPSIS} -> 1", f"w {whole} -> 2"]

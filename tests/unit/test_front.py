"""imageforge/front.py, the module tasks.py calls: which value wins (a flag, else invoke's
configuration: invoke.yaml, then INVOKE_IMAGEFORGE_* variables over it, else the default),
and every flag's validation, one sentence each. Real invoke configuration objects, built the
way `invoke` builds them for tasks.py."""

from __future__ import annotations

import dataclasses
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from invoke.config import Config
from invoke.context import Context

import tasks
from imageforge import front
from imageforge.app import options, outputs
from imageforge.app.workspace import DEFAULT_MANIFEST
from imageforge.errors import ManifestError, UsageError
from imageforge.sources.mirror import Rewrite
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_configuration_from_this_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("INVOKE_IMAGEFORGE_")]:
        monkeypatch.delenv(name)


def configured(tmp_path: Path, yaml: str | None = None) -> options.Config:
    """tasks.py's configuration: its collection's defaults, the project's invoke.yaml, then
    the INVOKE_* variables of the environment, as `invoke` loads them."""
    if yaml is not None:
        (tmp_path / "invoke.yaml").write_text(yaml)
    config = Config(project_location=tmp_path)
    config.load_collection(tasks.ns.configuration())
    config.load_project()
    config.load_shell_env()
    return tasks.config(Context(config))


def test_without_flags_or_configuration_the_defaults_hold(tmp_path: Path) -> None:
    s = options.workspace(configured(tmp_path))
    assert s.manifest == DEFAULT_MANIFEST
    assert s.cache_dir == Path("cache")
    assert (s.remote, s.layer_cache, s.mirror, s.locked) == (None, None, None, False)
    assert (s.overrides, s.rewrites) == ((), ())
    assert dict(s.registry) == STAGES


YAML = """\
imageforge:
  manifest: from-yaml.toml
  cache_dir: yaml-cache
  remote: yaml.example/cache
  layer_cache: yaml.example/layers
  rewrite:
    - {prefix: "https://a.example/", replace: "https://b.example/"}
"""


def test_invoke_yaml_beats_the_defaults(tmp_path: Path) -> None:
    s = options.workspace(configured(tmp_path, YAML))
    assert s.manifest == Path("from-yaml.toml")
    assert s.cache_dir == Path("yaml-cache")
    assert s.remote == "yaml.example/cache"
    assert s.rewrites == (Rewrite(prefix="https://a.example/", replace="https://b.example/"),)
    # Only a build keeps BuildKit's layer cache: other commands never read the setting.
    assert s.layer_cache is None
    assert options.workspace(configured(tmp_path, YAML), layer_cache=True).layer_cache == (
        "yaml.example/layers")


def test_the_environment_beats_invoke_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    monkeypatch.setenv("INVOKE_IMAGEFORGE_REMOTE", "env.example/cache")
    monkeypatch.setenv("INVOKE_IMAGEFORGE_MANIFEST", "from-env.toml")
    s = options.workspace(configured(tmp_path, YAML))
    assert (s.remote, s.manifest) == ("env.example/cache", Path("from-env.toml"))
    assert s.cache_dir == Path("yaml-cache")


def test_flags_beat_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVOKE_IMAGEFORGE_REMOTE", "env.example/cache")
    flags = options.Flags(manifest="flag.toml", overrides=["image.python=3.11"], locked=True,
                        remote="flag.example/cache", mirror="/mirror",
                        layer_cache="flag.example/layers")
    s = options.workspace(configured(tmp_path, YAML), flags, layer_cache=True)
    assert s.manifest == Path("flag.toml")
    assert s.overrides == ("image.python=3.11",)
    assert (s.locked, s.mirror) == (True, "/mirror")
    assert (s.remote, s.layer_cache) == ("flag.example/cache", "flag.example/layers")


def test_an_empty_setting_is_not_set(tmp_path: Path) -> None:
    config = configured(tmp_path, "imageforge:\n  remote: ''\n  manifest: ''\n")
    s = options.workspace(config)
    assert (s.remote, s.manifest) == (None, DEFAULT_MANIFEST)
    assert options.pick(None, config, "remote") is None
    assert options.pick("", config, "remote") is None


def test_nightly_reads_repository_and_webhook_then_the_environment() -> None:
    table = {"repository": "cfg.example/training", "webhook": ""}
    config = options.Config(table=table, discover=lambda _dirs: STAGES,
                            environ={"IMAGEFORGE_WEBHOOK_URL": "https://hooks.example/env"})
    nightly = front.nightly_options(config, front.NightlyRequest(size_budget="1.5"))
    assert nightly.repository == "cfg.example/training"
    assert nightly.webhook == "https://hooks.example/env"
    assert nightly.size_budget == 1.5
    flagged = front.nightly_options(config, front.NightlyRequest(
        repository="flag.example/training", webhook="https://hooks.example/flag"))
    assert (flagged.repository, flagged.webhook) == ("flag.example/training",
                                                     "https://hooks.example/flag")
    quiet = dataclasses.replace(config, environ={})
    assert front.nightly_options(quiet, front.NightlyRequest()).webhook is None


def test_stage_dirs_a_list_or_a_path_like_string(tmp_path: Path) -> None:
    assert options.stage_dirs("") == ()
    assert options.stage_dirs(f"a{os.pathsep}{os.pathsep}b") == (Path("a"), Path("b"))
    assert options.stage_dirs(["a", "b"]) == (Path("a"), Path("b"))
    with pytest.raises(UsageError) as caught:
        options.workspace(configured(tmp_path, "imageforge:\n  stage_dirs: 3\n"))
    assert str(caught.value) == ("imageforge.stage_dirs = 3: give a directory or a list of "
                                 "directories of stage modules.")
    team = tmp_path / "team"
    team.mkdir()
    s = options.workspace(configured(tmp_path, f"imageforge:\n  stage_dirs: [{team}]\n"))
    assert dict(s.registry) == STAGES


def test_a_bad_rewrite_setting_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"^imageforge\.rewrite in the invoke config"):
        options.workspace(configured(tmp_path, "imageforge:\n  rewrite: 3\n"))


# ---- the user's code: data on the stage, not a name in the front end ------------------------

def test_code_and_program_become_overrides_after_the_sets(tmp_path: Path) -> None:
    flags = options.Flags(overrides=["image.python=3.11"], code=str(tmp_path), program="train.py")
    s = options.workspace(configured(tmp_path), flags)
    taker = options.code_stage(STAGES)
    assert taker.takes_code
    assert s.overrides == ("image.python=3.11", f"stages.{taker.name}.dir={tmp_path.resolve()}",
                           f"stages.{taker.name}.program=train.py")


def test_the_stage_that_takes_the_code_is_whichever_says_so(tmp_path: Path) -> None:
    mine = dataclasses.replace(STAGES["efa-nccl"], name="my-training", parent="efa-nccl",
                               deps=("efa-nccl",), image=True, takes_code=True)
    registry = {name: dataclasses.replace(stage, takes_code=False)
                for name, stage in STAGES.items()} | {"my-training": mine}
    overrides, target = options.code_overrides(str(tmp_path), "t.py", "efa-nccl", registry)
    assert overrides == [f"stages.my-training.dir={tmp_path.resolve()}",
                         "stages.my-training.program=t.py"]
    assert target == "my-training"
    assert options.code_overrides(str(tmp_path), "t.py", None, registry)[1] == "my-training"
    # Any other target stays: the code's table is set, the target built as asked.
    assert options.code_overrides(str(tmp_path), "t.py", "smddp", registry)[1] == "smddp"
    with pytest.raises(UsageError, match="no stage takes training code"):
        options.code_overrides(str(tmp_path), "t.py", None,
                             {k: v for k, v in registry.items() if k != "my-training"})


def test_code_without_program_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    broken = configured(tmp_path / "broken", "imageforge:\n  stage_dirs: 3\n")
    with pytest.raises(UsageError, match="--code and --program go together"):
        list(front.build(broken, options.Flags(code=str(tmp_path)), front.BuildRequest()))
    with pytest.raises(UsageError, match="--code and --program go together"):
        options.workspace(configured(tmp_path), options.Flags(program="train.py"))


# ---- validation: the sentences the flags always gave -------------------------------------------

@pytest.mark.parametrize(("value", "minimum"), [("0", 1), ("-1", 0), ("x", 1), ("1.5", 1)])
def test_whole_numbers(value: str, minimum: int) -> None:
    with pytest.raises(UsageError) as caught:
        options.whole_number("hosts", value, minimum=minimum)
    assert str(caught.value) == f"--hosts {value}: give a whole number of at least {minimum}."
    assert options.whole_number("hosts", "3", minimum=1) == 3


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "x"])
def test_ratios(value: str) -> None:
    with pytest.raises(UsageError) as caught:
        options.ratio("size-budget", value)
    assert str(caught.value) == f"--size-budget {value}: give a number above 0, e.g. 1.2."
    assert options.ratio("size-budget", "1.2") == 1.2


def test_choices() -> None:
    assert options.bench_engine("host") == "host"
    with pytest.raises(UsageError) as caught:
        options.bench_engine("cloud")
    assert str(caught.value) == ("--engine 'cloud': use `own` (the benchmark's own Docker "
                                 "engine) or `host`.")
    assert front.bench_choices(repeats="2", sizes="10, ,20", engine="own") == front.BenchChoices(
        repeats=2, sizes=(10, 20), engine="own")
    with pytest.raises(UsageError, match=r"^--sizes 0: give a whole number of at least 1\.$"):
        front.bench_choices(repeats="2", sizes="10,0", engine="own")
    assert [options.progress_mode(m) for m in ("auto", "plain", "json", "tty")] == [
        "auto", "plain", "json", "tty"]
    with pytest.raises(UsageError) as caught:
        options.progress_mode("fancy")
    assert str(caught.value) == "--progress fancy: use auto, plain or json."
    assert options.ci_format("gitlab") == "gitlab"
    with pytest.raises(UsageError) as caught:
        options.ci_format("jenkins")
    assert str(caught.value) == "--format jenkins: use github or gitlab."


def test_commands_refuse_missing_or_clashing_flags(tmp_path: Path) -> None:
    config = configured(tmp_path)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: front.render(config, options.Flags(), None, "svg", None),
         "--format svg: unknown format; use dockerfile or bake."),
        (lambda: front.mirror_sync(config, options.Flags(), None),
         "mirror.sync needs --to DIR: the directory to write the mirror into."),
        (lambda: front.matrix_plan(config, None),
         "matrix.plan needs --file: the matrix file ([[image]] tables)."),
        (lambda: list(front.matrix_build(config, "", test=True, progress="auto", report=None)),
         "matrix.build needs --file: the matrix file ([[image]] tables)."),
        (lambda: list(front.matrix_build(config, "m.toml", test=True, progress="x",
                                         report=None)),
         "--progress x: use auto, plain or json."),
        (lambda: front.promote(config, None, "golden"),
         "promote needs --image REPOSITORY@sha256:<digest>: the tested image to point the tag "
         "at."),
        (lambda: list(front.nightly(config, options.Flags(manifest="m.toml"),
                                    front.NightlyRequest(matrix="images.toml"))),
         "nightly --matrix: the matrix file names each image's manifest, --set overrides, "
         "target and tag; drop --manifest, --set, --target and --tag-template."),
        (lambda: list(front.nightly(config, options.Flags(), front.NightlyRequest(
            size_budget="0"))),
         "--size-budget 0: give a number above 0, e.g. 1.2."),
        (lambda: front.ci_generate(config, options.Flags(), fmt="github", file=None, target=None,
                                   out=None, as_json=False),
         "ci.generate needs --remote REPOSITORY (or imageforge.remote): the registry cache "
         "through which the jobs hand artifacts on."),
        (lambda: front.ci_generate(config, options.Flags(remote="r.example/c", overrides=["a=b"]),
                                   fmt="github", file="images.toml", target=None, out=None,
                                   as_json=False),
         "ci.generate: --file lists the images; --manifest, --set and --target go in its "
         "[[image]] tables instead."),
        (lambda: list(front.build(config, options.Flags(), front.BuildRequest(progress="x"))),
         "--progress x: use auto, plain or json."),
        (lambda: list(front.test_image(config, options.Flags(), front.CheckRequest(
            target="nccl"))),
         "--target nccl is not an image; test-image checks image targets: "
         f"{', '.join(n for n, s in STAGES.items() if s.image)}."),
    ]
    for call, message in cases:
        with pytest.raises(UsageError) as caught:
            call()
        assert str(caught.value) == message


def test_an_unwritable_output_names_its_flag(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        outputs.write_output("--out", str(tmp_path / "no" / "such.yml"), "x")
    assert str(caught.value).startswith(f"--out {tmp_path / 'no' / 'such.yml'}: cannot write it")
    written = tmp_path / "summary.md"
    outputs.write_output("--summary", str(written), "a", append=True)
    outputs.write_output("--summary", str(written), "b", append=True)
    assert written.read_text() == "ab"


def test_matrix_plan_shares_what_two_images_have_in_common(tmp_path: Path) -> None:
    matrix = tmp_path / "images.toml"
    manifest = ROOT / "manifests" / "efa-nccl.toml"
    matrix.write_text(f'[[image]]\nmanifest = "{manifest}"\n\n'
                      f'[[image]]\nmanifest = "{manifest}"\n')
    found = front.matrix_plan(configured(tmp_path, f"imageforge:\n  cache_dir: {tmp_path}\n"),
                              str(matrix))
    first, second = found.to_json()["images"]
    assert first["shared"] == []
    assert second["shared"] == list(first["builds"])
    assert second["builds"] == []
    lines = found.table().splitlines()
    assert lines[1].endswith(f"builds nothing; shares {', '.join(first['builds'])}")
    assert lines[2] == (f"2 images, {2 * first['stages']} stage slots, {first['stages']} "
                        f"distinct keys, {len(first['builds'])} to build")


def test_whole_image_artifacts_go_to_the_image_store_unless_configured_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert options.workspace(configured(tmp_path)).image_store
    store = options.workspace(configured(tmp_path)).store
    assert store.images is not None
    monkeypatch.setenv("INVOKE_IMAGEFORGE_IMAGE_ARTIFACTS", "oci-layout")
    layouts = options.workspace(configured(tmp_path))
    assert not layouts.image_store
    assert layouts.store.images is None
    monkeypatch.setenv("INVOKE_IMAGEFORGE_IMAGE_ARTIFACTS", "registry")
    with pytest.raises(UsageError, match=r"^imageforge.image_artifacts = 'registry': give one "
                                         r"of image-store, oci-layout \(invoke.yaml or "
                                         r"INVOKE_IMAGEFORGE_IMAGE_ARTIFACTS\)\.$"):
        options.workspace(configured(tmp_path))


@pytest.mark.parametrize("run", ["build", "matrix.build"])
def test_build_and_matrix_build_read_the_same_ca_bundle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: str) -> None:
    """matrix.build once ignored the CA bundle that build hands to pip's steps: behind a
    TLS-intercepting proxy its pip steps failed unless BuildKit's cache held them. A bundle
    that cannot be read is refused by both, naming where it came from, before any build."""
    matrix = tmp_path / "images.toml"
    matrix.write_text(f'[[image]]\nmanifest = "{ROOT / "manifests" / "efa-nccl.toml"}"\n')
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "absent.pem"))
    config = configured(tmp_path, f"imageforge:\n  cache_dir: {tmp_path}\n")
    manifest = str(ROOT / "manifests/efa-nccl.toml")
    runs: dict[str, Callable[[], object]] = {
        "build": lambda: list(front.build(config, options.Flags(manifest=manifest),
                                          front.BuildRequest(target="efa-nccl"))),
        "matrix.build": lambda: list(front.matrix_build(config, str(matrix), test=False,
                                                        progress="plain", report=None))}
    with pytest.raises(ManifestError, match=rf"^SSL_CERT_FILE {tmp_path}/absent.pem: cannot "):
        runs[run]()


def test_an_output_file_is_replaced_whole_and_a_fifo_written_in_place(tmp_path: Path) -> None:
    """A regular file is renamed over, never truncated in place: a second link to the old
    file keeps the old text, and no temporary file is left. A FIFO (a shell's >(jq .)) stays
    a FIFO and gets the text."""
    report = tmp_path / "report.json"
    report.write_text("old\n")
    os.link(report, tmp_path / "earlier.json")
    outputs.write_output("--out", str(report), "new\n")
    assert report.read_text() == "new\n"
    assert (tmp_path / "earlier.json").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier.json", "report.json"]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    outputs.write_output("--out", str(fifo), "through\n")
    reader.join(timeout=10)
    assert got == ["through\n"]
    assert stat.S_ISFIFO(fifo.lstat().st_mode)

"""The invoke front end as users run it: real subprocesses, exit codes, no tracebacks."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEX64 = set("0123456789abcdef")


def invoke(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("INVOKE_IMAGEFORGE_MANIFEST", None)
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], cwd=cwd,
                          capture_output=True, text=True, env=env, check=False, timeout=120)


@pytest.mark.parametrize(
    ("manifest", "target"),
    [("manifests/smddp.toml", "smddp"), ("manifests/efa-nccl.toml", "efa-nccl")])
def test_plan_json_has_the_design_shape(manifest: str, target: str) -> None:
    result = invoke("plan", "--target", target, "--manifest", manifest, "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert set(plan) == {"target", "manifest", "stages"}
    assert plan["target"] == target
    assert plan["manifest"] == manifest
    names = [s["name"] for s in plan["stages"]]
    assert names[-1] == target
    assert names[0] == "base"
    seen: set[str] = set()
    for stage in plan["stages"]:
        assert set(stage) == {"name", "deps", "key", "status", "inputs"}
        assert set(stage["deps"]) <= seen, "stages must be in topological order"
        assert stage["key"].startswith("sha256:")
        assert set(stage["key"][7:]) <= HEX64
        assert len(stage["key"]) == 71
        assert stage["status"] in ("cached", "remote", "build")
        seen.add(stage["name"])
    nccl = next(s for s in plan["stages"] if s["name"] == "nccl")
    assert nccl["inputs"]["version"] in ("2.10.3", "2.7.8")


def test_default_manifest_is_smddp() -> None:
    result = invoke("plan", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["manifest"] == "manifests/smddp.toml"


@pytest.mark.parametrize("name", ["smddp.toml", "efa-nccl.toml", "pt25-cu124.toml"])
def test_check_render_plan_work_offline_on_every_shipped_manifest(name: str) -> None:
    manifest = f"manifests/{name}"
    check = invoke("check", "--manifest", manifest)
    assert check.returncode == 0, check.stderr
    target = "efa-nccl" if name == "efa-nccl.toml" else "smddp"
    render = invoke("render", "--target", target, "--manifest", manifest)
    assert render.returncode == 0
    assert render.stdout.count("FROM ") >= 4
    assert invoke("plan", "--target", target, "--manifest", manifest).returncode == 0


def test_bad_set_exits_2_with_one_line_and_no_traceback() -> None:
    result = invoke("plan", "--set", "stages.nccl.version=2.10.3; curl x | sh")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert "--set stages.nccl.version=2.10.3; curl x | sh" in result.stderr
    assert "FROM" not in result.stdout


def test_missing_manifest_and_unknown_target_are_user_errors(tmp_path: Path) -> None:
    missing = invoke("check", "--manifest", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2
    assert "no such manifest" in missing.stderr
    unknown = invoke("plan", "--target", "smdp")
    assert unknown.returncode == 1   # a flag value, as in every command
    assert "did you mean 'smddp'" in unknown.stderr
    assert "Traceback" not in missing.stderr + unknown.stderr


def test_plan_graph_writes_dot_coloured_by_status(tmp_path: Path) -> None:
    out = tmp_path / "dag.dot"
    result = invoke("plan", "--graph", str(out))
    assert result.returncode == 0, result.stderr
    dot = out.read_text()
    assert '"nccl" -> "pytorch";' in dot
    assert '"efa" -> "aws-ofi-nccl";' in dot
    assert '"boost" -> "pytorch"' not in dot
    assert "fillcolor" in dot


def test_build_dry_run_prints_each_bake_as_the_build_runs_it(tmp_path: Path) -> None:
    """The dry run prints the bakes `build` runs, from the same description (app/bakes.py):
    the stages first, then the image reading their stored artifacts; each with the argv the
    build runs (the metadata file included), its bake file and its Dockerfile."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), "build", "--target", "efa-nccl",
         "--manifest", "manifests/efa-nccl.toml", "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "# stages to build: base, efa, nccl, aws-ofi-nccl, nccl-tests, efa-nccl"
    argvs = [shlex.split(line[2:]) for line in lines if line.startswith("+ ")]
    workdir = tmp_path.resolve() / "build" / "efa-nccl"
    # As the build runs it: without buildx's git provenance (bake.BAKE_ENV).
    assert {a[0] for a in argvs} == {"BUILDX_GIT_INFO=0"}
    assert [a[2:] for a in argvs] == [
        ["buildx", "bake", "-f", str(workdir / f"bake-{n}" / "bake.json"), "--progress",
         "rawjson", "--metadata-file", str(workdir / f"bake-{n}" / "metadata.json")]
        for n in (0, 1)]
    texts = [part.split("# Dockerfile\n", 1)[0] for part in result.stdout.split("# bake.json")[1:]]
    stages, image = (json.loads(t.split("\n", 1)[1]) for t in texts)
    assert set(stages["target"]) == {f"artifact-{s}" for s in (
        "base", "efa", "nccl", "aws-ofi-nccl", "nccl-tests")}
    some = next(iter(stages["target"].values()))
    assert some["contexts"]["src-efa"].startswith(str(tmp_path))
    assert some["contexts"]["src-nccl"] == "<unlocked: run invoke lock>/src-nccl"
    final = image["target"]["image"]
    assert final["labels"]["io.imageforge.target"] == "efa-nccl"
    assert final["contexts"]["nccl"].startswith("<artifact sha256:")
    assert final["contexts"]["nccl"].endswith(" stored by bake 0>")
    assert "FROM efa AS efa-nccl" in result.stdout
    assert "FROM scratch AS imageforge-artifact-nccl" in result.stdout
    assert not any(tmp_path.iterdir()), "a dry run writes nothing"


def test_config_env_var_sets_the_default_manifest() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "INVOKE_IMAGEFORGE_MANIFEST": "manifests/efa-nccl.toml"}
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "plan", "--target",
                             "efa-nccl", "--json"], cwd=ROOT, capture_output=True, text=True,
                            env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["manifest"] == "manifests/efa-nccl.toml"


@pytest.mark.parametrize("suffix", [".svg", ".png"])
def test_plan_graph_renders_pictures_with_graphviz(tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"dag{suffix}"
    result = invoke("plan", "--manifest", "manifests/efa-nccl.toml", "--target", "efa-nccl",
                    "--graph", str(out))
    assert result.returncode == 0, result.stderr
    data = out.read_bytes()
    if suffix == ".svg":
        text = data.decode()
        assert text.lstrip().startswith(("<?xml", "<svg"))
        assert "<title>nccl</title>" in text
    else:
        assert data.startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize(("manifest", "target"), [("manifests/smddp.toml", "smddp"),
                                                  ("manifests/efa-nccl.toml", "efa-nccl"),
                                                  ("manifests/pt25-cu124.toml", "smddp")])
def test_default_target_is_the_image_the_manifest_defines(manifest: str, target: str) -> None:
    result = invoke("plan", "--manifest", manifest, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["target"] == target


def test_a_manifest_with_several_images_needs_a_target_and_lists_them(tmp_path: Path) -> None:
    two = tmp_path / "two.toml"
    two.write_text((ROOT / "manifests/smddp.toml").read_text() + '\n[stages.nccl-tests]\n'
                   'version = "2.11.0"\n')
    result = invoke("plan", "--manifest", str(two))
    assert result.returncode == 1, result.stderr
    assert "defines 3 images (smddp, efa-nccl, training); pass --target" in result.stderr
    assert invoke("plan", "--manifest", str(two), "--target", "efa-nccl").returncode == 0


USAGE_ERRORS = [
    (["render", "--output", "/nonexistent/dir/f"], "--output /nonexistent/dir/f: cannot write it"),
    (["render", "--format", "yaml"], "--format yaml: unknown format"),
    (["plan", "--graph", "/nonexistent/dir/dag.dot"], "/nonexistent/dir/dag.dot: No such file"),
    (["plan", "--graph", "dag.pdf"], "--graph dag.pdf: unknown format"),
    (["nightly", "--size-budget", "abc"], "--size-budget abc: give a number above 0"),
    (["nightly", "--size-budget", "nan"], "--size-budget nan: give a number above 0"),
    (["test-image", "--target", "nccl"], "--target nccl is not an image"),
    (["build", "--progress", "fancy"], "--progress fancy: use auto, plain or json"),
    (["build", "--code", "examples/train"], "--code and --program go together"),
    (["run-local", "--hosts", "0"], "--hosts 0: give a whole number of at least 1"),
    (["run-local", "--hosts", "two"], "--hosts two: give a whole number"),
    (["run-local", "--image", "x", "--timeout", "-5"], "--timeout -5: give a whole number"),
    (["promote", "--image", "foo"], "--image foo: give the image by digest"),
    (["test-image", "--target", "smddp", "--json", "docs"], "--json docs: is a directory"),
    (["test-image", "--target", "smddp", "--junit", "/nonexistent/dir/r.xml"],
     "--junit /nonexistent/dir/r.xml: its directory /nonexistent/dir does not exist"),
    (["promote"], "promote needs --image"),
    (["cache.prune", "--max-size", "lots"], "--max-size lots: expected a size"),
    (["cache.prune", "--older-than", "soon"], "--older-than soon: expected an age"),
    (["cache.prune", "--keep-last", "x"], "--keep-last x: give a whole number"),
    (["cache.prune"], "cache.prune needs --max-size and/or --older-than"),
    (["cache.push"], "cache.push needs --remote"),
    (["mirror.sync"], "mirror.sync needs --to DIR"),
    (["build", "--target", "nccl", "--push"], "build --push needs --tag REGISTRY/REPOSITORY:TAG"),
    (["lock", "--check", "--upgrade"], "lock --check and --upgrade contradict each other"),
    (["fetch", "--mirror", "ftp://mirror.example/x"], "--mirror ftp://mirror.example/x: give a"),
    (["bench", "--repeats", "0", "--no-builds"], "--repeats 0: give a whole number"),
    (["plan", "--target", "nope"], "--target nope: unknown stage"),
    (["render", "--target", "nope"], "--target nope: unknown stage"),
    (["test-image", "--target", "nope"], "--target nope is not an image"),
    (["build", "--target", "efa", "--tag", "Bad Tag!!"], "--tag 'Bad Tag!!': not an image"),
    (["promote", "--image", "r/x@sha256:" + "a" * 64, "--tag", "bad tag"],
     "--tag 'bad tag': not a tag"),
    (["nightly", "--repository", "Reg/Bad Repo"], "(imageforge.repository) 'Reg/Bad Repo': not"),
    (["plan", "--bogus"], "No idea what '--bogus' is"),  # invoke's own parser: also 1
]


@pytest.mark.parametrize(("argv", "message"), USAGE_ERRORS, ids=lambda v: " ".join(v)[:40]
                         if isinstance(v, list) else None)
def test_usage_errors_exit_1_with_one_line_naming_the_flag(argv: list[str], message: str,
                                                          tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *argv],
                            cwd=ROOT, capture_output=True, text=True, env=env,
                            check=False, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    # The error is one line, the last (notes about the lock may come before it).
    assert message in result.stderr.strip().splitlines()[-1], result.stderr


@pytest.mark.parametrize("where", ["environment", "invoke.yaml"])
def test_a_misspelt_setting_is_refused_naming_it(where: str, tmp_path: Path) -> None:
    """invoke itself ignores an INVOKE_* variable or a config key it does not know: a typo
    would silently build with the default cache directory."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    extra: list[str] = []
    if where == "environment":
        env["INVOKE_IMAGEFORGE_CACHEDIR"] = str(tmp_path)
        said = ("$INVOKE_IMAGEFORGE_CACHEDIR is not a setting (did you mean "
                "INVOKE_IMAGEFORGE_CACHE_DIR?)")
    else:
        (tmp_path / "invoke.yaml").write_text(f"imageforge:\n  cachedir: {tmp_path}\n")
        extra = ["-f", str(tmp_path / "invoke.yaml")]
        said = "imageforge.cachedir in the invoke config is not a setting (did you mean cache_dir?)"
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *extra, "plan",
                             "--target", "nccl", "--manifest", "manifests/sample.toml"],
                            cwd=ROOT, capture_output=True, text=True, env=env, check=False,
                            timeout=120)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert said in result.stderr.strip().splitlines()[-1]
    assert not any(tmp_path.glob("artifacts"))


def test_a_reader_that_closes_early_stops_the_command_quietly() -> None:
    """`plan --json | head`: exit 141 as a shell pipeline's writer, no traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "-r", str(ROOT), "plan", "--json"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.close()   # the reader is gone before the first line
    errors = proc.stderr.read()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in errors
    assert "Exception ignored" not in errors


def test_a_full_standard_output_is_named_not_the_cache_disk() -> None:
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "plan",
                                 "--json"], cwd=ROOT, stdout=full, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                check=False, timeout=120)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == ("imageforge: error: standard output: no space left "
                                              "on its device; send the output somewhere with "
                                              "room.")
    assert "cache.prune" not in result.stderr


@pytest.mark.parametrize("kind", ["file", "dangling symlink"])
@pytest.mark.parametrize("command", [["cache.ls"], ["plan", "--target", "efa"]])
def test_a_cache_dir_that_cannot_be_one_is_exit_9_naming_the_setting(
        tmp_path: Path, kind: str, command: list[str]) -> None:
    """It read as an empty cache ("0 artifacts", exit 0) and failed on the first write."""
    cache = tmp_path / "cache"
    if kind == "file":
        cache.write_text("")
    else:
        cache.symlink_to(tmp_path / "gone")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INVOKE_IMAGEFORGE_CACHE_DIR": str(cache)}
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *command],
                            cwd=ROOT, capture_output=True, text=True, env=env, check=False,
                            timeout=120)
    assert result.returncode == 9, result.stderr
    assert result.stdout == ""
    setting = "imageforge.cache_dir (invoke.yaml or INVOKE_IMAGEFORGE_CACHE_DIR)"
    assert result.stderr.splitlines()[-1].startswith(f"imageforge: error: {setting} = {cache}: ")


@pytest.mark.parametrize(("text", "says"), [
    ("imageforge:\n  cache_dir: [1, 2]\n", "imageforge.cache_dir in the invoke config is [1, 2]"),
    ("imageforge:\n  manifest: 7\n", "imageforge.manifest in the invoke config is 7"),
    ("imageforge: 5\n", "imageforge in the invoke config is 5, not a table"),
    ("imageforge:\n  remote: {a: 1}\n", "imageforge.remote in the invoke config is {'a': 1}"),
    ("imageforge: {cache_dir: \"x\"\n", "line 2: not valid YAML (expected ',' or '}'"),
    ("imageforge:\n  cache_dir: \"x\n", "line 3: not valid YAML (found unexpected end"),
])
def test_a_broken_or_wrongly_typed_invoke_config_is_one_sentence(tmp_path: Path, text: str,
                                                                 says: str) -> None:
    """These were tracebacks, some from invoke's own merge of declared defaults."""
    config = tmp_path / "invoke.yaml"
    config.write_text(text)
    result = invoke("-f", str(config), "plan")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("imageforge: error: ")
    assert says in line


def test_a_setting_from_the_environment_beats_invoke_yaml(tmp_path: Path) -> None:
    config = tmp_path / "invoke.yaml"
    config.write_text(f"imageforge:\n  cache_dir: {tmp_path / 'from-yaml'}\n")
    (tmp_path / "from-yaml").write_text("a file: not a cache")
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "INVOKE_IMAGEFORGE_CACHE_DIR": str(tmp_path / "from-env")}
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "-f", str(config),
                             "cache.ls"], cwd=ROOT, capture_output=True, text=True, env=env,
                            check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"in {tmp_path / 'from-env'}/artifacts" in result.stdout
    yaml_only = invoke("-f", str(config), "cache.ls")
    assert yaml_only.returncode == 9
    assert "from-yaml: is not a directory" in yaml_only.stderr


def test_a_command_that_downloads_nothing_imports_no_http_or_terminal_library() -> None:
    """requests, urllib3, tenacity and rich were about 0.12 s of the 0.42 s every command
    spent importing; only a transfer or a terminal's live display loads them now."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("INVOKE_IMAGEFORGE_MANIFEST", None)
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "invoke", "-r", str(ROOT), "plan",
         "--target", "smddp", "--manifest", "manifests/smddp.toml", "--json"],
        cwd=ROOT, capture_output=True, text=True, env=env, check=False, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    # The modules that use them were loaded: the test would notice a plan that stopped
    # importing anything at all.
    assert {"imageforge.sources.download", "imageforge.sources.sources"} <= imported
    assert imported.isdisjoint({"requests", "urllib3", "tenacity", "rich"})

"""`ci.generate`: one job per distinct stage key across the images, linked by `needs:`, none
for a key the registry cache holds; the pipelines pass GitHub's and GitLab's own schemas and
zizmor's audits (real linters, run as subprocesses)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from imageforge.app import project
from imageforge.app.build import build
from imageforge.app.workspace import Workspace
from imageforge.buildkit.results import BuildOptions
from imageforge.errors import LockError
from imageforge.image import cigen
from imageforge.planning.execute import is_external
from imageforge.planning.plan import Plan
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "manifests/sample.toml"
REMOTE = "registry.example.com:5000/imageforge-cache"
BIN = Path(sys.executable).parent


def planned(tmp_path: Path, target: str, *overrides: str) -> Plan:
    settings = Workspace(registry=STAGES, manifest=SAMPLE, overrides=overrides,
                                cache_dir=tmp_path / "cache")
    return project.plan(settings, target)


def images(tmp_path: Path, *, boost: str | None = None) -> list[cigen.Image]:
    sets = (f"stages.boost.version={boost}",) if boost else ()
    return [cigen.Image(manifest="manifests/sample.toml", overrides=(), tag=None,
                        plan=planned(tmp_path, "efa-nccl")),
            cigen.Image(manifest="manifests/sample.toml", overrides=sets,
                        tag="registry.example.com/smddp:nightly",
                        plan=planned(tmp_path, "smddp", *sets))]


def nothing_held(_pairs: object) -> set[str]:
    return set()


def dependents(plan: Plan, stage: str) -> set[str]:
    """`stage` and every stage of `plan` that needs it, from the plan's own deps."""
    found = {stage}
    for s in plan.stages:           # plan order: a stage comes after what it needs
        if found & set(s.deps):
            found.add(s.name)
    return found


def test_one_job_per_distinct_key_each_needing_the_jobs_of_its_deps(tmp_path: Path) -> None:
    found = cigen.pipeline(images(tmp_path), REMOTE, nothing_held)
    both = images(tmp_path)
    keys = {s.key: s for i in both for s in i.plan.stages}
    built = {k for k, s in keys.items() if not is_external(s)}
    assert len(built) == len(keys) - 1          # all but the base image, which is external
    assert sorted(j.key for j in found.jobs) == sorted(built)
    assert found.distinct == len(keys)
    assert found.in_registry == 0
    ids = [j.id for j in found.jobs]
    assert len(set(ids)) == len(ids)
    for index, job in enumerate(found.jobs):
        stage = keys[job.key]
        # Needs exactly the jobs of its deps (a dep without a job is the external base).
        by_name = {s.name: s for i in both for s in i.plan.stages}
        assert set(job.needs) == {cigen.job_id(d, by_name[d].key) for d in stage.deps
                                  if by_name[d].key in {j.key for j in found.jobs}}
        assert set(job.needs) <= set(ids[:index]), f"{job.id} runs before what it needs"
        argv = list(job.argv)
        assert argv[argv.index("--target") + 1] == stage.name
        assert argv[argv.index("--expect-key") + 1] == job.key
        assert argv[argv.index("--remote") + 1] == REMOTE
    # EFA and NCCL are in both images and built once.
    assert [j.stage for j in found.jobs].count("efa") == 1
    smddp = next(j for j in found.jobs if j.stage == "smddp")
    assert smddp.argv[-2:] == ("--tag", "registry.example.com/smddp:nightly")
    assert "--tag" not in next(j for j in found.jobs if j.stage == "efa-nccl").argv


def test_keys_the_registry_holds_get_no_job_and_a_pin_change_only_its_dependents(
        tmp_path: Path) -> None:
    before = images(tmp_path)
    held = {s.key for i in before for s in i.plan.stages}
    after = images(tmp_path, boost="1.74.0")
    found = cigen.pipeline(after, REMOTE, lambda pairs: {k for _, k in pairs if k in held})
    assert {j.stage for j in found.jobs} == dependents(after[1].plan, "boost")
    assert "pytorch" not in {j.stage for j in found.jobs}
    boost = next(j for j in found.jobs if j.stage == "boost")
    assert boost.needs == ()                  # what it needs is in the registry already
    wanted = {s.key for i in after for s in i.plan.stages if not is_external(s)}
    assert found.in_registry == len(wanted & held) > 0
    assert "--set" in boost.argv
    assert "stages.boost.version=1.74.0" in boost.argv


@pytest.mark.parametrize("fmt", cigen.FORMATS)
def test_nothing_new_is_one_no_op_job(tmp_path: Path, fmt: cigen.Format) -> None:
    found = cigen.pipeline(images(tmp_path), REMOTE, lambda pairs: {k for _, k in pairs})
    assert found.jobs == ()
    path = tmp_path / "pipeline.yml"
    path.write_text(cigen.render(found, fmt, source="images.toml"))
    result = lint(fmt, path)
    assert result.returncode == 0, result.stdout + result.stderr
    document = yaml.safe_load(path.read_text())
    jobs = document["jobs"] if fmt == "github" else {
        k: v for k, v in document.items() if not k.startswith(".") and k != "stages"}
    assert list(jobs) == ["up-to-date"]


def lint(fmt: str, path: Path) -> subprocess.CompletedProcess[str]:
    schema = "vendor.github-workflows" if fmt == "github" else "vendor.gitlab-ci"
    result = subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema", schema,
                             str(path)], capture_output=True, text=True, check=False)
    if result.returncode != 0 or fmt != "github":
        return result
    return subprocess.run([str(BIN / "zizmor"), "--offline", "--no-progress", str(path)],
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize("fmt", cigen.FORMATS)
def test_generated_pipelines_pass_the_ci_engines_schema_and_audits(tmp_path: Path,
                                                                   fmt: cigen.Format) -> None:
    found = cigen.pipeline(images(tmp_path), REMOTE, nothing_held)
    path = tmp_path / f"pipeline-{fmt}.yml"
    path.write_text(cigen.render(found, fmt, source="images.toml"))
    result = lint(fmt, path)
    assert result.returncode == 0, result.stdout + result.stderr
    document = yaml.safe_load(path.read_text())
    if fmt == "github":
        jobs = document["jobs"]
        assert set(jobs) == {j.id for j in found.jobs}
        for job in found.jobs:
            steps = jobs[job.id]["steps"]
            assert shlex.split(steps[-1]["run"]) == [cigen.INVOKE, *job.argv]
            assert jobs[job.id].get("needs", []) == list(job.needs)
            # Credentials come from the CI engine's secrets, never from the file.
            assert jobs[job.id]["env"] == {name: f"${{{{ secrets.{name} }}}}"
                                           for name in cigen.SECRETS}
    else:
        for job in found.jobs:
            assert document[job.id]["needs"] == list(job.needs)
            assert document[job.id]["script"] == [job.command]


@pytest.mark.parametrize(("fmt", "breakage", "says"), [
    ("github", ("runs-on: ubuntu-latest", "runs-onn: ubuntu-latest"), "runs-on"),
    ("github", (cigen.CHECKOUT.split("  #")[0], "actions/checkout@v4"), "unpinned"),
    ("gitlab", ("  needs: [", "  needz: ["), "needz"),
])
def test_the_linters_catch_a_broken_pipeline(tmp_path: Path, fmt: cigen.Format,
                                             breakage: tuple[str, str], says: str) -> None:
    """The linters are real: each catches a pipeline broken the way a hand edit breaks it."""
    found = cigen.pipeline(images(tmp_path), REMOTE, nothing_held)
    path = tmp_path / "broken.yml"
    path.write_text(cigen.render(found, fmt, source="images.toml").replace(*breakage))
    result = lint(fmt, path)
    assert result.returncode != 0
    assert says in result.stdout + result.stderr


def test_the_example_nightly_workflow_passes_the_linters() -> None:
    result = lint("github", ROOT / "examples/nightly.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_job_refuses_a_key_other_than_the_one_it_was_generated_for(tmp_path: Path) -> None:
    settings = Workspace(registry=STAGES, manifest=SAMPLE, cache_dir=tmp_path / "cache")
    key = project.plan(settings, "boost").key
    moved = Workspace(registry=STAGES,
                             manifest=SAMPLE, overrides=("stages.boost.version=1.74.0",
                                                         "stages.boost.sha256=" + "e" * 64),
                             cache_dir=tmp_path / "cache")
    with pytest.raises(LockError) as caught:
        build(moved, BuildOptions(target="boost", expect_key=key))
    assert str(caught.value).startswith("--expect-key: boost's key is sha256:")
    assert f"not {key}" in str(caught.value)
    assert "run `invoke ci.generate` again" \
        in str(caught.value)
    assert not (tmp_path / "cache" / "artifacts").exists() or not any(
        (tmp_path / "cache" / "artifacts").rglob("*.json"))


@pytest.mark.parametrize(("args", "code", "says"), [
    (("--format", "github"), 1, "ci.generate needs --remote REPOSITORY (or imageforge.remote)"),
    (("--format", "jenkins", "--remote", REMOTE), 1, "--format jenkins: use github or gitlab."),
    (("--remote", "not a repo"), 1, "remote cache 'not a repo' is not a registry repository"),
    (("--remote", REMOTE, "--file", "examples/images.toml", "--target", "smddp"), 1,
     "--manifest, --set and --target go in its [[image]] tables"),
])
def test_ci_generate_refuses_bad_options_in_one_sentence(tmp_path: Path, args: tuple[str, ...],
                                                         code: int, says: str) -> None:
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "ci.generate",
                             *args], cwd=ROOT, capture_output=True, text=True, check=False,
                            env={"PATH": str(BIN), "INVOKE_IMAGEFORGE_CACHE_DIR":
                                 str(tmp_path / "cache")})
    assert result.returncode == code
    assert says in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""

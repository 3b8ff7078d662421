"""A pipeline from `ci.generate`, run for real: its jobs' own command lines, in file order
(GitHub's `needs:` order), spread over two Docker engines that share only the registry cache
(with auth), each job on a fresh imageforge cache as on an ephemeral CI runner. Each key is
built exactly once, both engines end with every image, and a pipeline generated after a
one-pin change holds only that stage and its dependents."""

from __future__ import annotations

import json
import shlex
import subprocess
import uuid
from pathlib import Path

import requests
import yaml

from tests.integration.conftest import invoke, registry_env

RUN = uuid.uuid4().hex[:8]
TARGETS = ("efa-nccl", "smddp")


def matrix_file(path: Path, manifest: Path, boost: tuple[str, ...] = ()) -> Path:
    sets = ", ".join(json.dumps(s) for s in boost)
    path.write_text(f'''
[[image]]
manifest = "{manifest}"
target = "efa-nccl"
tag = "imageforge-test/ci-efa-nccl:{RUN}"

[[image]]
manifest = "{manifest}"
target = "smddp"
tag = "imageforge-test/ci-smddp:{RUN}"
set = [{sets}]
''')
    return path


def generate(matrix: Path, remote: str, cache: Path) -> dict[str, dict[str, object]]:
    out = matrix.with_suffix(".yml")
    result = invoke("ci.generate", "--format", "github", "--file", str(matrix), "--remote",
                    remote, "--out", str(out), cache=cache, env=registry_env())
    assert result.returncode == 0, result.stderr
    return dict(yaml.safe_load(out.read_text())["jobs"])


def job_argv(job: dict[str, object]) -> list[str]:
    steps = job["steps"]
    assert isinstance(steps, list)
    argv = shlex.split(steps[-1]["run"])
    assert argv[0] == ".venv/bin/invoke", argv
    return argv[1:]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def report_states(cache: Path) -> dict[str, tuple[str, str]]:
    """stage -> (key, state) from the one build report a fresh cache holds."""
    reports = sorted((cache / "reports").glob("*.json"))
    document = json.loads(reports[-1].read_text())
    return {s["name"]: (s["key"], s["state"]) for s in document["stages"]}


def stage_deps(manifest: Path, target: str, cache: Path) -> dict[str, list[str]]:
    result = invoke("plan", "--manifest", str(manifest), "--target", target, "--json",
                    cache=cache)
    assert result.returncode == 0, result.stderr
    return {s["name"]: s["deps"] for s in json.loads(result.stdout)["stages"]}


def test_generated_jobs_build_each_key_once_across_two_engines(
        sample_manifest: Path, registry: str, second_builder: str, upstream: str,
        tmp_path: Path) -> None:
    remote = f"{registry}/ci-{RUN}"
    matrix = matrix_file(tmp_path / "images.toml", sample_manifest)
    jobs = generate(matrix, remote, tmp_path / "generate")
    assert jobs, "a registry cache without these keys needs jobs"
    engines: list[dict[str, str]] = [{}, {"DOCKER_CONTEXT": second_builder}]

    built: dict[str, str] = {}
    done: set[str] = set()
    for index, (name, job) in enumerate(jobs.items()):
        needs = job.get("needs", [])
        assert isinstance(needs, list), f"{name} before its needs"
        assert set(needs) <= done, f"{name} before its needs"
        argv = job_argv(job)
        cache = tmp_path / "runner" / name
        result = invoke(*argv, cache=cache, env={**registry_env(), **engines[index % 2]},
                        timeout=1800)
        assert result.returncode == 0, f"job {name}: {result.stdout[-3000:]}{result.stderr}"
        states = report_states(cache)
        stage = flag(argv, "--target")
        assert states[stage] == (flag(argv, "--expect-key"), "built"), states
        # Everything else came from the registry: the jobs it needs had pushed it.
        assert [n for n, (_, state) in states.items() if state == "built"] == [stage], states
        assert states[stage][0] not in built, f"{stage} built twice"
        built[states[stage][0]] = stage
        done.add(name)

    # Both engines end with every image, from the registry cache alone.
    for engine in engines:
        for target in TARGETS:
            cache = tmp_path / "image" / f"{target}-{len(engine)}"
            tag = f"imageforge-test/ci-{target}:{RUN}"
            result = invoke("build", "--manifest", str(sample_manifest), "--target", target,
                            "--remote", remote, "--tag", tag, "--no-test", "--progress",
                            "plain", cache=cache, env={**registry_env(), **engine})
            assert result.returncode == 0, result.stderr
            assert "built" not in {state for _, state in report_states(cache).values()}
            context = engine.get("DOCKER_CONTEXT", "default")
            inspect = subprocess.run(["docker", "--context", context, "image", "inspect", tag],
                                     capture_output=True, check=False)
            assert inspect.returncode == 0, f"{tag} is not on engine {context}"

    # A pipeline with nothing new is one no-op job.
    assert list(generate(matrix, remote, tmp_path / "again")) == ["up-to-date"]

    # One pin moves (boost, in the smddp image): only boost and what needs it get jobs.
    pins = requests.get(f"{upstream}/pins.json", timeout=10).json()
    sha = pins["files"]["boost_1_74_0.tar.gz"]["sha256"]
    bumped = matrix_file(tmp_path / "bumped.toml", sample_manifest,
                         ("stages.boost.version=1.74.0", f"stages.boost.sha256={sha}"))
    after = generate(bumped, remote, tmp_path / "bumped")
    deps = stage_deps(sample_manifest, "smddp", tmp_path / "plan")
    expected = {"boost"}
    for stage, needs in deps.items():       # plan order: a stage follows what it needs
        if expected & set(needs):
            expected.add(stage)
    assert {flag(job_argv(j), "--target") for j in after.values()} == expected
    assert "pytorch" not in expected
    assert "smddp" in expected

"""Bad manifests and bad --set values: each gets one clear message naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from imageforge.errors import ManifestError
from imageforge.model.manifest import load
from stages import STAGES

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
[image]
base = "example/base:1"
cuda_arch = ["8.0"]
python = "3.11"

[stages.efa]
version = "1.14.1"
"""

BAD_FILES = [
    ("[image\nbase = 1", "invalid TOML"),
    (GOOD.replace('python = "3.11"', ""), "image (line 1): missing required key 'python'"),
    (GOOD + "[stages.efaa]\nversion = '1'\n",
     "stages.efaa (line 8): unknown stage; did you mean 'efa'?"),
    (GOOD.replace('version = "1.14.1"', 'verison = "1.14.1"'),
     "stages.efa.verison (line 7): unknown key; did you mean 'version'?"),
    (GOOD.replace('"1.14.1"', '"1.14.1; curl x | sh"'),
     "stages.efa.version (line 7): '1.14.1; curl x | sh' is not allowed"),
    (GOOD.replace('"1.14.1"', '"1.14.1\\nRUN evil"'), "stages.efa.version (line 7):"),
    (GOOD.replace('["8.0"]', '["sm80"]'), "image.cuda_arch (line 3): 'sm80' is not allowed"),
    (GOOD.replace('"example/base:1"', '"Example Base"'), "image.base (line 2):"),
    (GOOD + 'url = "https://x/$(id).tgz"\n', "stages.efa.url (line 8):"),
    (GOOD + 'url = "https://x/{ver}.tgz"\n', "unknown placeholder {ver}"),
    (GOOD + 'flags = ["-y", "--x; rm -rf /"]\n', "stages.efa.flags (line 8):"),
    (GOOD + "[stages.nccl]\nversion = '2.10.3'\nprefix = '/opt/../etc'\n",
     "stages.nccl.prefix (line 10):"),
    (GOOD + "[stages.nccl]\nversion = '2.10.3'\nrepo = '--upload-pack=touch /tmp/x'\n",
     "stages.nccl.repo (line 10):"),
    (GOOD + "[stages.nccl]\nversion = '2.10.3'\nref = '-b evil'\n", "stages.nccl.ref (line 10):"),
    (GOOD + "[stages.python]\nprovider = 'pip'\n", "choose one of miniconda, venv"),
    (GOOD + "[stages.python]\nversion = '3.8'\n", "differs from image.python '3.11'"),
    (GOOD + "[extra]\nx = 1\n", "unknown top-level key"),
    (GOOD.replace("[image]", "[imgae]"), "did you mean 'image'?"),
    (GOOD + "[stages.pytorch]\nversion = '1.10.2'\nmax_jobs = 'many'\n", "expected a whole number"),
    # The rules read these numerically; a value they cannot read used to skip them silently.
    (GOOD.replace('python = "3.11"', 'python = "latest"'),
     "image.python (line 4): 'latest' is not allowed: expected a Python major.minor like 3.11"),
    (GOOD.replace("[image]\n", '[image]\ncuda = "eleven"\n'),
     "image.cuda (line 2): 'eleven' is not allowed: expected a CUDA version like 12.4"),
    (GOOD + "[stages.pytorch]\nversion = '1.10.2'\nmax_jobs = 0\n",
     "stages.pytorch.max_jobs (line 10): 0 is not allowed: expected a whole number of parallel "
     "jobs from 1 to 4096"),
    (GOOD + "[stages.pytorch]\nversion = '1.10.2'\nmax_jobs = 100000000000000000000\n",
     "stages.pytorch.max_jobs (line 10): 100000000000000000000 is not allowed"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_bad_manifest_is_refused_with_a_clear_message(tmp_path: Path, text: str,
                                                       message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ManifestError) as excinfo:
        load(path, registry=STAGES)
    assert message in str(excinfo.value)
    assert str(path) in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


BAD_SETS = [
    ("stages.nccl.version=2.18.6; curl x | sh",
     "--set stages.nccl.version=2.18.6; curl x | sh (over "),
    ("stages.nccl.version=2.18.6\nRUN x", "is not allowed"),
    ("stages.ncl.version=2.18.6", "unknown stage 'ncl'; did you mean 'nccl'?"),
    ("stages.nccl.verion=2.18.6", "unknown key; did you mean 'version'?"),
    ("image.cuda_arch=[\"8.0\", \"x\"]", "'x' is not allowed"),
    ("image.apt=maybe", "expected true or false"),
    ("nccl.version=1", "keys look like image.<key>, stages.<stage>.<key> or waive.<rule id>"),
    ("stages.nccl.version", "expected KEY=VALUE"),
    ("image.pyhton=3.8", "did you mean 'python'?"),
    ("image.cuda=eleven", "'eleven' is not allowed: expected a CUDA version like 12.4"),
    ("image.python=latest", "'latest' is not allowed: expected a Python major.minor like 3.11"),
    ("stages.pytorch.max_jobs=0", "0 is not allowed: expected a whole number of parallel jobs"),
    ("stages.pytorch.max_jobs=100000000000000000000",
     "100000000000000000000 is not allowed: expected a whole number of parallel jobs"),
]


@pytest.mark.parametrize(("override", "message"), BAD_SETS)
def test_bad_set_is_refused_like_the_file(override: str, message: str) -> None:
    with pytest.raises(ManifestError) as excinfo:
        load(ROOT / "manifests/smddp.toml", (override,), registry=STAGES)
    assert message in str(excinfo.value)


def test_set_overrides_are_applied_and_validated() -> None:
    loaded = load(ROOT / "manifests/smddp.toml",
                  ("stages.nccl.version=2.18.6", "image.apt=false", "image.cuda_arch=8.0,9.0"),
                  registry=STAGES)
    assert loaded.stages["nccl"]["version"] == "2.18.6"
    assert loaded.stages["nccl"]["ref"] == "v2.18.6-1"
    assert loaded.image["apt"] is False
    assert loaded.image["cuda_arch"] == ["8.0", "9.0"]


def test_overrides_change_the_manifest_digest() -> None:
    plain = load(ROOT / "manifests/smddp.toml", registry=STAGES)
    changed = load(ROOT / "manifests/smddp.toml", ("stages.nccl.version=2.18.6",), registry=STAGES)
    assert plain.digest() != changed.digest()


# What docs/manifests.md's table says each shipped manifest pins (CUDA, Python, the
# versions of its stages) and the rules it waives on purpose.
SHIPPED = [
    ("smddp.toml", "11.3", "3.8",
     {"python": "3.8", "efa": "1.14.1", "nccl": "2.10.3", "aws-ofi-nccl": "1.1.3-aws",
      "pytorch": "1.10.2", "torchvision": "0.11.3", "boost": "1.73.0", "smddp": "1.4.0"},
     {"nccl-pytorch-pin"}),
    ("efa-nccl.toml", "11.1", "3.6",
     {"efa": "1.11.2", "nccl": "2.7.8", "aws-ofi-nccl": "1.1.1", "nccl-tests": "master"},
     set()),
    ("pt25-cu124.toml", "12.4", "3.11",
     {"python": "3.11", "efa": "1.36.0", "nccl": "2.23.4", "aws-ofi-nccl": "1.12.1-aws",
      "pytorch": "2.5.1", "torchvision": "0.20.1", "boost": "1.73.0", "smddp": "2.6.0"},
     {"nccl-pytorch-pin"}),
]


@pytest.mark.parametrize(("name", "cuda", "python", "versions", "waived"), SHIPPED)
def test_shipped_manifests_are_valid(name: str, cuda: str, python: str,
                                     versions: dict[str, str], waived: set[str]) -> None:
    loaded = load(ROOT / "manifests" / name, registry=STAGES)
    assert loaded.image["name"]
    assert (loaded.image["cuda"], loaded.image["python"]) == (cuda, python)
    assert {stage: inputs["version"] for stage, inputs in loaded.stages.items()
            if inputs.get("version")} == versions
    assert set(loaded.waivers) == waived
    # Templates are substituted: no value still holds a placeholder such as {version}.
    templated = [f"{stage}.{key}" for stage, inputs in loaded.stages.items()
                 for key, value in inputs.items() if isinstance(value, str) and "{" in value]
    assert templated == []
    assert loaded.stages["nccl"]["ref"] == f"v{versions['nccl']}-1"

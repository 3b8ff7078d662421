"""Same key, same bytes: the fixed SOURCE_DATE_EPOCH every step and artifact gets, the
clamped file times of OCI-layout artifacts, the rebuild's own cache mounts, stages that
declare they are not reproducible, and where two layouts first differ."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from imageforge.app import options, project
from imageforge.app.verify import Verdict, least_recently_verified, lines
from imageforge.app.workspace import Workspace
from imageforge.cache import verified
from imageforge.cache.layoutdiff import first_difference, top_digest
from imageforge.errors import UsageError
from imageforge.model.stage import keyed_inputs
from imageforge.planning.artifact import exports_block
from imageforge.planning.execute import (
    SOURCE_DATE_EPOCH,
    bake_file,
    fresh_cache_mounts,
    make_run,
)
from imageforge.planning.plan import Plan, stage_key
from stages import STAGES, discover

ROOT = Path(__file__).resolve().parents[2]
File = tuple[str, bytes, int]   # name, content, mtime


def write_blob(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return f"sha256:{digest}"


def layer(files: list[File], *, compress: bool) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, content, mtime in files:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(content), mtime, 0o644
            tar.addfile(info, io.BytesIO(content))
    return gzip.compress(out.getvalue(), mtime=0) if compress else out.getvalue()


def layout(path: Path, layers: list[list[File]], *, env: str = "A=1",
           compress: bool = False) -> Path:
    blobs = [layer(files, compress=compress) for files in layers]
    digests = [write_blob(path, data) for data in blobs]
    config = write_blob(path, json.dumps({"config": {"Env": [env]},
                                          "rootfs": {"diff_ids": digests}}).encode())
    manifest = write_blob(path, json.dumps({
        "schemaVersion": 2, "config": {"digest": config},
        "layers": [{"digest": d, "size": len(b)} for d, b in zip(digests, blobs, strict=True)],
    }).encode())
    (path / "index.json").write_text(json.dumps({"manifests": [{"digest": manifest}]}))
    return path


BASE = [("etc/os", b"debian\n", 100)]
OWN = [("out/lib/libnccl.so", b"\x7fELF one", SOURCE_DATE_EPOCH),
       ("out/lib/z.txt", b"z", SOURCE_DATE_EPOCH)]


def test_identical_layouts_have_no_difference(tmp_path: Path) -> None:
    one = layout(tmp_path / "a", [BASE, OWN])
    two = layout(tmp_path / "b", [BASE, OWN])
    assert top_digest(one) == top_digest(two)
    assert first_difference(one, two) is None


def test_the_first_differing_file_is_named_with_what_differs(tmp_path: Path) -> None:
    one = layout(tmp_path / "a", [BASE, OWN])
    changed = [("out/lib/libnccl.so", b"\x7fELF two", SOURCE_DATE_EPOCH), OWN[1]]
    assert first_difference(one, layout(tmp_path / "b", [BASE, changed])) == \
        "layer 2: /out/lib/libnccl.so differs (content)"
    later = [(OWN[0][0], OWN[0][1], SOURCE_DATE_EPOCH + 5), OWN[1]]
    assert first_difference(one, layout(tmp_path / "c", [BASE, later])) == \
        f"layer 2: /out/lib/libnccl.so differs (mtime {SOURCE_DATE_EPOCH} -> " \
        f"{SOURCE_DATE_EPOCH + 5})"
    assert first_difference(one, layout(tmp_path / "d", [BASE, OWN[1:]])) == \
        "layer 2: /out/lib/libnccl.so is missing (in its place: /out/lib/z.txt)"
    assert first_difference(one, layout(tmp_path / "e", [BASE, [*OWN, ("x", b"", 1)]])) == \
        "layer 2: /x is new"
    assert first_difference(one, layout(tmp_path / "f", [BASE])) == "2 layers, now 1"
    assert first_difference(one, layout(tmp_path / "g", [BASE, OWN], env="A=2")) == \
        "image config: config.Env differs"


def test_other_compression_of_the_same_files_is_still_a_difference(tmp_path: Path) -> None:
    one = layout(tmp_path / "a", [BASE, OWN])
    two = layout(tmp_path / "b", [BASE, OWN], compress=True)
    assert first_difference(one, two) == \
        "layer 1: same files, different layer bytes (tar or compression)"
    # Files compared as an image store keeps them: the same files are the same.
    assert first_difference(one, two, clamp_times=True) is None


def test_clamped_times_ignore_only_times_after_the_epoch(tmp_path: Path) -> None:
    one = layout(tmp_path / "a", [BASE, [("out/f", b"x", SOURCE_DATE_EPOCH + 10)]])
    two = layout(tmp_path / "b", [BASE, [("out/f", b"x", SOURCE_DATE_EPOCH + 99)]])
    assert first_difference(one, two, clamp_times=True) is None
    assert first_difference(one, two) is not None
    three = layout(tmp_path / "c", [BASE, [("out/f", b"y", SOURCE_DATE_EPOCH + 99)]])
    assert first_difference(one, three, clamp_times=True) == "layer 2: /out/f differs (content)"
    old = layout(tmp_path / "d", [[("etc/os", b"debian\n", 99)], [("out/f", b"x", 1)]])
    assert first_difference(one, old, clamp_times=True) == \
        "layer 1: /etc/os differs (mtime 100 -> 99)"


def test_a_rebuild_gets_cache_mounts_of_its_own() -> None:
    text = ("RUN --mount=type=cache,id=imageforge-pip,target=/root/.cache/pip,sharing=locked "
            "--mount=type=cache,id=imageforge-ccache,target=/root/.ccache make\n")
    fresh = fresh_cache_mounts(text, "t0k")
    assert "id=imageforge-pip-verify-t0k,target=/root/.cache/pip" in fresh
    assert "id=imageforge-ccache-verify-t0k,target=/root/.ccache" in fresh
    assert fresh_cache_mounts("RUN --mount=type=bind,from=src,target=/s make\n", "t") == \
        "RUN --mount=type=bind,from=src,target=/s make\n"


def test_every_built_stage_reads_the_one_epoch(sample_plan: Plan, tmp_path: Path) -> None:
    for stage in sample_plan.stages:
        lines_ = stage.recipe.splitlines()
        if len(lines_) > 1:
            assert lines_[1] == "ARG SOURCE_DATE_EPOCH", stage.name
    run = make_run(sample_plan, sample_plan.registry, ["efa", "nccl"], {})
    spec = bake_file(run, workdir=tmp_path, tag="t:1", labels={}, platform="linux/amd64",
                     push=False, artifact_dirs={"nccl": tmp_path / "nccl"},
                     artifact_images={"efa": "imageforge-artifact/x/efa:1"})
    # The same value in every target: a difference would make BuildKit run steps twice.
    assert {json.dumps(t["args"]) for t in spec["target"].values()} == {
        json.dumps({"SOURCE_DATE_EPOCH": "315532800"})}
    # nccl's exports clamp their file times in a build step: BuildKit's rewrite-timestamp
    # re-tars a layer at 14-20 MB/s. The engine's image exporter refuses the option anyway.
    assert spec["target"]["artifact-nccl"]["output"] == [
        f"type=oci,dest={tmp_path / 'nccl'},tar=false,compression=uncompressed"]
    assert "rewrite-timestamp" not in spec["target"]["artifact-efa"]["output"][0]
    assert ("FROM nccl AS imageforge-clamp-nccl\nARG SOURCE_DATE_EPOCH\nUSER root\n"
            "RUN --network=none mkdir /imageforge-export && cp -a --parents /out "
            "/imageforge-export/ \\\n    && find /imageforge-export -newermt "
            '"@${SOURCE_DATE_EPOCH}" -exec touch -h -d "@${SOURCE_DATE_EPOCH}" {} +\n'
            "FROM scratch AS imageforge-artifact-nccl\n"
            "COPY --from=imageforge-clamp-nccl /imageforge-export/ /\n") in run.dockerfile


def test_how_an_exports_only_artifact_is_made_is_in_its_key(sample_plan: Plan) -> None:
    # Its Dockerfile text is rendered for the stage: another way of making the artifact gives
    # other bytes, so it must give another key. A whole-image artifact is the stage itself.
    nccl = sample_plan.stage("nccl")
    exports = exports_block("nccl", sample_plan.registry["nccl"].exports)
    assert nccl.key == stage_key(
        name="nccl", recipe=nccl.recipe + exports,
        inputs=keyed_inputs(sample_plan.registry["nccl"], nccl.inputs),
        manifest=sample_plan.manifest, dep_keys={d: sample_plan.stage(d).key for d in nccl.deps})
    # A stage that exports nothing has an empty artifact: nothing to copy or clamp.
    assert exports_block("nothing", ()) == "FROM scratch AS imageforge-artifact-nothing\n"
    efa = sample_plan.stage("efa")
    assert efa.key == stage_key(
        name="efa", recipe=efa.recipe,
        inputs=keyed_inputs(sample_plan.registry["efa"], efa.inputs),
        manifest=sample_plan.manifest, dep_keys={d: sample_plan.stage(d).key for d in efa.deps})


def test_a_declared_stage_shows_in_the_plan(sample_plan: Plan) -> None:
    assert "not_reproducible" not in sample_plan.to_json("sample")
    declared = dataclasses.replace(sample_plan.registry["smddp"], reproducible=False,
                                   reproducible_reason="it records the time")
    clocked = dataclasses.replace(sample_plan,
                                  registry={**sample_plan.registry, "smddp": declared})
    assert clocked.to_json("sample")["not_reproducible"] == {"smddp": "it records the time"}


def test_a_stage_declared_not_reproducible_must_say_why(tmp_path: Path) -> None:
    (tmp_path / "clock.py").write_text(
        "from imageforge.model.stage import Stage\n"
        "STAGE = Stage(name='clock', doc='', deps=('base',), fields={},\n"
        "              recipe=lambda _c: '', reproducible=False)\n")
    with pytest.raises(UsageError, match=r"clock\.py: stage 'clock' says reproducible=False "
                                         r"without a reason"):
        discover([tmp_path])


def test_verdict_lines_show_the_detail() -> None:
    verdicts = [Verdict(stage="nccl", key="sha256:" + "a" * 64, result="same",
                        stored="sha256:1", rebuilt="sha256:1", seconds=2.0),
                Verdict(stage="clock", key="sha256:" + "b" * 64, result="differs",
                        detail="layer 1: /t differs (content)")]
    out = lines(verdicts)
    assert out[1].split() == ["nccl", "same", "2.0", "sha256:1"]
    assert out[2].endswith("layer 1: /t differs (content)")
    assert verdicts[1].to_json()["failed"] is True


def test_records_keep_each_remote_digest_a_rebuild_matched(tmp_path: Path) -> None:
    key = "sha256:" + "c" * 64
    assert verified.lookup(tmp_path, key) is None
    verified.record(tmp_path, key=key, stage="nccl", digest="sha256:1")
    assert verified.verified_remote_digest(tmp_path, key, "r:5000/cache") is None
    verified.record(tmp_path, key=key, stage="nccl", digest="sha256:1",
                    remote="r:5000/cache", remote_digest="sha256:2")
    verified.record(tmp_path, key=key, stage="nccl", digest="sha256:1",
                    remote="s:5000/cache", remote_digest="sha256:3")
    assert verified.verified_remote_digest(tmp_path, key, "r:5000/cache") == "sha256:2"
    assert verified.verified_remote_digest(tmp_path, key, "s:5000/cache") == "sha256:3"
    # A record of another key under this name (a copied file) counts for nothing.
    other = "sha256:" + "d" * 64
    (tmp_path / "artifacts" / "verified" / f"{'c' * 64}.json").rename(
        tmp_path / "artifacts" / "verified" / f"{'d' * 64}.json")
    assert verified.lookup(tmp_path, other) is None


def test_a_nightly_verifies_the_stages_verified_longest_ago(tmp_path: Path) -> None:
    settings = Workspace(registry=STAGES, manifest=ROOT / "manifests/sample.toml",
                                cache_dir=tmp_path)
    planned = project.plan(settings, "efa-nccl")
    assert least_recently_verified(settings, "efa-nccl", 2) == ["efa", "nccl"]
    for name in ("efa", "nccl"):
        verified.record(tmp_path, key=planned.stage(name).key, stage=name, digest="sha256:1")
    assert least_recently_verified(settings, "efa-nccl", 2) == ["aws-ofi-nccl", "nccl-tests"]
    assert least_recently_verified(settings, "efa-nccl", 99) == [
        "aws-ofi-nccl", "nccl-tests", "efa-nccl", "efa", "nccl"]


def test_bad_trust_and_verify_values_are_one_clear_error() -> None:
    config = options.Config(table={"cache_trust": "some"}, discover=discover)
    with pytest.raises(UsageError, match=r"imageforge\.cache_trust = 'some': give one of any, "
                                         r"verified"):
        options.workspace(config)
    assert options.workspace(options.Config(table={"cache_trust": "verified"},
                                       discover=discover)).verified_in == Path("cache")
    assert options.workspace(options.Config(table={}, discover=discover)).verified_in is None
    with pytest.raises(UsageError, match="--verify two: give a number of stages"):
        options.count("verify", "two")

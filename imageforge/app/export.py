"""`invoke build --output DEST`: the files a target's stages made, as a plain tree or a tar.

ParallelCluster and Slurm hosts run NCCL, the plugin and nccl-tests outside containers. The
export holds exactly what an image stage copies from each stage it gathers (a builder's /out
tree, the efa stage's /opt/amazon), read from the artifact cache by BuildKit's tar exporter
(unpacked by tar for a tree), plus imageforge-export.json naming each stage, its key and its
inputs. The base image and image stages themselves contribute nothing: their files are the
base's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from imageforge.app import project
from imageforge.app.workspace import Workspace
from imageforge.cache.artifacts import ArtifactStore
from imageforge.cmd import docker, docker_binary, popen
from imageforge.errors import BuildError, CacheError, UsageError
from imageforge.planning.plan import Plan, PlannedStage
from imageforge.planning.render import copy_text

EXPORT_TIMEOUT = 1800
MANIFEST_FILE = "imageforge-export.json"


def exported_stages(planned: Plan) -> list[PlannedStage]:
    """The stages whose own files go into the export, in build order."""
    return [s for s in planned.stages
            if s.name != "base" and not planned.registry[s.name].image]


def dockerfile(planned: Plan, stages: list[PlannedStage]) -> str:
    listing = json.dumps({
        "target": planned.target, "manifest": str(planned.manifest.path),
        "stages": [{"name": s.name, "key": s.key, "inputs": s.inputs} for s in stages],
    }, indent=2, sort_keys=True, default=str)
    lines = ["FROM scratch"]
    lines.extend(text for text in (copy_text(planned.registry[s.name]) for s in stages) if text)
    lines += [f"COPY <<'EOF' /{MANIFEST_FILE}", listing, "EOF"]
    return "\n".join(lines) + "\n"


def output_spec(dest: Path, *, write_to: Path) -> str:
    """BuildKit's tar exporter, into `write_to` for a .tar `dest` (renamed to `dest` once
    complete), or to stdout for a tree, which tar unpacks: BuildKit's local exporter
    deadlocks on trees of many files (moby/buildkit#2950; a torch image's export hung twice
    at 146 MB and 1.1 GB of 5 GB, where the tar stream took 40 s)."""
    return f"type=tar,dest={write_to if dest.suffix == '.tar' else '-'}"


def check_destination(dest: Path) -> Path:
    """`dest` resolved, or a UsageError before anything is built."""
    dest = dest.resolve()
    if not dest.parent.is_dir():
        raise UsageError(f"--output {dest}: its directory {dest.parent} does not exist; "
                         "create it or choose another path.")
    if dest.suffix != ".tar" and dest.exists() and any(dest.iterdir()):
        raise UsageError(f"--output {dest} is a directory that is not empty; give a new or "
                         "empty directory, or a FILE.tar.")
    return dest


def export(ws: Workspace, target: str, dest: Path) -> Path:
    """Write the export of `target` (already built) to `dest`; nothing is left at `dest` when
    it fails."""
    dest = check_destination(dest)
    planned = project.plan(ws, target)
    stages = exported_stages(planned)
    store = ws.store
    contexts = _contexts(store, planned, stages)
    with tempfile.TemporaryDirectory(prefix="imageforge-export-") as tmp:
        (Path(tmp) / "Dockerfile").write_text(dockerfile(planned, stages))
        partial = dest.with_name(dest.name + ".part")
        _remove(partial)
        args = ["buildx", "build", "--progress", "plain", "--output",
                output_spec(dest, write_to=partial)]
        for name, context in contexts.items():
            args += ["--build-context", f"{name}={context}"]
        if dest.suffix == ".tar":
            result = docker(*args, tmp, timeout=EXPORT_TIMEOUT)
            code, stderr = result.returncode, result.stderr
        else:
            code, stderr = _unpacked(args, tmp, partial)
        if code != 0:
            _remove(partial)
            tail = stderr.decode(errors="replace").strip().splitlines()[-5:]
            raise BuildError(f"exporting {target} to {dest} failed: " + " / ".join(tail))
        if dest.is_dir():
            dest.rmdir()   # empty, checked above
        partial.rename(dest)
    return dest


def _unpacked(args: list[str], context: str, tree: Path) -> tuple[int, bytes]:
    """The bake's tar stream unpacked into `tree`: (the first non-zero exit, their stderr)."""
    tree.mkdir()
    with tempfile.TemporaryFile() as log:
        build = popen([docker_binary(), *args, context], stdout=subprocess.PIPE, stderr=log)
        unpack = popen(["tar", "-x", "-C", str(tree)], stdin=build.stdout, stderr=log,
                       stdout=log)
        assert build.stdout is not None
        build.stdout.close()   # tar alone reads it: a tar that stops makes the build stop
        try:
            codes = (build.wait(timeout=EXPORT_TIMEOUT), unpack.wait(timeout=EXPORT_TIMEOUT))
        except subprocess.TimeoutExpired:
            build.kill()
            unpack.kill()
            build.wait()
            unpack.wait()
            codes = (124, 124)
            log.write(f"no export within {EXPORT_TIMEOUT} s\n".encode())
        log.seek(0)
        return next((c for c in codes if c != 0), 0), log.read()


def _contexts(store: ArtifactStore, planned: Plan, stages: list[PlannedStage]
              ) -> dict[str, str]:
    contexts = {}
    for stage in stages:
        entry = store.verify(stage.key) if stage.status == "cached" else None
        if entry is None:
            raise CacheError(f"stage {stage.name} ({stage.key[:19]}) is not in the artifact "
                             f"cache; build --target {planned.target} first.")
        contexts[stage.name] = entry.context
    return contexts


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)

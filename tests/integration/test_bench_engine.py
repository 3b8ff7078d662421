"""The benchmark's own Docker engine: pruning it for a cold start leaves the host engine's
BuildKit cache alone, its build steps reach the network through its own bridge, and it
leaves nothing behind (iptables rules, bridge, containerd namespaces)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from bench.engine import Engine
from bench.run import sample_base


def host_build(dockerfile: Path, context: Path) -> None:
    """Build on the host engine. A second try after a failure: this step only seeds the
    host's cache, and once under a full run's load one build of it failed alone (its error is
    kept in the assertion if the second fails too)."""
    tries = []
    for _ in range(2):
        built = subprocess.run(["docker", "buildx", "build", "--progress", "plain", "-f",
                                str(dockerfile), str(context)], capture_output=True, text=True,
                               check=False, timeout=600)
        if built.returncode == 0:
            return
        tries.append(built.stderr[-3000:])
    raise AssertionError("the host build failed twice:\n" + "\n---\n".join(tries))


def host_records(marker: str) -> set[str]:
    """The IDs of the host engine's BuildKit records whose description names `marker`."""
    listing = subprocess.run(["docker", "buildx", "du", "--verbose"], capture_output=True,
                             text=True, check=True, timeout=120).stdout
    return {block.split()[1] for block in re.split(r"\n\s*\n", listing)
            if block.startswith("ID:") and marker in block}


@pytest.mark.usefixtures("docker_ready")
def test_pruning_the_bench_engine_leaves_the_hosts_cache(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    context = tmp_path / "context"
    context.mkdir()
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(f"FROM {sample_base()}\nRUN echo {marker} > /marker\n")
    host_build(dockerfile, context)
    # A short root: dockerd's libnetwork socket under exec-root must fit the 107 bytes of a
    # unix socket path, which an xdist worker's tmp_path (.../popen-gwN/test_.../) runs past.
    root = Path(tempfile.mkdtemp(prefix="ifbe-", dir="/tmp"))
    try:
        with Engine(root / "engine") as engine:
            name = engine.name
            engine.load([sample_base()])
            # A build step on the engine's bridge reaches a name outside (DNS and NAT).
            reach = tmp_path / "Reach.Dockerfile"
            reach.write_text(f"FROM {sample_base()}\nRUN getent hosts pypi.org\n"
                             f"RUN echo {marker} > /marker\n")
            engine.docker("buildx", "build", "-f", str(reach), str(context))
            assert engine.docker("buildx", "du").stdout.strip()
            # The host's records of the same step, read right around the prune: the host's
            # own garbage collection (other workers build meanwhile, and it ranks a record
            # used once among the first to go) may drop one at any other moment.
            before = host_records(marker)
            assert before, "the host's build of the marker step left no BuildKit record"
            engine.docker("buildx", "prune", "--all", "--force")
            after = host_records(marker)
            assert re.search(r"Total:\s+0B", engine.docker("buildx", "du").stdout)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert before <= after, f"pruning the bench engine removed host records {before - after}"
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    assert name not in rules
    assert engine.bridge not in subprocess.run(["ip", "link"], capture_output=True, text=True,
                                               check=True).stdout
    namespaces = subprocess.run(["ctr", "namespaces", "ls", "-q"], capture_output=True,
                                text=True, check=True).stdout.split()
    assert not [n for n in namespaces if n.startswith(name)]

"""scripts/daemon_json.py, run as setup-host.sh runs it, on real files: what imageforge needs
is added, everything else in daemon.json stays, and bad input changes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(path: Path, keep: str = "20GB") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts/daemon_json.py"), str(path), keep],
                          capture_output=True, text=True, check=False, timeout=60)


def test_a_missing_file_gets_the_snapshotter_and_a_bounded_build_cache(tmp_path: Path) -> None:
    path = tmp_path / "docker" / "daemon.json"
    assert run(path, "15GB").returncode == 0
    assert json.loads(path.read_text()) == {
        "features": {"containerd-snapshotter": True},
        "builder": {"gc": {"enabled": True, "defaultKeepStorage": "15GB"}}}
    # Run again: nothing to do, said by the exit code, and the file is left alone.
    before = path.stat().st_mtime_ns
    assert run(path, "15GB").returncode == 3
    assert path.stat().st_mtime_ns == before


def test_other_keys_and_the_users_own_gc_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "daemon.json"
    mine = {"features": {"buildkit": True}, "registry-mirrors": ["http://mirror"],
            "builder": {"gc": {"enabled": False}, "entitlements": {"network-host": True}}}
    path.write_text(json.dumps(mine))
    assert run(path).returncode == 0
    assert json.loads(path.read_text()) == {
        "features": {"buildkit": True, "containerd-snapshotter": True},
        "registry-mirrors": ["http://mirror"],
        "builder": {"gc": {"enabled": False}, "entitlements": {"network-host": True}}}


def test_a_daemon_json_from_before_gets_its_gc(tmp_path: Path) -> None:
    # What setup-host wrote before it bounded the build cache: dockerd then had no GC at all.
    path = tmp_path / "daemon.json"
    path.write_text('{"features": {"containerd-snapshotter": true}}\n')
    assert run(path).returncode == 0
    assert json.loads(path.read_text())["builder"] == {
        "gc": {"enabled": True, "defaultKeepStorage": "20GB"}}


def test_bad_json_is_named_and_left_as_it_was(tmp_path: Path) -> None:
    for text in ('{"features": ', '["not", "an", "object"]', '{"builder": "x"}'):
        path = tmp_path / "daemon.json"
        path.write_text(text)
        result = run(path)
        assert result.returncode == 1
        assert str(path) in result.stderr
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert path.read_text() == text
        assert sorted(p.name for p in tmp_path.iterdir()) == ["daemon.json"]

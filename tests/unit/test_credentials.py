"""Registry credentials in the private docker config: readable by this user only while a
command runs, and gone afterwards, whether it succeeded, failed or was interrupted. Neither
the raw password nor its base64 form (what docker's config.json holds) is left anywhere."""

from __future__ import annotations

import base64
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from imageforge.cache import remote

ROOT = Path(__file__).resolve().parents[2]
HOST = "registry.example:5000"
USER = "ci-bot"
PASSWORD = "s3cret-" + os.urandom(6).hex()
ENVIRON = {"IMAGEFORGE_REGISTRY_USER": USER, "IMAGEFORGE_REGISTRY_PASSWORD": PASSWORD}
ENCODED = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where tempfile puts the private config; the user's own docker config is empty."""
    root = tmp_path / "tmp"
    root.mkdir()
    home = tmp_path / "home-docker"
    home.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    monkeypatch.setenv("DOCKER_CONFIG", str(home))
    return root


def secrets_left(root: Path) -> list[str]:
    """Every path under `root` that still exists, and every file holding either form."""
    found = [str(p) for p in root.rglob("*")]
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if PASSWORD.encode() in data or ENCODED.encode() in data:
                found.append(f"secret in {path}")
    return found


def test_the_private_config_is_owner_only_and_holds_the_credentials(temp_root: Path) -> None:
    with remote.credentials(HOST, ENVIRON) as env:
        config = Path(env["DOCKER_CONFIG"])
        assert config.parent == temp_root
        assert stat.S_IMODE(config.stat().st_mode) == 0o700
        assert stat.S_IMODE((config / "config.json").stat().st_mode) == 0o600
        data = json.loads((config / "config.json").read_text())
        assert data["auths"][HOST] == {"auth": ENCODED}
        assert PASSWORD not in (config / "config.json").read_text()
    assert secrets_left(temp_root) == []
    assert secrets_left(Path(os.environ["DOCKER_CONFIG"])) == []


def test_nothing_is_left_after_a_failure(temp_root: Path) -> None:
    def build_that_fails() -> None:
        with remote.credentials([HOST, "other.example:5000"], ENVIRON) as env:
            assert Path(env["DOCKER_CONFIG"], "config.json").is_file()
            raise RuntimeError("the build failed")

    with pytest.raises(RuntimeError, match="the build failed"):
        build_that_fails()
    assert secrets_left(temp_root) == []


def test_without_credentials_no_config_is_written(temp_root: Path) -> None:
    with remote.credentials(HOST, {"IMAGEFORGE_REGISTRY_USER": USER}) as env:
        assert env == {}
    assert secrets_left(temp_root) == []


# The child makes SIGINT raise KeyboardInterrupt, as at a terminal: a test run started in the
# background by a non-interactive shell inherits SIGINT ignored, and Python then never raises
# it (the child read on until the test's timeout, in one such run).
HOLD = """
import signal
import sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from imageforge.cache import remote
environ = {"IMAGEFORGE_REGISTRY_USER": sys.argv[1], "IMAGEFORGE_REGISTRY_PASSWORD": sys.argv[2]}
with remote.credentials("registry.example:5000", environ) as env:
    print(env["DOCKER_CONFIG"], flush=True)
    sys.stdin.read()
"""


def test_nothing_is_left_after_ctrl_c(tmp_path: Path) -> None:
    root = tmp_path / "tmp"
    root.mkdir()
    home = tmp_path / "home-docker"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(root),
           "DOCKER_CONFIG": str(home)}
    child = subprocess.Popen([sys.executable, "-c", HOLD, USER, PASSWORD], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None
    config = Path(child.stdout.readline().strip())
    assert (config / "config.json").is_file()
    assert config.parent == root
    child.send_signal(signal.SIGINT)
    # Wait with stdin still open: communicate() would close it, and a child the signal had not
    # reached yet would then read EOF and leave normally (it did once, on a loaded machine).
    child.wait(timeout=60)
    assert child.stderr is not None
    err = child.stderr.read()
    assert child.returncode != 0
    assert "KeyboardInterrupt" in err
    assert secrets_left(root) == []
    assert secrets_left(home) == []

"""The host set-up scripts never change a package the machine already has.

Each script's own apt step runs as a simulation (APT_SAFE_SIMULATE=1, the same function and the
same package list the script installs with) in a bookworm container made from the project's
base image, with Debian's real package lists. A partial dist-upgrade (what `apt-get install -t
trixie` did) shows up as installed packages that would change version, and fails the test.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = "imageforge/base:bookworm"


def simulate(script: str) -> subprocess.CompletedProcess[str]:
    """Run `script` (a shell snippet) in a throwaway bookworm container with scripts/ mounted."""
    return subprocess.run(
        ["docker", "run", "--rm", "-v", f"{ROOT / 'scripts'}:/scripts:ro", BASE,
         "bash", "-c", script],
        capture_output=True, text=True, timeout=600, check=False)


def changed(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("changes ", "removes "))]


def new(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("new ")]


@pytest.mark.usefixtures("docker_ready")
def test_setup_host_installs_docker_without_changing_installed_packages() -> None:
    result = simulate("APT_SAFE_SIMULATE=1 /scripts/setup-host.sh")
    assert not changed(result.stdout), "installed packages would change:\n" + "\n".join(
        changed(result.stdout))
    assert result.returncode == 0, result.stdout + result.stderr
    added = new(result.stdout)
    names = {line.split()[1]: line for line in added}
    # The four named packages come from trixie, and nothing else does unless it is new.
    for package in ("docker.io", "docker-buildx", "containerd", "docker-compose"):
        assert package in names, f"{package} not installed: {added}"
        assert "trixie" in names[package] or "Debian:13" in names[package], names[package]
    from_trixie = [line for line in added if "trixie" in line or "Debian:13" in line]
    assert len(from_trixie) < len(added), added
    # The script says what it will change before changing it.
    assert "imageforge-trixie.sources" in result.stdout
    assert "priority 100" in result.stdout


@pytest.mark.usefixtures("docker_ready")
def test_host_tools_install_without_changing_installed_packages() -> None:
    result = simulate("APT_SAFE_SIMULATE=1 /scripts/host-tools.sh")
    assert not changed(result.stdout), "\n".join(changed(result.stdout))
    assert result.returncode == 0, result.stdout + result.stderr
    # The base image already has autoconf and automake; these two are new there.
    assert {line.split()[1] for line in new(result.stdout)} >= {"gnupg", "graphviz"}


@pytest.mark.usefixtures("docker_ready")
def test_the_check_catches_a_partial_dist_upgrade() -> None:
    """The old `-t trixie` install, through the same check: it must be caught and listed."""
    result = simulate(
        "APT_SAFE_SIMULATE=1 /scripts/setup-host.sh >/dev/null 2>&1; "
        ". /scripts/lib/apt-safe.sh; APT_SAFE_SIMULATE=1 apt_safe_install -t trixie docker.io")
    assert result.returncode == 1, result.stdout + result.stderr
    assert any(line.startswith("changes libc6 ") for line in changed(result.stdout)), result.stdout

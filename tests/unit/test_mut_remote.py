"""The remote artifact cache's pure parts and its one docker question (imageforge/cache/remote.py):
which references name a registry, which repositories are accepted, where an artifact lives,
how `docker buildx imagetools inspect`'s answer is read (a stand-in `docker` executable on
PATH gives the answers a real one gives), and what the private docker config keeps of the
user's own."""

from __future__ import annotations

import base64
import json
import os
import stat
import tempfile
import time
from pathlib import Path

import pytest

from imageforge.cache import remote, verified
from imageforge.errors import CacheError, NotReproducibleError, UsageError
from imageforge.model.imageref import registry_host

KEY = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("ref", "host"), [
    ("registry.example.com/team/image:1", "registry.example.com"),
    ("127.0.0.1:5000/cache", "127.0.0.1:5000"),
    ("reg:5000/x", "reg:5000"),
    ("localhost/image", "localhost"),
    ("library/ubuntu", None),
    ("ubuntu:22.04", None),
    ("localhost", None),
    ("registry.example.com", None),
])
def test_registry_host_is_the_first_component_when_it_looks_like_a_host(
        ref: str, host: str | None) -> None:
    assert registry_host(ref) == host


@pytest.mark.parametrize("repository", [
    "registry.example.com:5000/imageforge-cache", "127.0.0.1:5000/a/b", "reg.io/x_y.z-1"])
def test_check_repository_accepts_registry_repositories(repository: str) -> None:
    assert remote.check_repository(repository) == repository


@pytest.mark.parametrize("repository", [
    "imageforge-cache", "Registry.example.com/x", "reg.io/", "http://reg.io/x",
    "reg.io:port/x", "reg.io/x y"])
def test_check_repository_refuses_anything_else_with_an_example(repository: str) -> None:
    with pytest.raises(UsageError) as info:
        remote.check_repository(repository)
    assert str(info.value) == (f"remote cache {repository!r} is not a registry repository like "
                               "'registry.example.com:5000/imageforge-cache'.")


def test_an_artifact_lives_at_repository_stage_and_key_hex() -> None:
    r = remote.Remote(repository="reg.io:5000/cache/team")
    assert r.host == "reg.io:5000"
    assert r.ref("nccl", KEY) == "reg.io:5000/cache/team/nccl:" + "ab" * 32


def test_session_without_a_repository_is_none_and_checks_a_given_one() -> None:
    with remote.session(None) as nothing:
        assert nothing is None
    with remote.session("") as nothing:
        assert nothing is None
    with pytest.raises(UsageError), remote.session("not a repo"):
        pass
    with remote.session("reg.io:5000/cache", {}) as r:
        assert r == remote.Remote(repository="reg.io:5000/cache", env={})


def test_session_puts_the_credentials_in_a_config_for_the_registry_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "none"))
    environ = {"IMAGEFORGE_REGISTRY_USER": "u", "IMAGEFORGE_REGISTRY_PASSWORD": "p"}
    with remote.session("reg.io:5000/cache/x", environ) as r:
        assert r is not None
        config = json.loads(Path(r.env["DOCKER_CONFIG"], "config.json").read_text())
        assert list(config["auths"]) == ["reg.io:5000"]


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `docker` on PATH that records its arguments and DOCKER_CONFIG, then prints what
    `answer` holds to stderr and exits with the code in `code`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text(f"""#!/bin/sh
printf '%s\\n' "$@" > {tmp_path}/args
printf '%s' "$DOCKER_CONFIG" > {tmp_path}/config
cat {tmp_path}/stdout 2>/dev/null
cat {tmp_path}/answer >&2
exit $(cat {tmp_path}/code)
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # No engine API either: only this docker answers.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/imageforge.sock")
    return tmp_path


def _answer(where: Path, code: int, stderr: str) -> None:
    (where / "code").write_text(str(code))
    (where / "answer").write_text(stderr)


def test_exists_asks_imagetools_for_the_artifact_with_our_config(docker: Path) -> None:
    _answer(docker, 0, "")
    (docker / "stdout").write_text('"sha256:0123"\n')
    r = remote.Remote(repository="reg.io:5000/cache", env={"DOCKER_CONFIG": "/private/cfg"})
    assert r.exists("efa", KEY) is True
    assert (docker / "args").read_text().splitlines() == [
        "buildx", "imagetools", "inspect", r.ref("efa", KEY), "--format",
        "{{json .Manifest.Digest}}"]
    assert (docker / "config").read_text() == "/private/cfg"
    assert r.digest("efa", KEY) == "sha256:0123"
    assert r.context("efa", KEY) == f"docker-image://{r.ref('efa', KEY)}"


def test_under_verified_trust_only_the_verified_digest_is_used(docker: Path,
                                                               tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    _answer(docker, 0, "")
    (docker / "stdout").write_text('"sha256:0123"\n')
    r = remote.Remote(repository="reg.io:5000/cache", verified_in=tmp_path / "cache")
    # Never verified: not used, and the warning names the command that verifies it.
    assert r.exists("efa", KEY) is False
    assert "never verified by a rebuild" in capsys.readouterr().err
    assert r.context("efa", KEY) == f"docker-image://{r.ref('efa', KEY)}"
    verified.record(tmp_path / "cache", key=KEY, stage="efa", digest="sha256:9",
                    remote="reg.io:5000/cache", remote_digest="sha256:0123")
    assert r.exists("efa", KEY) is True
    assert r.context("efa", KEY) == f"docker-image://{r.ref('efa', KEY)}@sha256:0123"
    # Verified for another registry only: not this one's.
    other = remote.Remote(repository="reg.io:5000/other", verified_in=tmp_path / "cache")
    assert other.exists("efa", KEY) is False
    # The registry now serves something else under the key: refused.
    (docker / "stdout").write_text('"sha256:4567"\n')
    with pytest.raises(NotReproducibleError, match=r"serves sha256:4567 as .* found "
                                                   r"sha256:0123; the artifact was replaced"):
        r.exists("efa", KEY)


@pytest.mark.parametrize("error", [
    "ERROR: reg.io:5000/cache/efa:ab: not found",
    "error: MANIFEST UNKNOWN: manifest unknown",
])
def test_exists_is_false_when_the_registry_has_no_such_artifact(docker: Path,
                                                                  error: str) -> None:
    _answer(docker, 1, error)
    assert remote.Remote(repository="reg.io:5000/cache").exists("efa", KEY) is False


@pytest.mark.parametrize("error", [
    "dial tcp 127.0.0.1:5000: connect: Connection refused",
    "lookup reg.io: no such host", "i/o timeout", "read: connection reset by peer",
    "server misbehaving", "unexpected EOF", "received 503 Service Unavailable",
    "502 bad gateway", "500 Internal Server Error",
])
def test_exists_raises_unavailable_when_the_registry_does_not_answer(docker: Path,
                                                                      error: str) -> None:
    _answer(docker, 1, f"#1 resolving\nERROR: {error}\n")
    with pytest.raises(remote.RemoteUnavailable) as info:
        remote.Remote(repository="reg.io:5000/cache").exists("efa", KEY)
    assert str(info.value) == f"error: {error}".lower()


@pytest.mark.parametrize("error", ["401 Unauthorized", "authorization failed: denied"])
def test_exists_refuses_credentials_the_registry_rejects(docker: Path, error: str) -> None:
    _answer(docker, 1, error)
    with pytest.raises(CacheError) as info:
        remote.Remote(repository="reg.io:5000/cache").exists("efa", KEY)
    assert str(info.value) == (
        "registry reg.io:5000 refused our credentials; check IMAGEFORGE_REGISTRY_USER/"
        "IMAGEFORGE_REGISTRY_PASSWORD or `docker login`.")


def test_exists_calls_any_other_error_unavailable_with_its_last_line(docker: Path) -> None:
    _answer(docker, 1, "first line\nSomething Odd happened\n")
    with pytest.raises(remote.RemoteUnavailable) as info:
        remote.Remote(repository="reg.io:5000/cache").exists("efa", KEY)
    assert str(info.value) == "something odd happened"
    _answer(docker, 1, "")
    with pytest.raises(remote.RemoteUnavailable) as info:
        remote.Remote(repository="reg.io:5000/cache").exists("efa", KEY)
    assert str(info.value) == "unknown error"


def test_the_private_config_keeps_the_users_other_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / "buildx").mkdir(parents=True)
    (home / "cli-plugins").mkdir()
    (home / "contexts").mkdir()
    home.joinpath("config.json").write_text(json.dumps({
        "auths": {"other.io": {"auth": "b3RoZXI="}, "reg.io": {"auth": "old"}},
        "credHelpers": {"reg.io": "ecr-login", "gcr.io": "gcloud"},
        "credsStore": "desktop", "proxies": {"default": {"httpProxy": "http://p:3128"}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(home))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    environ = {"IMAGEFORGE_REGISTRY_USER": "bot", "IMAGEFORGE_REGISTRY_PASSWORD": "pw"}
    with remote.credentials(["reg.io", "b.io"], environ) as env:
        config = Path(env["DOCKER_CONFIG"])
        data = json.loads((config / "config.json").read_text())
        token = base64.b64encode(b"bot:pw").decode()
        assert data == {
            "auths": {"other.io": {"auth": "b3RoZXI="}, "reg.io": {"auth": token},
                      "b.io": {"auth": token}},
            "credHelpers": {"gcr.io": "gcloud"},
            "proxies": {"default": {"httpProxy": "http://p:3128"}}}
        assert (config / "buildx").is_symlink()
        assert (config / "buildx").resolve() == (home / "buildx").resolve()
        assert (config / "cli-plugins").resolve() == (home / "cli-plugins").resolve()
        assert (config / "contexts").resolve() == (home / "contexts").resolve()
        assert sorted(p.name for p in config.iterdir()) == [
            "buildx", "cli-plugins", "config.json", "contexts"]
        assert stat.S_IMODE((config / "config.json").stat().st_mode) == 0o600
    assert not config.exists()


def test_a_broken_user_config_is_replaced_not_fatal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.joinpath("config.json").write_text("{not json")
    monkeypatch.setenv("DOCKER_CONFIG", str(home))
    environ = {"IMAGEFORGE_REGISTRY_USER": "bot", "IMAGEFORGE_REGISTRY_PASSWORD": "pw"}
    with remote.credentials("reg.io", environ) as env:
        data = json.loads(Path(env["DOCKER_CONFIG"], "config.json").read_text())
    assert data == {"auths": {"reg.io": {"auth": base64.b64encode(b"bot:pw").decode()}},
                    "credHelpers": {}}


def test_without_a_user_config_the_home_docker_directory_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".docker").mkdir()
    (tmp_path / ".docker/config.json").write_text(json.dumps({"auths": {"x.io": {}}}))
    environ = {"IMAGEFORGE_REGISTRY_USER": "bot", "IMAGEFORGE_REGISTRY_PASSWORD": "pw"}
    with remote.credentials("reg.io", environ) as env:
        data = json.loads(Path(env["DOCKER_CONFIG"], "config.json").read_text())
    assert set(data["auths"]) == {"x.io", "reg.io"}


def test_both_user_and_password_are_needed() -> None:
    for environ in ({"IMAGEFORGE_REGISTRY_PASSWORD": "pw"},
                    {"IMAGEFORGE_REGISTRY_USER": "bot", "IMAGEFORGE_REGISTRY_PASSWORD": ""}):
        with remote.credentials("reg.io", environ) as env:
            assert env == {}


def test_warnings_name_the_repository_and_what_to_do(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    r = remote.Remote(repository="reg.io:5000/cache")
    remote.warn_unavailable(r, "connection refused")
    remote.warn_push_failed(r, 3, "timeout")
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "imageforge: warning: remote cache reg.io:5000/cache is unreachable (connection "
        "refused); continuing with the local cache only.",
        "imageforge: warning: pushing 3 artifact(s) to the remote cache reg.io:5000/cache "
        "failed (timeout); the build stands, push them later with `invoke cache.push "
        "--remote reg.io:5000/cache`."]


def test_exists_reads_the_last_line_of_any_error_even_undecodable(docker: Path) -> None:
    _answer(docker, 1, "")
    (docker / "answer").write_bytes(
        b"#1 resolving\n#2 \xff\xfe garbage\nERROR: dial tcp: refused\n")
    with pytest.raises(remote.RemoteUnavailable) as info:
        remote.Remote(repository="reg.io:5000/cache").exists("efa", KEY)
    assert str(info.value) == "error: dial tcp: refused"
    (docker / "answer").write_bytes(b"\xff first\nsecond\nThird Line\n")
    with pytest.raises(remote.RemoteUnavailable) as info:
        remote.Remote(repository="reg.io:5000/cache").exists("efa", KEY)
    assert str(info.value) == "third line"


def test_exists_gives_up_on_a_registry_that_does_not_answer_in_time(docker: Path) -> None:
    # A docker that hangs (a registry that accepts the connection and never answers).
    (docker / "bin" / "docker").write_text("#!/bin/sh\nexec sleep 5\n")
    started = time.monotonic()
    with pytest.raises(remote.RemoteUnavailable) as info:
        remote.Remote(repository="reg.io:5000/cache").exists("efa", KEY, timeout=0.25)
    assert str(info.value) == "reg.io:5000 did not answer within 0.25 s"
    assert time.monotonic() - started < 4


def test_verified_trust_names_the_artifacts_reference_and_stage_in_full(
        docker: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _answer(docker, 0, "")
    (docker / "stdout").write_text('"sha256:4567"\n')
    r = remote.Remote(repository="reg.io:5000/cache", verified_in=tmp_path / "cache")
    ref = f"reg.io:5000/cache/nccl:{'ab' * 32}"
    assert r.ref("nccl", KEY) == ref
    assert r.exists("nccl", KEY) is False
    assert (f"cache_trust = verified: {ref} was never verified by a rebuild, so it is not "
            "used; nccl builds here (invoke verify --rebuild --remote reg.io:5000/cache "
            "verifies it).") in capsys.readouterr().err
    verified.record(tmp_path / "cache", key=KEY, stage="nccl", digest="sha256:9",
                    remote="reg.io:5000/cache", remote_digest="sha256:0123")
    with pytest.raises(NotReproducibleError) as refused:
        r.exists("nccl", KEY)
    assert str(refused.value).startswith(
        f"cache_trust = verified: the remote cache serves sha256:4567 as {ref}, but the "
        f"rebuild that verified nccl (key {KEY[:19]}) found sha256:0123; the artifact was "
        "replaced after it was verified and is refused.")


@pytest.mark.parametrize("error", ["eof", "HTTP 503 Service Unavailable\n\n"])
def test_an_unreachable_registry_is_named_by_the_last_line_of_its_error(
        docker: Path, error: str) -> None:
    _answer(docker, 1, f"first line\n{error}")
    with pytest.raises(remote.RemoteUnavailable) as unavailable:
        remote.Remote(repository="reg.io:5000/cache").digest("efa", KEY)
    assert str(unavailable.value) == error.strip().lower()


def test_holds_asks_the_registry_once_per_artifact_in_a_command(docker: Path) -> None:
    """A build asks again under its key locks; the registry is asked once per artifact."""
    _answer(docker, 0, "")
    (docker / "stdout").write_text('"sha256:0123"\n')
    counted = docker / "bin" / "docker"
    counted.write_text(counted.read_text().replace(
        "#!/bin/sh\n", f"#!/bin/sh\necho \"$4\" >> {docker}/asked\n"))
    r = remote.Remote(repository="reg.io:5000/cache")
    assert r.holds([("efa", KEY), ("nccl", KEY)]) == [True, True]
    _answer(docker, 1, "ERROR: manifest unknown")
    assert r.holds([("nccl", KEY), ("efa", KEY), ("boost", KEY)]) == [True, True, False]
    asked = (docker / "asked").read_text().split()
    assert sorted(asked) == sorted([r.ref("efa", KEY), r.ref("nccl", KEY), r.ref("boost", KEY)])
    # Another command (another Remote) asks anew.
    assert remote.Remote(repository="reg.io:5000/cache").holds([("efa", KEY)]) == [False]

"""The remote artifact cache: stage artifacts as images in an OCI registry.

An artifact lives at `<repository>/<stage>:<key hex>`. Credentials come from the user's
docker config, or from IMAGEFORGE_REGISTRY_USER / IMAGEFORGE_REGISTRY_PASSWORD, which are
written to a private temporary docker config for our docker calls only: they never reach
build arguments, labels, logs or images. An unreachable registry degrades to local-only.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from imageforge import log
from imageforge.cache import verified
from imageforge.cache.artifacts import key_hex
from imageforge.cmd import docker_binary, run
from imageforge.errors import CacheError, UsageError

if TYPE_CHECKING:
    from imageforge.cache import registryhttp

_REPOSITORY = re.compile(r"[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+")
# How long `docker buildx imagetools inspect` may take before the registry counts as down.
INSPECT_TIMEOUT = 30.0
_UNREACHABLE = ("connection refused", "no such host", "i/o timeout", "connection reset",
                "dial tcp", "server misbehaving", "eof", "503", "502", "500 internal")


_REFUSED = ("registry {host} refused our credentials; check IMAGEFORGE_REGISTRY_USER/"
            "IMAGEFORGE_REGISTRY_PASSWORD or `docker login`.")

# Registry questions in flight at once: planning, cache.pull and ci.generate all ask this many.
HOLDS_AT_ONCE = 4


class RemoteUnavailable(Exception):
    """The registry did not answer; callers fall back to the local cache."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Remote:
    repository: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # cache_trust = "verified": the cache directory whose records say which artifacts a
    # rebuild verified (cache/verified.py); only those are used. None: any artifact is.
    verified_in: Path | None = None
    # What the registry answered during this command, per (stage, key). A build asks again
    # under its key locks (another build may have stored a key meanwhile, which the local
    # store tells), and each question is a docker CLI run of a few tenths of a second: on a
    # fresh runner asking twice cost a build 1.5 s. Another build's push in between can only
    # turn an answer from no to yes, and a no here means only that this build makes it.
    answers: dict[tuple[str, str], bool] = dataclasses.field(
        default_factory=dict, compare=False, repr=False)
    # The registry's HTTP API, asked directly where it can be (registryhttp.py): made on the
    # first question, so a command that asks none does not import requests.
    _http: list[registryhttp.Client] = dataclasses.field(
        default_factory=list, compare=False, repr=False)
    _http_lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, compare=False, repr=False)
    # Why the registry did not answer this command, once it did not (warn_unavailable): the
    # build then goes on from the local cache alone and asks it nothing more.
    unreachable: list[str] = dataclasses.field(default_factory=list, compare=False, repr=False)

    @property
    def host(self) -> str:
        return self.repository.split("/", 1)[0]

    def ref(self, stage: str, key: str) -> str:
        return f"{self.repository}/{stage}:{key_hex(key)}"

    def exists(self, stage: str, key: str, *, timeout: float = INSPECT_TIMEOUT) -> bool:
        """Whether the registry holds an artifact of `key` this build may use: under
        cache_trust = "verified" only the one a rebuild verified (verified.py), and one
        replaced since is refused (NotReproducibleError). RemoteUnavailable when it cannot
        tell (also when docker has not answered within `timeout` seconds)."""
        served = self.digest(stage, key, timeout=timeout)
        if served is None or self.verified_in is None:
            return served is not None
        wanted = verified.verified_remote_digest(self.verified_in, key, self.repository)
        if wanted is None:
            log.warning(f"cache_trust = verified: {self.ref(stage, key)} was never verified by "
                        f"a rebuild, so it is not used; {stage} builds here (invoke verify "
                        f"--rebuild --remote {self.repository} verifies it).")
            return False
        if served != wanted:
            verified.refuse_replaced(stage, key, self.ref(stage, key), served, wanted)
        return True

    def digest(self, stage: str, key: str, *, timeout: float = INSPECT_TIMEOUT) -> str | None:
        """The manifest digest the registry serves for the artifact; None: it has none. Asked
        over HTTP, or where that cannot be done as docker would do it, by docker."""
        from imageforge.cache import registryhttp

        name = self.ref(stage, key).split("/", 1)[1].rpartition(":")[0]
        try:
            return self.http().manifest_digest(name, key_hex(key), timeout=timeout)
        except registryhttp.Unsupported:
            pass
        except registryhttp.Refused:
            raise CacheError(_REFUSED.format(host=self.host)) from None
        except registryhttp.Unavailable as why:
            raise RemoteUnavailable(str(why)) from None
        return self._docker_digest(stage, key, timeout)

    def http(self) -> registryhttp.Client:
        from imageforge.cache import registryhttp

        with self._http_lock:
            if not self._http:
                self._http.append(registryhttp.Client(self.host, self.env))
            return self._http[0]

    def _docker_digest(self, stage: str, key: str, timeout: float) -> str | None:
        proc = run([docker_binary(), "buildx", "imagetools", "inspect", self.ref(stage, key),
                    "--format", "{{json .Manifest.Digest}}"], timeout=timeout, env=self.env,
                   error=RemoteUnavailable,
                   timed_out=f"{self.host} did not answer within {timeout:g} s")
        if proc.returncode == 0:
            return str(json.loads(proc.stdout.decode()))
        error = proc.stderr.decode(errors="replace").strip().lower()
        if "not found" in error or "manifest unknown" in error:
            return None
        if any(word in error for word in _UNREACHABLE):
            raise RemoteUnavailable(error.splitlines()[-1] if error else "no answer")
        if "unauthorized" in error or "authorization failed" in error:
            raise CacheError(_REFUSED.format(host=self.host))
        raise RemoteUnavailable(error.splitlines()[-1] if error else "unknown error")

    def context(self, stage: str, key: str) -> str:
        """How BuildKit reads the artifact: under cache_trust = "verified" by the digest a
        rebuild verified, so BuildKit checks every blob it reads against it."""
        wanted = verified.verified_remote_digest(self.verified_in, key, self.repository) \
            if self.verified_in is not None else None
        ref = self.ref(stage, key)
        return f"docker-image://{ref}@{wanted}" if wanted else f"docker-image://{ref}"

    def holds(self, artifacts: Sequence[tuple[str, str]]) -> list[bool]:
        """Whether the registry holds each (stage, key), asking HOLDS_AT_ONCE at a time and
        only what this command has not asked yet; RemoteUnavailable when it cannot tell."""
        asking = [a for a in dict.fromkeys(artifacts) if a not in self.answers]
        with ThreadPoolExecutor(max_workers=HOLDS_AT_ONCE) as pool:
            self.answers.update(zip(asking, pool.map(lambda a: self.exists(*a), asking),
                                    strict=True))
        return [self.answers[artifact] for artifact in artifacts]


def check_repository(repository: str) -> str:
    # A value given wrong (--remote or imageforge.remote) is a usage error, exit 1; exit 9 is
    # for a cache that fails.
    if not _REPOSITORY.fullmatch(repository):
        raise UsageError(f"remote cache {repository!r} is not a registry repository like "
                         "'registry.example.com:5000/imageforge-cache'.")
    return repository


@contextmanager
def session(repository: str | None, environ: Mapping[str, str] | None = None, *,
            verified_in: Path | None = None) -> Iterator[Remote | None]:
    """A Remote for the duration of a command, with credentials from the environment
    placed in a private docker config that is deleted afterwards (`verified_in`: see
    Remote)."""
    if not repository:
        yield None
        return
    check_repository(repository)
    with credentials(repository.split("/", 1)[0], environ) as env:
        yield Remote(repository=repository, env=env, verified_in=verified_in)


@contextmanager
def credentials(hosts: str | Sequence[str], environ: Mapping[str, str] | None = None
                ) -> Iterator[dict[str, str]]:
    """Environment for docker calls that talk to `host`: a private DOCKER_CONFIG holding
    IMAGEFORGE_REGISTRY_USER/PASSWORD when they are set, else nothing (the user's own
    docker config and `docker login` apply)."""
    environ = os.environ if environ is None else environ
    user = environ.get("IMAGEFORGE_REGISTRY_USER")
    password = environ.get("IMAGEFORGE_REGISTRY_PASSWORD")
    if not (user and password):
        yield {}
        return
    with tempfile.TemporaryDirectory(prefix="imageforge-docker-") as tmp:
        config = Path(tmp)
        os.chmod(config, 0o700)
        _write_config(config, [hosts] if isinstance(hosts, str) else list(hosts), user,
                      password)
        yield {"DOCKER_CONFIG": str(config)}


def _write_config(config: Path, hosts: Sequence[str], user: str, password: str) -> None:
    """Our own docker config: the user's (for builders and other registries) plus these
    credentials for `host`."""
    home = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    data: dict[str, object] = {}
    if (home / "config.json").exists():
        try:
            data = json.loads((home / "config.json").read_text())
        except ValueError:
            data = {}
    auths = dict(data.get("auths") or {})  # type: ignore[call-overload]
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    helpers = dict(data.get("credHelpers") or {})  # type: ignore[call-overload]
    for host in hosts:
        auths[host] = {"auth": token}
        # A credential helper for this host would take precedence over our entry.
        helpers.pop(host, None)
    data["auths"] = auths
    data["credHelpers"] = helpers
    data.pop("credsStore", None)
    path = config / "config.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
    # Keep the user's builders, contexts and CLI plugins (buildx itself may live there)
    # visible under our config.
    for name in ("buildx", "contexts", "cli-plugins"):
        if (home / name).exists():
            (config / name).symlink_to(home / name)


def warn_unavailable(remote: Remote, why: str) -> None:
    remote.unreachable.append(why)
    log.warning(f"remote cache {remote.repository} is unreachable ({why}); continuing with "
                "the local cache only.")


def warn_push_failed(remote: Remote, count: int, why: str) -> None:
    log.warning(f"pushing {count} artifact(s) to the remote cache {remote.repository} failed "
                f"({why}); the build stands, push them later with "
                f"`invoke cache.push --remote {remote.repository}`.")

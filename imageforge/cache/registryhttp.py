"""Whether a registry holds a tag, asked over the registry's HTTP API (one HEAD of the manifest)
instead of a `docker buildx imagetools inspect` run each.

Each CLI run costs a few tenths of a second of process start-up, and a build on a fresh runner
asks about every artifact it may reuse. This client speaks the distribution API's token and
basic auth with the credentials docker itself would use (the docker config's `auths`, or its
credential helper). Where it cannot ask the way docker would (an identity token, a TLS
certificate only docker's own configuration trusts, no connection at all), it raises
Unsupported and the caller asks docker, whose answer and errors stay the reference.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import ssl
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imageforge.cmd import run

if TYPE_CHECKING:
    import requests

# What a tag may point at: an image or an index, in OCI and docker media types. The registry
# answers with the digest of what it serves, which is what imagetools reports as the manifest.
ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])
_LOOPBACK = re.compile(r"(localhost|127\.\d+\.\d+\.\d+|\[::1\])(:\d+)?")
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
# Manifests and image configs are small; a registry sending more is not answering the question.
MAX_DOCUMENT = 4 * 1024 * 1024


class Unsupported(Exception):
    """This question cannot be asked over HTTP the way docker would ask it."""


class Refused(Exception):
    """The registry refused the credentials (or their absence)."""


class Unavailable(Exception):
    """The registry answered with a server error or not within the time given."""


class Client:
    """Questions to one registry host, with docker's credentials for it. Thread-safe: the
    scheme and each repository's token are learnt once and shared."""

    def __init__(self, host: str, env: Mapping[str, str]) -> None:
        import requests

        self.host = host
        self.env = env
        self._session = requests.Session()
        # The system's certificate authorities, as docker trusts them (requests would use its
        # own bundle); a registry only docker's certs.d trusts falls back to docker.
        self._session.verify = ssl.get_default_verify_paths().cafile or True
        self._lock = threading.Lock()
        self._scheme: str | None = None
        self._credentials: tuple[str, str] | None = None
        self._credentials_read = False
        # The Authorization a repository's questions carry, once a challenge was answered:
        # "Basic ..." for the whole host, else a bearer token per repository.
        self._basic: str | None = None
        self._tokens: dict[str, str] = {}

    def manifest_digest(self, name: str, tag: str, *, timeout: float) -> str | None:
        """The digest the registry serves for `name:tag`; None when it has no such tag."""
        response = self._answer(f"/v2/{name}/manifests/{tag}", name, timeout, method="HEAD")
        if response is None:
            return None
        digest = response.headers.get("Docker-Content-Digest", "")
        if not digest.startswith("sha256:"):
            raise Unsupported("an answer without a digest")
        return digest

    def image_config(self, name: str, tag: str, *, platform: str, timeout: float
                     ) -> tuple[str, dict[str, Any]] | None:
        """The digest the registry serves for `name:tag` and the config of its image for
        `platform` (os/architecture[/variant]: an index's entry for it, its attestations
        skipped); None when it
        has no such tag. A document that does not match its digest, is too large or is not
        an image raises Unsupported: it proves nothing about the image."""
        digest, document = self._manifest(name, tag, timeout)
        if document is None:
            return None
        if "manifests" in document:
            chosen = [entry for entry in _list(document, "manifests")
                      if isinstance(entry, dict) and _platform(entry) == platform]
            if len(chosen) != 1 or not isinstance(chosen[0].get("digest"), str):
                raise Unsupported(f"{len(chosen)} {platform} images in {name}:{tag}'s index")
            _, document = self._manifest(name, chosen[0]["digest"], timeout)
            if document is None:
                raise Unsupported(f"{name}:{tag}'s index names a manifest the registry lacks")
        config = document.get("config")
        if not isinstance(config, dict) or not isinstance(config.get("digest"), str):
            raise Unsupported(f"{name}:{tag} is not an image manifest")
        body = self._document(f"/v2/{name}/blobs/{config['digest']}", name, timeout,
                              config["digest"])
        if body is None:
            raise Unsupported(f"{name}:{tag}'s config blob is missing")
        return digest, _object(body)

    def _manifest(self, name: str, reference: str, timeout: float
                  ) -> tuple[str, dict[str, Any] | None]:
        expected = reference if reference.startswith("sha256:") else None
        path = f"/v2/{name}/manifests/{reference}"
        response = self._answer(path, name, timeout, method="GET")
        if response is None:
            return "", None
        # A tag's answer is checked against the digest the registry says it serves, where it
        # says one; a digest's answer against that digest.
        digest = expected or response.headers.get("Docker-Content-Digest") or None
        body = _read_checked(response, digest)
        return digest or "sha256:" + hashlib.sha256(body).hexdigest(), _object(body)

    def _document(self, path: str, name: str, timeout: float, digest: str) -> bytes | None:
        response = self._answer(path, name, timeout, method="GET")
        return None if response is None else _read_checked(response, digest)

    def _answer(self, path: str, name: str, timeout: float, *, method: str
                ) -> requests.Response | None:
        """The registry's successful answer to `method path`, after its challenge if it
        sends one; None for 404."""
        response = self._request(path, name, timeout, method=method)
        if response.status_code == 401:
            response.close()
            response = self._request(path, name, timeout, challenge=response, method=method)
        if response.status_code in (401, 403):
            raise Refused(f"{response.status_code} {response.reason}")
        if response.status_code == 404:
            return None
        if response.status_code >= 500 or response.status_code == 429:
            raise Unavailable(f"{response.status_code} {response.reason}".lower())
        if response.status_code != 200:
            raise Unsupported(f"answer {response.status_code}")
        return response

    def _request(self, path: str, name: str, timeout: float, *,
                 challenge: requests.Response | None = None,
                 method: str = "HEAD") -> requests.Response:
        import requests

        headers = {"Accept": ACCEPT}
        if challenge is not None:
            headers["Authorization"] = self._authorization(challenge, name, timeout)
        elif self._basic or name in self._tokens:
            headers["Authorization"] = self._basic or self._tokens[name]
        for scheme in self._schemes():
            try:
                response = self._session.request(
                    method, f"{scheme}://{self.host}{path}", headers=headers,
                    timeout=timeout, allow_redirects=True, stream=method != "HEAD")
            except requests.exceptions.Timeout:
                raise Unavailable(f"{self.host} did not answer within {timeout:g} s") from None
            except (requests.exceptions.SSLError, requests.exceptions.ConnectionError) as error:
                last: Exception = error
                continue
            self._scheme = scheme
            return response
        raise Unsupported(f"no connection over HTTP: {last}")

    def _schemes(self) -> list[str]:
        # docker speaks HTTPS to every registry, and falls back to plain HTTP only for one
        # on the loopback interface (or configured insecure, which only docker knows).
        if self._scheme is not None:
            return [self._scheme]
        return ["https", "http"] if _LOOPBACK.fullmatch(self.host) else ["https"]

    def _authorization(self, challenge: requests.Response, name: str, timeout: float) -> str:
        import requests

        kind, _, params = challenge.headers.get("WWW-Authenticate", "").partition(" ")
        credentials = self._read_credentials()
        if kind.lower() == "basic":
            if credentials is None:
                raise Refused("the registry wants credentials and docker has none for it")
            user, secret = credentials
            self._basic = "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()
            return self._basic
        if kind.lower() != "bearer":
            raise Unsupported(f"authentication scheme {kind or 'none'}")
        fields = dict(_CHALLENGE.findall(params))
        if "realm" not in fields:
            raise Unsupported("a bearer challenge without a realm")
        query = {"scope": f"repository:{name}:pull"}
        if "service" in fields:
            query["service"] = fields["service"]
        try:
            answer = self._session.get(fields["realm"], params=query, auth=credentials,
                                       timeout=timeout)
        except requests.exceptions.Timeout:
            raise Unavailable(f"{self.host}'s token service did not answer within "
                              f"{timeout:g} s") from None
        except requests.RequestException as error:
            raise Unsupported(f"token service: {error}") from None
        if answer.status_code in (401, 403):
            raise Refused(f"token service: {answer.status_code} {answer.reason}")
        try:
            body = answer.json()
            token = str(body.get("token") or body.get("access_token") or "")
        except (ValueError, AttributeError):
            token = ""
        if answer.status_code != 200 or not token:
            raise Unsupported(f"token service answered {answer.status_code} without a token")
        with self._lock:
            self._tokens[name] = f"Bearer {token}"
        return self._tokens[name]

    def _read_credentials(self) -> tuple[str, str] | None:
        with self._lock:
            if not self._credentials_read:
                self._credentials = docker_credentials(self.host, self.env)
                self._credentials_read = True
            return self._credentials


def docker_credentials(host: str, env: Mapping[str, str]) -> tuple[str, str] | None:
    """(user, secret) docker would send to `host`, from the docker config `env` names (else
    the user's own); None when it has none."""
    home = Path(env.get("DOCKER_CONFIG") or os.environ.get("DOCKER_CONFIG")
                or Path.home() / ".docker")
    try:
        config = json.loads((home / "config.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise Unsupported(f"docker config: {error}") from None
    if not isinstance(config, dict):
        raise Unsupported("docker config is not an object")
    helper = (config.get("credHelpers") or {}).get(host) or config.get("credsStore")
    if helper:
        return _from_helper(str(helper), host, env)
    entry = (config.get("auths") or {}).get(host)
    if not isinstance(entry, dict):
        return None
    if entry.get("identitytoken") or entry.get("registrytoken"):
        raise Unsupported("an identity token")
    if entry.get("auth"):
        try:
            user, sep, secret = base64.b64decode(str(entry["auth"])).decode().partition(":")
        except ValueError:      # not base64, or not UTF-8
            sep = ""
        if not sep:
            raise Unsupported("an auth entry that is not user:password")
        return user, secret
    if entry.get("username") and entry.get("password"):
        return str(entry["username"]), str(entry["password"])
    return None


def _from_helper(helper: str, host: str, env: Mapping[str, str]) -> tuple[str, str] | None:
    # A helper that is missing or hangs raises Unsupported: docker then decides.
    proc = run([f"docker-credential-{helper}", "get"], input=host.encode(), env=env,
               timeout=30, error=Unsupported,
               timed_out=f"credential helper {helper} did not answer")
    if proc.returncode != 0:
        if b"credentials not found" in proc.stdout + proc.stderr:
            return None
        raise Unsupported(f"credential helper {helper} failed")
    try:
        answer = json.loads(proc.stdout)
        user, secret = str(answer["Username"]), str(answer["Secret"])
    except (ValueError, KeyError, TypeError):
        raise Unsupported(f"credential helper {helper} answered no credentials") from None
    if user == "<token>":
        raise Unsupported("an identity token")
    return user, secret


def _read_checked(response: requests.Response, digest: str | None) -> bytes:
    """The body of `response`, at most MAX_DOCUMENT bytes, whose sha256 is `digest` (any
    body when None)."""
    import requests

    body = bytearray()
    try:
        for chunk in response.iter_content(65536):
            body += chunk
            if len(body) > MAX_DOCUMENT:
                raise Unsupported(f"a document over {MAX_DOCUMENT} bytes")
    except requests.RequestException as error:
        raise Unavailable(f"the answer broke off: {error}") from None
    finally:
        response.close()
    if digest is not None and digest != "sha256:" + hashlib.sha256(body).hexdigest():
        raise Unsupported(f"a document that is not {digest}")
    return bytes(body)


def _object(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except ValueError:
        raise Unsupported("a document that is not JSON") from None
    if not isinstance(document, dict):
        raise Unsupported("a document that is not a JSON object")
    return document


def _list(document: dict[str, Any], key: str) -> list[Any]:
    value = document.get(key)
    return value if isinstance(value, list) else []


def _platform(entry: dict[str, Any]) -> str:
    found = entry.get("platform")
    if not isinstance(found, dict):
        return ""
    parts = [found.get("os"), found.get("architecture"), found.get("variant")]
    return "/".join(str(part) for part in parts if part)

"""An image's manifest and blobs straight from its registry (the OCI distribution API's GETs, through
requests), for the common pull; skopeo (skopeo.py) stays the authority for everything else.
See docs/adr/0092-blobs-fetched-in-the-agent-skopeo-for-the-rest.md.

Handled here: anonymous pulls, Basic auth and Bearer-token auth with a username and password, an OCI
manifest or index, blob answers that redirect (requests drops the Authorization header on a redirect to
another host). Each blob is hashed as it streams and is renamed into the shared blob directory only once
its sha256 and size match. Anything else raises Deferred and the store pulls through skopeo as before:
a Docker schema 2 manifest (skopeo converts it to OCI for umoci), an identity token or another auth
scheme, any HTTP error or connection failure (skopeo then names it: not found, unauthorized,
unreachable). Like skopeo here, nothing of the node's environment is used: no proxy variables, no
~/.netrc, only the attempt's own credentials.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import socket
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import orjson

from .pull_errors import DigestMismatch
from .skopeo import DOCKER_HUB, ImageReference, RegistryCredentials

if TYPE_CHECKING:
    import requests

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
ACCEPT = ", ".join((OCI_MANIFEST, "application/vnd.oci.image.index.v1+json",
                    "application/vnd.docker.distribution.manifest.v2+json",
                    "application/vnd.docker.distribution.manifest.list.v2+json"))
CHUNK = 1 << 20
SYSTEM_CAS = Path("/etc/ssl/certs/ca-certificates.crt")
"""The host's CA bundle (what skopeo trusts), rather than requests' certifi copy: an operator's registry
signed by a private CA installed on the host verifies here as it does for skopeo."""
_PARAM = re.compile(r'(\w+)="([^"]*)"')


class Deferred(Exception):
    """This pull goes through skopeo instead; the message says why."""


@dataclass(frozen=True, slots=True)
class Blob:
    digest: str
    size: int


@dataclass(slots=True)
class Distribution:
    """How this node fetches blobs itself. `insecure` as Skopeo's: those registries are tried over TLS
    without verification, then plain HTTP (the scheme that answered is remembered)."""

    insecure: frozenset[str] = frozenset()
    connect_timeout: float = 30.0
    workers: int = 6
    """Blobs fetched at once (skopeo's default too)."""
    _schemes: dict[str, str] = field(default_factory=dict)

    @contextlib.contextmanager
    def session(self, ref: ImageReference, credentials: RegistryCredentials | None) -> Iterator[RegistrySession]:
        session = RegistrySession(self, ref, _login(ref.registry, credentials or RegistryCredentials()))
        try:
            yield session
        finally:
            session.close()


class RegistrySession:
    """One pull's conversation with the registry: its scheme, its token, its open blob answers."""

    def __init__(self, owner: Distribution, ref: ImageReference, login: tuple[str, str] | None) -> None:
        # here, not at the top: the agent imports this module at start, and an idle agent's RSS counts
        # (inputs.py does the same)
        import requests  # noqa: PLC0415
        import urllib3  # noqa: PLC0415

        self.owner, self.ref, self.login = owner, ref, login
        self._failures: tuple[type[Exception], ...] = (requests.RequestException, urllib3.exceptions.HTTPError)
        self._json_failures: tuple[type[Exception], ...] = (requests.RequestException, orjson.JSONDecodeError)
        self.http = requests.Session()
        self.http.trust_env = False  # no proxies, no ~/.netrc: only this attempt's credentials
        adapter = requests.adapters.HTTPAdapter(pool_maxsize=owner.workers)
        self.http.mount("https://", adapter)
        self.http.mount("http://", adapter)
        self.host = "registry-1.docker.io" if ref.registry == DOCKER_HUB else ref.registry
        self.scheme = owner._schemes.get(ref.registry, "")
        self.http.verify = str(SYSTEM_CAS) if SYSTEM_CAS.exists() else True
        if ref.registry in owner.insecure:
            self.http.verify = False
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # the operator asked for it
        self.aborted = threading.Event()
        self._lock = threading.Lock()
        self._open: set[requests.Response] = set()

    def manifest(self) -> tuple[bytes, str]:
        """The manifest (or index) bytes as served for the pinned digest, and its media type."""
        with self._get(f"manifests/{self.ref.digest}", {"Accept": ACCEPT}, stream=False) as answer:
            kind = str(orjson.loads(answer.content).get("mediaType") or
                       answer.headers.get("Content-Type", "").split(";")[0].strip())
            return answer.content, kind

    def fetch(self, blobs: Sequence[Blob], staging: Path, place: Callable[[Blob], Path],
              add: Callable[[int], None]) -> None:
        """Every blob into `place(blob)`, `workers` at a time, each verified before it is renamed there;
        the first failure aborts the others and is raised."""
        if not blobs:
            return
        with ThreadPoolExecutor(min(self.owner.workers, len(blobs)), thread_name_prefix="nodus-pull") as pool:
            futures = [pool.submit(self._blob, b, staging / f"{b.digest.removeprefix('sha256:')}.part", place(b), add)
                       for b in sorted(blobs, key=lambda b: -b.size)]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                self.abort()
                wait(futures)
                mismatch = [f for f in futures if isinstance(f.exception(), DigestMismatch)]
                raise (mismatch or failed)[0].exception()  # type: ignore[misc]

    def abort(self) -> None:
        """Stops every blob answer being read (from another thread: the stall watch, a failed sibling)."""
        self.aborted.set()
        with self._lock:
            answers = list(self._open)
        for answer in answers:
            connection = answer.raw.connection
            sock = getattr(connection, "sock", None) if connection is not None else None
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked read

    def close(self) -> None:
        self.http.close()

    def _blob(self, blob: Blob, part: Path, dest: Path, add: Callable[[int], None]) -> None:
        answer = self._get(f"blobs/{blob.digest}", {}, stream=True)
        with self._lock:
            self._open.add(answer)
        h, got = hashlib.sha256(), 0
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            with open(fd, "wb", buffering=0) as f:
                while got <= blob.size and (chunk := answer.raw.read(CHUNK, decode_content=False)):
                    h.update(chunk)
                    f.write(chunk)
                    got += len(chunk)
                    add(len(chunk))
                os.fsync(fd)  # as skopeo does: the blob is on disk before its name says it is complete
        except self._failures as e:
            raise Deferred(f"{blob.digest}: {'aborted' if self.aborted.is_set() else e}") from None
        finally:
            with self._lock:
                self._open.discard(answer)
            answer.close()
        if self.aborted.is_set():
            raise Deferred(f"{blob.digest}: aborted")
        if got != blob.size or "sha256:" + h.hexdigest() != blob.digest:
            part.unlink(missing_ok=True)
            raise DigestMismatch(f"{self.ref}: the registry served a blob whose sha256 differs from its digest "
                                 f"{blob.digest} ({got} bytes of {blob.size}); push the image again")
        os.replace(part, dest)

    def _get(self, path: str, headers: dict[str, str], stream: bool) -> requests.Response:
        """GET /v2/<repository>/<path>, authenticating once on a 401; Deferred on anything but a 200."""
        answer = self._send(path, headers, stream)
        if answer.status_code == 401:
            challenge = answer.headers.get("WWW-Authenticate", "")
            answer.close()
            self._authenticate(challenge)
            answer = self._send(path, headers, stream)
        if answer.status_code != 200:
            answer.close()
            raise Deferred(f"{path} answered HTTP {answer.status_code}")
        return answer

    def _send(self, path: str, headers: dict[str, str], stream: bool) -> requests.Response:
        if self.aborted.is_set():
            raise Deferred("aborted")
        timeout = (self.owner.connect_timeout, None)  # the store's stall watch ends a silent answer
        schemes = [self.scheme] if self.scheme else \
            (["https", "http"] if self.ref.registry in self.owner.insecure else ["https"])
        for i, scheme in enumerate(schemes):
            url = f"{scheme}://{self.host}/v2/{self.ref.repository}/{path}"
            try:
                answer = self.http.get(url, headers=headers, stream=stream, timeout=timeout)
            except self._failures as e:
                if i + 1 < len(schemes):
                    continue
                raise Deferred(f"{url}: {e}") from None
            self.scheme = self.owner._schemes[self.ref.registry] = scheme
            return answer
        raise Deferred("no scheme")  # not reached: the loop returns or raises

    def _authenticate(self, challenge: str) -> None:
        scheme, _, rest = challenge.partition(" ")
        params = dict(_PARAM.findall(rest))
        if scheme.lower() == "basic" and self.login:
            self.http.auth = self.login
            return
        if scheme.lower() != "bearer" or "realm" not in params:
            raise Deferred(f"the registry asks for {scheme or 'an unknown'} authentication")
        query = {"service": params.get("service", ""),
                 "scope": params.get("scope") or f"repository:{self.ref.repository}:pull"}
        try:
            with self.http.get(params["realm"], params=query, auth=self.login,
                               timeout=(self.owner.connect_timeout, self.owner.connect_timeout)) as answer:
                body: dict[str, Any] = orjson.loads(answer.content) if answer.status_code == 200 else {}
        except self._json_failures as e:
            raise Deferred(f"the token service failed: {e}") from None
        token = body.get("token") or body.get("access_token")
        if not token:
            raise Deferred("the token service refused")
        self.http.headers["Authorization"] = f"Bearer {token}"


def _login(registry: str, credentials: RegistryCredentials) -> tuple[str, str] | None:
    """The username and password for `registry`; Deferred for what skopeo alone reads (identity tokens,
    a docker config that does not parse)."""
    if credentials.username:
        return credentials.username, credentials.password
    if not credentials.docker_config:
        return None
    try:
        auths = orjson.loads(credentials.docker_config)["auths"]
        hosts = {_host(key): entry for key, entry in auths.items()}
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise Deferred("a docker config skopeo reads") from None
    names = {registry, "index.docker.io", "registry-1.docker.io"} if registry == DOCKER_HUB else {registry}
    entry = next((hosts[n] for n in names if n in hosts), None)
    if not isinstance(entry, dict):
        return None
    if entry.get("identitytoken") or entry.get("registrytoken"):
        raise Deferred("an identity token")
    if entry.get("auth"):
        try:
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            raise Deferred("an auth entry skopeo reads") from None
        return user, password
    if entry.get("username"):
        return str(entry["username"]), str(entry.get("password", ""))
    return None


def _host(key: str) -> str:
    """A docker config's key ("host", "https://host/v1/") as a host."""
    return key.split("://", 1)[-1].split("/", 1)[0]

"""Registry traffic through skopeo (the distribution protocol, its token auth, blob digests checked as
they stream): image references, registry credentials in a 0600 file, and the two calls the image
store makes when a pull is not fetched by the agent itself (distribution.py defers it: ADR 0092). See
docs/adr/0019-oci-images.md for why skopeo rather than a Python client.

skopeo runs with a private HOME, an authfile of only the attempt's credentials (empty when it has
none) and no XDG variables, so a customer's pull never borrows credentials someone left on the node.
"""
from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import orjson

from .pull_errors import ImagePullError, InvalidReference, Unreachable, classify

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_NAME = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
DOCKER_HUB = "docker.io"


@dataclass(frozen=True, slots=True)
class ImageReference:
    """`registry/repository@sha256:...` (a tag, when written, is kept only for messages)."""

    registry: str
    repository: str
    digest: str = ""
    tag: str = ""

    @classmethod
    def parse(cls, text: str) -> ImageReference:
        """Docker's rules: a first component with a dot, a colon or `localhost` is the registry, else
        Docker Hub (whose single names live under `library/`)."""
        rest, _, digest = text.strip().partition("@")
        if digest and not DIGEST.match(digest):
            raise InvalidReference(f"{text}: the digest must be sha256: and 64 lowercase hex digits")
        first, slash, remainder = rest.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, remainder
        else:
            registry, path = DOCKER_HUB, rest
        tag = ""
        if ":" in path.rsplit("/", 1)[-1]:
            path, tag = path.rsplit(":", 1)
        if registry == DOCKER_HUB and "/" not in path:
            path = f"library/{path}"
        if not _NAME.match(path):
            raise InvalidReference(f"{text}: {path!r} is not a repository name (lowercase, digits, . _ - and /)")
        return cls(registry, path, digest, tag)

    def pinned(self) -> str:
        """The reference skopeo pulls: by digest only, so every attempt runs the same bytes."""
        if not self.digest:
            raise InvalidReference(f"{self}: the agent pulls only by digest (registry/repo@sha256:...); "
                                   "the coordinator pins the tag at admission")
        return f"{self.registry}/{self.repository}@{self.digest}"

    def with_digest(self, digest: str) -> ImageReference:
        return ImageReference(self.registry, self.repository, digest, self.tag)

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}" + (f":{self.tag}" if self.tag else "") + \
            (f"@{self.digest}" if self.digest else "")


@dataclass(frozen=True, slots=True)
class RegistryCredentials:
    """What an imagePullSecret holds: a docker config JSON (`.dockerconfigjson`) or a username and password."""

    docker_config: bytes = b""
    username: str = ""
    password: str = ""

    def __repr__(self) -> str:  # never the password or the config's tokens in a log line
        return f"RegistryCredentials(username={self.username!r}, docker_config={bool(self.docker_config)})"

    @classmethod
    def from_logins(cls, logins: Iterable[tuple[str, str, str]]) -> RegistryCredentials:
        """From the Assignment's image_pull_credentials: (registry, username, password) per registry."""
        auths = {registry: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}
                 for registry, user, password in logins}
        return cls(docker_config=orjson.dumps({"auths": auths})) if auths else cls()

    def authfile(self, registry: str) -> bytes:
        """The containers-auth.json (docker config) skopeo reads for `registry`."""
        if self.docker_config:
            try:
                parsed = orjson.loads(self.docker_config)
            except orjson.JSONDecodeError as e:
                raise InvalidReference(f"imagePullSecrets: the docker config is not JSON ({e}); "
                                       "store the output of `docker login` as .dockerconfigjson") from None
            if not isinstance(parsed, dict) or not isinstance(parsed.get("auths"), dict):
                raise InvalidReference('imagePullSecrets: the docker config has no "auths" object')
            return self.docker_config
        if not self.username:
            return b'{"auths": {}}'
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return orjson.dumps({"auths": {registry: {"auth": token}}})


@dataclass(frozen=True, slots=True)
class RunningCopy:
    """A `skopeo copy` under way."""

    proc: subprocess.Popen[bytes]
    what: str

    def wait(self, timeout: float | None = None) -> None:
        """Until the copy ends (or `timeout` seconds); raises its typed failure."""
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Unreachable(f"{self.what}: the registry did not answer within {timeout:.0f}s") from None
        if self.proc.returncode != 0:
            raise classify(err.decode(errors="replace"), self.what)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


@dataclass(frozen=True, slots=True)
class Skopeo:
    """How this node talks to registries. `insecure` lists registries (host:port) reached over plain
    HTTP or with unverified TLS, as Docker's `insecure-registries` does; every other one needs TLS."""

    insecure: frozenset[str] = frozenset()
    timeout: float = 600.0
    """For a manifest and a blocking `copy`; a `copying` caller watches the bytes instead."""
    binary: str = "skopeo"

    def manifest(self, ref: ImageReference, credentials: RegistryCredentials | None = None) -> bytes:
        """The raw manifest (or index) the registry serves for `ref`, exactly as its digest covers it."""
        with self._session(ref, credentials) as (authfile, env):
            return self._run(["inspect", "--raw", *self._tls(ref, "--tls-verify"), "--authfile", authfile,
                              f"docker://{self._address(ref)}"], env, str(ref)).stdout

    def copy(self, ref: ImageReference, layout: Path, tag: str, shared_blobs: Path,
             credentials: RegistryCredentials | None = None) -> None:
        """Pulls `ref` into the OCI layout `layout:tag` within `timeout` seconds; see `copying`."""
        with self.copying(ref, layout, tag, shared_blobs, credentials) as running:
            running.wait(self.timeout)

    @contextlib.contextmanager
    def copying(self, ref: ImageReference, layout: Path, tag: str, shared_blobs: Path,
                credentials: RegistryCredentials | None = None) -> Iterator[RunningCopy]:
        """A copy of `ref` into the OCI layout `layout:tag` running for the block (killed if the block
        leaves before `wait`), its blobs into `shared_blobs` (content-addressed, one directory for every
        image, so a layer already there is not fetched again). skopeo copies layers in parallel and
        refuses a blob whose bytes do not match its digest."""
        with self._session(ref, credentials) as (authfile, env):
            args = [self.binary, "--insecure-policy", "copy", "--quiet", *self._tls(ref, "--src-tls-verify"),
                    "--src-authfile", authfile, "--dest-shared-blob-dir", str(shared_blobs),
                    f"docker://{ref.pinned()}", f"oci:{layout}:{tag}"]
            try:
                proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
            except FileNotFoundError:
                raise ImagePullError(f"{ref}: {self.binary} is not installed on this node (scripts/setup)") from None
            try:
                yield RunningCopy(proc, str(ref))
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                if proc.stderr:
                    proc.stderr.close()

    def _address(self, ref: ImageReference) -> str:
        return f"{ref.registry}/{ref.repository}" + (f"@{ref.digest}" if ref.digest else f":{ref.tag or 'latest'}")

    def _tls(self, ref: ImageReference, flag: str) -> list[str]:
        return [f"{flag}=false"] if ref.registry in self.insecure else []

    @contextlib.contextmanager
    def _session(self, ref: ImageReference,
                 credentials: RegistryCredentials | None) -> Iterator[tuple[str, dict[str, str]]]:
        """A private directory holding the 0600 authfile and skopeo's HOME, removed after the call."""
        private = Path(tempfile.mkdtemp(prefix="nodus-pull-"))  # mkdtemp makes it 0700
        try:
            authfile = private / "auth.json"
            fd = os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write((credentials or RegistryCredentials()).authfile(ref.registry))
            env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "HOME": str(private),
                   "TMPDIR": str(private)}
            yield str(authfile), env
        finally:
            shutil.rmtree(private, ignore_errors=True)

    def _run(self, args: list[str], env: dict[str, str], what: str) -> subprocess.CompletedProcess[bytes]:
        # Digest pinning is the trust model (the coordinator pins, the agent verifies); signature
        # policy is the operator's registry's business, so no policy.json is consulted.
        try:
            done = subprocess.run([self.binary, "--insecure-policy", *args], capture_output=True, env=env,
                                  timeout=self.timeout)
        except FileNotFoundError:
            raise ImagePullError(f"{what}: {self.binary} is not installed on this node (scripts/setup)") from None
        except subprocess.TimeoutExpired:
            raise Unreachable(f"{what}: the registry did not answer within {self.timeout:.0f}s") from None
        if done.returncode != 0:
            raise classify(done.stderr.decode(errors="replace"), what)
        return done

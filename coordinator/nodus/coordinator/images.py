"""Admission's image resolution: `spec.image` (a tag or a digest) -> the manifest digest every attempt
of the Job runs, for the nodes' platform, and the user its config runs as (`status.image`).

Through skopeo, as the agent pulls (docs/adr/0019-oci-images.md): `inspect --raw` of the reference,
the platform's entry of an index (manifest list), then the config blob; each checked against its
digest. Credentials come from the Job's imagePullSecrets (a `.dockerconfigjson` key, or `username`
and `password`) in a 0600 authfile removed after the call. Failures are typed; `refusal` turns one
into the API error admission returns, naming the field and the fix.

The agent and the coordinator never import each other, so the small reference parser and skopeo's
error table here mirror nodus.agent.oci.skopeo and pull_errors.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import orjson

from . import errors

if TYPE_CHECKING:
    from .operator_registry import OperatorRegistry

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
DOCKER_HUB = "docker.io"


class ImageRefused(Exception):
    """The image cannot be resolved; `reason` is the stable code, `fix` what the user should do."""

    reason = "ImageUnresolved"
    fix = "check spec.image"
    field = "spec.image"
    """The field admission names (a sidecar's image passes its own path to `refusal`)."""

    def __init__(self, image: str, detail: str, fix: str | None = None) -> None:
        super().__init__(f"{image}: {detail}")
        self.image, self.detail = image, detail
        self.fix = fix or type(self).fix


class ImageNotFound(ImageRefused):
    reason = "ImageNotFound"
    fix = "check the repository and tag in spec.image (`skopeo list-tags docker://REPO` lists the tags)"


class ImageUnauthorized(ImageRefused):
    reason = "ImageUnauthorized"
    fix = "name a Secret in spec.imagePullSecrets whose credentials can pull the image"


class BadImageReference(ImageRefused):
    reason = "InvalidImageReference"
    fix = "write spec.image as registry/repository[:tag][@sha256:<64 hex>]"


class BadPullSecret(ImageRefused):
    """An imagePullSecret without usable credentials (`image` is then the Secret's name)."""

    reason = "InvalidImagePullSecret"
    fix = "put registry credentials in the Secret under .dockerconfigjson, or username and password"
    field = "spec.imagePullSecrets"


class ImageOfAnotherProject(ImageRefused):
    """An image in the operator's registry under another project's namespace."""

    reason = "ImageOfAnotherProject"
    fix = "name an image your project pushed (`nodus image ls` lists them), or push it with `nodus image push`"


class RegistryUnreachable(ImageRefused):
    reason = "ImageRegistryUnreachable"
    fix = "retry shortly; if it persists, check that the coordinator reaches the registry"


@dataclass(frozen=True, slots=True)
class RegistryCredentials:
    """One imagePullSecret's credentials."""

    docker_config: bytes = b""
    username: str = ""
    password: str = ""

    def __repr__(self) -> str:  # never a password or token in a log line
        return f"RegistryCredentials(username={self.username!r}, docker_config={bool(self.docker_config)})"

    @classmethod
    def from_secret(cls, name: str, data: Mapping[str, bytes]) -> RegistryCredentials:
        """From a Secret's decoded data: `.dockerconfigjson` (what `docker login` writes), else
        `username` and `password` (Kubernetes' basic-auth keys)."""
        if ".dockerconfigjson" in data:
            config = bytes(data[".dockerconfigjson"])
            try:
                parsed = orjson.loads(config)
            except orjson.JSONDecodeError:
                parsed = None
            if not isinstance(parsed, dict) or not isinstance(parsed.get("auths"), dict):
                raise BadPullSecret(name, 'its .dockerconfigjson is not a docker config (JSON with an "auths" object)')
            return cls(docker_config=config)
        if "username" in data and "password" in data:
            return cls(username=data["username"].decode(), password=data["password"].decode())
        raise BadPullSecret(name, "holds neither .dockerconfigjson nor username and password")

    def logins(self, registry: str) -> list[tuple[str, str, str]]:
        """(registry, username, password) for each registry these credentials log in to, as the
        Assignment's image_pull_credentials carry them; a username/password pair logs in to `registry`
        (the image's)."""
        if not self.docker_config:
            return [(registry, self.username, self.password)] if self.username else []
        found = []
        for host, entry in (orjson.loads(self.docker_config).get("auths") or {}).items():
            if not isinstance(entry, dict):
                continue
            user, password = str(entry.get("username") or ""), str(entry.get("password") or "")
            if entry.get("auth"):
                user, _, password = base64.b64decode(str(entry["auth"])).decode(errors="replace").partition(":")
            if user:
                found.append((_registry_host(host), user, password))
        return found

    def authfile(self, registry: str) -> bytes:
        if self.docker_config:
            return self.docker_config
        if not self.username:
            return b'{"auths": {}}'
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return orjson.dumps({"auths": {registry: {"auth": token}}})


@dataclass(frozen=True, slots=True)
class ResolvedImage:
    """What `status.image` records."""

    reference: str
    """As written in spec.image."""
    digest: str
    """The platform's image manifest digest (never an index's)."""
    user: str
    """The config's user ("root" when it names none)."""

    @property
    def pinned(self) -> str:
        """What the agent pulls: registry/repository@digest."""
        return f"{_split(self.reference)[0]}/{_split(self.reference)[1]}@{self.digest}"

    def as_status(self) -> dict[str, str]:
        return {"reference": self.reference, "digest": self.digest, "user": self.user}


@dataclass(frozen=True, slots=True)
class ImageResolver:
    """`insecure` lists registries (host:port) reached over plain HTTP, as the agents' own list does.
    `operator` is the operator's registry: its images resolve with its credentials, and only for the
    project whose namespace they are in (docs/adr/0032-image-push.md)."""

    insecure: frozenset[str] = frozenset()
    operator: OperatorRegistry | None = None
    os: str = "linux"
    architecture: str = "amd64"
    timeout: float = 30.0
    binary: str = "skopeo"

    async def resolve(self, image: str, credentials: RegistryCredentials | None = None,
                      project: str | None = None) -> ResolvedImage:
        """`project`: the Job's; an image in another project's namespace of the operator's registry is
        refused (None skips the check: `nodus image push` verifying what it pushed)."""
        registry, repository, tag, digest = _split(image)
        operator = self.operator
        if operator is not None and operator.holds(image):
            owner = operator.project_of(image)
            if project is not None and owner != project:
                raise ImageOfAnotherProject(image, f"the operator's registry keeps this image for project "
                                            f"{owner or '(none)'!s}, not {project}")
            credentials = operator.credentials
        base = f"{registry}/{repository}"
        raw = await self._inspect(registry, f"{base}@{digest}" if digest else f"{base}:{tag or 'latest'}",
                                  credentials, image)
        got = _sha(raw)
        if digest and got != digest:
            raise ImageRefused(image, f"the registry served a manifest whose digest is {got}",
                               "push the image again; its registry serves bytes that do not match the digest")
        manifest = _json(raw, image)
        if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
            got = self._platform_entry(manifest, image)
            raw = await self._inspect(registry, f"{base}@{got}", credentials, image)
            if _sha(raw) != got:
                raise ImageRefused(image, f"the registry served a manifest whose digest is {_sha(raw)}")
            manifest = _json(raw, image)
        config_digest = str((manifest.get("config") or {}).get("digest") or "")
        config_raw = await self._inspect(registry, f"{base}@{got}", credentials, image, config=True)
        if config_digest and _sha(config_raw) != config_digest:
            raise ImageRefused(image, f"the registry served a config whose digest is {_sha(config_raw)}")
        user = str((_json(config_raw, image).get("config") or {}).get("User") or "root")
        return ResolvedImage(image, got, user)

    def _platform_entry(self, index: dict[str, Any], image: str) -> str:
        for entry in index.get("manifests") or ():
            platform = entry.get("platform") or {}
            if platform.get("os") == self.os and platform.get("architecture") == self.architecture:
                return str(entry["digest"])
        raise ImageNotFound(image, f"the image has no {self.os}/{self.architecture} manifest",
                            f"build and push spec.image for {self.os}/{self.architecture}")

    async def _inspect(self, registry: str, address: str, credentials: RegistryCredentials | None, image: str,
                       config: bool = False) -> bytes:
        with private_authfile(registry, credentials) as (authfile, env):
            plain = registry in self.insecure or (self.operator is not None and self.operator.host == registry
                                                  and self.operator.insecure)
            tls = ["--tls-verify=false"] if plain else []
            args = [self.binary, "--insecure-policy", "inspect", "--raw", *(["--config"] if config else []), *tls,
                    "--authfile", authfile, f"docker://{address}"]
            try:
                proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE,
                                                            stderr=asyncio.subprocess.PIPE, env=env)
            except FileNotFoundError:
                raise RegistryUnreachable(image, f"{self.binary} is not installed on the coordinator",
                                          "install skopeo on the coordinator's host (scripts/setup)") from None
            try:
                async with asyncio.timeout(self.timeout):
                    out, err = await proc.communicate()
            except TimeoutError:
                proc.kill()
                await proc.wait()
                raise RegistryUnreachable(image, f"the registry did not answer within {self.timeout:.0f}s") from None
        if proc.returncode != 0:
            raise classify(err.decode(errors="replace"), image)
        return out


def refusal(e: ImageRefused, kind: str, name: str, path: str | None = None) -> errors.NodusError:
    """The API error admission returns: a 422 naming `path` and the fix for the image's own faults, a 503
    to retry when the registry could not be reached."""
    if isinstance(e, RegistryUnreachable):
        return errors.NodusError("ServiceUnavailable", str(e), fix=e.fix, retry_after=10)
    return errors.invalid(kind, name, [errors.invalid_value(path or e.field, e.image, f"{e.reason}: {e.detail}")], fix=e.fix)


_PATTERNS: tuple[tuple[re.Pattern[str], type[ImageRefused]], ...] = (
    (re.compile(r"unauthorized|authentication required|(?<!permission )denied|403 forbidden", re.I), ImageUnauthorized),
    (re.compile(r"manifest unknown|name unknown|not found|404", re.I), ImageNotFound),
    (re.compile(r"connection refused|no such host|i/o timeout|timeout|network is unreachable|connection reset|"
                r"tls: |server gave HTTP response to HTTPS client|pinging container registry", re.I),
     RegistryUnreachable),
)


def classify(stderr: str, image: str) -> ImageRefused:
    found = re.findall(r'msg="((?:[^"\\]|\\.)*)"', stderr)
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    detail = found[-1].replace('\\"', '"') if found else (lines[-1] if lines else "skopeo failed without a message")
    for pattern, kind in _PATTERNS:
        if pattern.search(detail):
            return kind(image, detail)
    return ImageRefused(image, detail)


def registry_of(image: str) -> str:
    """The registry host (host[:port]) an image reference pulls from: Docker Hub when it names none."""
    return _split(image)[0]


def repository_of(image: str) -> str:
    """The repository path of an image reference (without registry, tag or digest)."""
    return _split(image)[1]


def _split(image: str) -> tuple[str, str, str, str]:
    """(registry, repository, tag, digest) by Docker's rules (Docker Hub when no registry is named)."""
    rest, _, digest = image.strip().partition("@")
    if digest and not DIGEST.match(digest):
        raise BadImageReference(image, "the digest must be sha256: and 64 lowercase hex digits")
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
    if not re.fullmatch(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*", path):
        raise BadImageReference(image, f"{path!r} is not a repository name (lowercase, digits, . _ - and /)")
    if tag and not re.fullmatch(r"[\w][\w.-]{0,127}", tag):
        raise BadImageReference(image, f"{tag!r} is not a tag (letters, digits, _ . -, at most 128)")
    return registry, path, tag, digest


def _registry_host(key: str) -> str:
    """A docker config's auths key as host[:port]; `docker login` writes Docker Hub as its v1 URL."""
    if "index.docker.io" in key:
        return DOCKER_HUB
    return key.removeprefix("https://").removeprefix("http://").split("/", 1)[0]


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(raw: bytes, image: str) -> dict[str, Any]:
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ImageRefused(image, "the registry served something that is not a JSON manifest")
    return parsed


@contextlib.contextmanager
def private_authfile(registry: str, credentials: RegistryCredentials | None) -> Iterator[tuple[str, dict[str, str]]]:
    """A 0700 directory holding the 0600 authfile and skopeo's HOME, removed after the call."""
    private = Path(tempfile.mkdtemp(prefix="nodus-resolve-"))
    try:
        authfile = private / "auth.json"
        fd = os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write((credentials or RegistryCredentials()).authfile(registry))
        yield str(authfile), {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "HOME": str(private),
                              "TMPDIR": str(private)}
    finally:
        shutil.rmtree(private, ignore_errors=True)

"""`nodus image push` and `nodus image ls`, the coordinator's half (docs/adr/0032-image-push.md).

A push arrives as one tar (the gateway streams it into a private directory): an OCI image layout (its
`oci-layout` and `index.json` at the top) or a `docker save` archive (`manifest.json`). skopeo copies it
to the operator's registry under the project's namespace with the operator's credentials, and the push is
answered only once the registry serves the manifest skopeo wrote and admission's resolver pins it, so a
copy that failed half-way is never reported as pushed. `ls` reads the registry's catalog and tags under
the project's namespace. The decisions (what the archive is, which name it gets) are pure functions
beside the actions.
"""
from __future__ import annotations

import asyncio
import base64
import enum
import hashlib
import logging
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Iterable

import aiohttp
import orjson

from .errors import NodusError
from .identity import Caller, Role
from .images import (ImageRefused, ImageResolver, ImageUnauthorized, RegistryUnreachable, classify,
                     private_authfile)
from .operator_registry import NameRefused, OperatorRegistry, split_name

log = logging.getLogger("nodus.images")

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFEST_ACCEPT = ", ".join(("application/vnd.oci.image.manifest.v1+json",
                             "application/vnd.docker.distribution.manifest.v2+json", *INDEX_TYPES))
ARGUMENT = "DIR|FILE"
"""How errors name the pushed archive (the CLI's argument)."""
FIX_ARCHIVE = ("pass an OCI image layout directory (with oci-layout and index.json, as `skopeo copy ... oci:DIR` "
               "or `buildah push IMAGE oci:DIR` writes) or a `docker save -o FILE IMAGE` archive")


class ArchiveKind(enum.Enum):
    """What a pushed tar holds."""

    OCI_LAYOUT = "oci"
    """An OCI image layout: skopeo reads `oci:DIR`."""
    DOCKER_ARCHIVE = "docker-archive"
    """`docker save`'s format (manifest.json listing config and layers): skopeo reads `docker-archive:FILE`."""


def detect(names: Iterable[str]) -> ArchiveKind:
    """The archive's kind from its top-level member names; BadRequest naming the argument otherwise.
    `docker save` of Docker 25+ writes both formats: manifest.json then decides, as docker load would."""
    top = {n.removeprefix("./").split("/")[0] for n in names}
    if "manifest.json" in top:
        return ArchiveKind.DOCKER_ARCHIVE
    if "oci-layout" in top and "index.json" in top:
        return ArchiveKind.OCI_LAYOUT
    if "oci-layout" in top or "index.json" in top:
        missing = "index.json" if "oci-layout" in top else "oci-layout"
        raise NodusError("BadRequest", f"{ARGUMENT}: an OCI image layout needs both oci-layout and index.json; "
                         f"{missing} is missing", fix=FIX_ARCHIVE)
    raise NodusError("BadRequest", f"{ARGUMENT}: the archive is not an image: it has neither manifest.json (a "
                     "`docker save` archive) nor oci-layout and index.json (an OCI image layout)", fix=FIX_ARCHIVE)


@dataclass(frozen=True, slots=True)
class Source:
    """What skopeo copies from, and the name the archive itself suggests."""

    transport: str
    """`oci:DIR` or `docker-archive:FILE`."""
    suggested: str
    """NAME:TAG from a docker archive's RepoTags ("" when it has none)."""
    all_platforms: bool
    """The layout's image is an index: copy every platform (`--all`), not only the host's."""


def source_of(kind: ArchiveKind, root: Path, archive: Path) -> Source:
    """Where skopeo reads the extracted (OCI) or raw (docker) archive, after checking it holds one image."""
    if kind is ArchiveKind.DOCKER_ARCHIVE:
        manifest = _member_json(archive, "manifest.json")
        if not isinstance(manifest, list) or not manifest:
            raise NodusError("BadRequest", f"{ARGUMENT}: manifest.json lists no image", fix=FIX_ARCHIVE)
        if len(manifest) > 1:
            raise NodusError("BadRequest", f"{ARGUMENT}: the archive holds {len(manifest)} images; push one at a "
                             "time", fix="`docker save -o FILE IMAGE` with one image")
        tags = [t for t in (manifest[0].get("RepoTags") or []) if isinstance(t, str)]
        suggested = ""
        if tags:
            repo, _, tag = tags[0].rpartition(":")
            suggested = f"{repo.rsplit('/', 1)[-1]}:{tag}"
        return Source(f"docker-archive:{archive}", suggested, False)
    index = _read_json(root / "index.json")
    entries = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(entries, list) or not entries:
        raise NodusError("BadRequest", f"{ARGUMENT}: index.json lists no image", fix=FIX_ARCHIVE)
    if len(entries) > 1:
        raise NodusError("BadRequest", f"{ARGUMENT}: the layout's index.json lists {len(entries)} images; push a "
                         "layout of one image (an image index of platforms counts as one)",
                         fix="copy the one image into a layout of its own (`skopeo copy oci:DIR:REF oci:NEWDIR`)")
    return Source(f"oci:{root}", "", str(entries[0].get("mediaType") or "") in INDEX_TYPES)


def choose_name(requested: str, suggested: str) -> tuple[str, str]:
    """(name, tag) from --name, else the archive's own tag; BadRequest naming --name when neither is usable."""
    text = requested or suggested
    if not text:
        raise NodusError("BadRequest", "--name is required: the archive carries no name",
                         fix="pass --name NAME[:TAG], for example --name trainer:v1")
    try:
        return split_name(text)
    except NameRefused as e:
        raise NodusError("BadRequest", f"--name: {e}", fix="pass --name NAME[:TAG], for example --name trainer:v1") \
            from None


@dataclass(frozen=True, slots=True)
class Pushed:
    """The answer to a push."""

    repository: str
    tag: str
    reference: str
    """REGISTRY/REPOSITORY:TAG."""
    digest: str
    """The manifest digest the tag serves."""
    image: str
    """What to put in spec.image: REGISTRY/REPOSITORY@DIGEST."""

    def as_json(self) -> dict[str, Any]:
        return {"kind": "ImagePush", "apiVersion": "nodus.dev/v1", "repository": self.repository, "tag": self.tag,
                "reference": self.reference, "digest": self.digest, "image": self.image}


class ImagePushService:
    def __init__(self, registry: OperatorRegistry | None, resolver: ImageResolver, work: Path,
                 binary: str = "skopeo", timeout: float = 1800.0) -> None:
        self.registry, self.resolver, self.work, self.binary, self.timeout = registry, resolver, work, binary, timeout

    def _configured(self) -> OperatorRegistry:
        if self.registry is None:
            raise NodusError("ServiceUnavailable", "this coordinator has no image registry configured, so images "
                             "cannot be pushed or listed", fix="ask the operator to start the coordinator with "
                             "--image-registry HOST:PORT[/PREFIX]; or push to your own registry and use "
                             "spec.imagePullSecrets")
        return self.registry

    @staticmethod
    def authorize(caller: Caller, project: str, role: Role) -> None:
        if not caller.can(project, role):
            verb = "push" if role is Role.EDITOR else "list"
            raise NodusError("Forbidden", f'User "{caller.subject}" cannot {verb} images in project "{project}"',
                             kind="images", group="nodus.dev",
                             fix=f"use a token with the {role.name.lower()} role in project {project}")

    def check(self, caller: Caller, project: str, name: str) -> OperatorRegistry:
        """What a push is refused for before its upload is read (the CLI asks first, as a dry run, so a
        large upload is not cut off mid-body by an early answer)."""
        self.authorize(caller, project, Role.EDITOR)
        registry = self._configured()
        if name:
            choose_name(name, "")
        return registry

    async def push(self, caller: Caller, project: str, name: str, body: AsyncIterator[bytes]) -> Pushed:
        """Receives the tar, copies the image it holds to PREFIX/<project>/<name>:<tag> and verifies it."""
        registry = self.check(caller, project, name)
        self.work.mkdir(parents=True, exist_ok=True, mode=0o700)
        private = Path(tempfile.mkdtemp(prefix="push-", dir=self.work))
        try:
            archive = private / "image.tar"
            size = 0
            with open(archive, "wb") as f:
                async for chunk in body:
                    size += len(chunk)
                    await asyncio.to_thread(f.write, chunk)
            if size == 0:
                raise NodusError("BadRequest", f"{ARGUMENT}: the upload is empty", fix=FIX_ARCHIVE)
            kind = await asyncio.to_thread(_inspect_tar, archive, private / "layout")
            source = await asyncio.to_thread(source_of, kind, private / "layout", archive)
            repo_name, tag = choose_name(name, source.suggested)
            try:
                repository = registry.repository(project, repo_name)
            except NameRefused as e:
                raise NodusError("BadRequest", f"--name: {e}", fix="pass a shorter --name") from None
            reference = f"{registry.host}/{repository}:{tag}"
            digest = await self._copy(registry, source, reference, private)
            await self._verify(registry, reference, digest)
        finally:
            await asyncio.to_thread(shutil.rmtree, private, True)
        log.info("image %s@%s pushed by %s (%s, %d bytes)", reference, digest, caller.subject, kind.value, size)
        return Pushed(repository, tag, reference, digest, f"{registry.host}/{repository}@{digest}")

    async def _copy(self, registry: OperatorRegistry, source: Source, reference: str, private: Path) -> str:
        digest_file = private / "digest"
        with private_authfile(registry.host, registry.credentials) as (authfile, env):
            args = [self.binary, "--insecure-policy", "copy", "--quiet", "--dest-authfile", authfile,
                    "--digestfile", str(digest_file), *(["--dest-tls-verify=false"] if registry.insecure else []),
                    *(["--all"] if source.all_platforms else []), source.transport, f"docker://{reference}"]
            err = await self._run(args, env)
        if err is not None:
            raise _copy_error(err, reference)
        return digest_file.read_text().strip()

    async def _verify(self, registry: OperatorRegistry, reference: str, digest: str) -> None:
        """The tag serves what skopeo wrote, and admission's resolver pins it (its config checks out)."""
        try:
            resolved = await self.resolver.resolve(reference.rsplit(":", 1)[0] + "@" + digest)
        except ImageRefused as e:
            raise NodusError("InternalError", f"the registry does not serve the pushed image back: {e}",
                             fix="push again; if it persists, the operator should check the registry") from None
        with private_authfile(registry.host, registry.credentials) as (authfile, env):
            args = [self.binary, "--insecure-policy", "inspect", "--raw", "--authfile", authfile,
                    *(["--tls-verify=false"] if registry.insecure else []), f"docker://{reference}"]
            proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE, env=env)
            out, _ = await proc.communicate()
        served = "sha256:" + hashlib.sha256(out).hexdigest()
        if proc.returncode != 0 or served != digest:
            raise NodusError("InternalError", f"{reference} serves {served}, not the pushed {digest} (another push "
                             "of the same tag may have won)", fix="push again")
        log.debug("verified %s: %s (platform %s)", reference, digest, resolved.digest)

    async def _run(self, args: list[str], env: dict[str, str]) -> str | None:
        """None on success, else skopeo's stderr."""
        try:
            proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.PIPE, env=env)
        except FileNotFoundError:
            raise NodusError("ServiceUnavailable", f"{self.binary} is not installed on the coordinator",
                             fix="the operator installs skopeo on the coordinator's host (scripts/setup)") from None
        try:
            async with asyncio.timeout(self.timeout):
                _, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return f"the copy did not finish within {self.timeout:.0f}s: timeout"
        return None if proc.returncode == 0 else err.decode(errors="replace")

    async def list(self, caller: Caller, project: str) -> list[dict[str, Any]]:
        """The project's images: one entry per repository and tag, with the digest the tag serves."""
        self.authorize(caller, project, Role.VIEWER)
        registry = self._configured()
        prefix = registry.project_prefix(project)
        scheme = "http" if registry.insecure else "https"
        async with aiohttp.ClientSession(f"{scheme}://{registry.host}",
                                         timeout=aiohttp.ClientTimeout(total=60)) as http:
            client = _Distribution(http, registry)
            repositories = [r for r in await client.catalog() if r.startswith(prefix)]
            images = []
            for repository in sorted(repositories):
                for tag in sorted(await client.tags(repository)):
                    digest = await client.digest(repository, tag)
                    images.append({"name": repository.removeprefix(prefix), "repository": repository, "tag": tag,
                                   "digest": digest, "image": f"{registry.host}/{repository}@{digest}"})
        return images


class _Distribution:
    """The three distribution-API reads `ls` needs, with the operator's credentials (Basic, or the
    Bearer token a token server hands for them)."""

    def __init__(self, http: aiohttp.ClientSession, registry: OperatorRegistry) -> None:
        self.http, self.registry = http, registry
        creds = registry.credentials
        self.basic = "Basic " + base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode() \
            if creds.username else ""

    async def _get(self, path: str, method: str = "GET", accept: str = "application/json") -> tuple[int, Any, Any]:
        """(status, headers, JSON body or None), read whole so the connection goes back to the pool."""
        headers = {"Accept": accept, **({"Authorization": self.basic} if self.basic else {})}
        try:
            status, got, body = await self._request(method, path, headers)
            challenge = got.get("WWW-Authenticate", "")
            if status == 401 and challenge.startswith("Bearer "):
                headers["Authorization"] = "Bearer " + await self._token(challenge)
                status, got, body = await self._request(method, path, headers)
        except aiohttp.ClientError as e:
            raise NodusError("ServiceUnavailable", f"the image registry {self.registry.host} is unreachable: {e}",
                             retry_after=10) from None
        if status in (401, 403):
            raise NodusError("ServiceUnavailable", f"the image registry {self.registry.host} refuses the operator's "
                             f"credentials ({status})", fix="the operator checks --image-registry-auth-file")
        return status, got, body

    async def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, Any, Any]:
        async with self.http.request(method, path, headers=headers) as resp:
            raw = await resp.read()
            try:
                body = orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                body = None
            return resp.status, resp.headers, body

    async def _token(self, challenge: str) -> str:
        params = dict(part.split("=", 1) for part in challenge.removeprefix("Bearer ").replace('"', "").split(","))
        realm = params.pop("realm", "")
        headers = {"Authorization": self.basic} if self.basic else {}
        async with self.http.get(realm, params=params, headers=headers) as resp:
            body = await resp.json(content_type=None) if resp.status == 200 else {}
        return str(body.get("token") or body.get("access_token") or "")

    async def catalog(self) -> list[str]:
        found: list[str] = []
        path = "/v2/_catalog?n=1000"
        while path:
            _, headers, body = await self._get(path)
            found += (body or {}).get("repositories") or []
            link = headers.get("Link", "")
            path = link.split(";")[0].strip("<> ") if 'rel="next"' in link else ""
        return found

    async def tags(self, repository: str) -> list[str]:
        status, _, body = await self._get(f"/v2/{repository}/tags/list")
        return [] if status == 404 else list((body or {}).get("tags") or [])

    async def digest(self, repository: str, tag: str) -> str:
        _, headers, _ = await self._get(f"/v2/{repository}/manifests/{tag}", "HEAD", MANIFEST_ACCEPT)
        return str(headers.get("Docker-Content-Digest", ""))


def _copy_error(stderr: str, reference: str) -> NodusError:
    """A failed skopeo copy: the registry's faults for the operator, the archive's for the customer."""
    refused = classify(stderr, reference)
    if isinstance(refused, ImageUnauthorized):
        return NodusError("ServiceUnavailable", f"the image registry refuses the operator's credentials: "
                          f"{refused.detail}", fix="the operator checks --image-registry-auth-file")
    if isinstance(refused, RegistryUnreachable):
        return NodusError("ServiceUnavailable", f"the image registry is unreachable: {refused.detail}",
                          fix="retry shortly; if it persists, the operator checks --image-registry", retry_after=10)
    return NodusError("BadRequest", f"{ARGUMENT}: the image cannot be read: {refused.detail}", fix=FIX_ARCHIVE)


def _inspect_tar(archive: Path, layout: Path) -> ArchiveKind:
    """The archive's kind; an OCI layout is extracted under `layout` (regular files and directories only,
    every name inside it) for skopeo to read, a docker archive stays a file skopeo reads as is."""
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            members = tar.getmembers()
            kind = detect(m.name for m in members)
            if kind is ArchiveKind.OCI_LAYOUT:
                layout.mkdir()
                tar.extractall(layout, members=[m for m in members if m.isfile() or m.isdir()], filter="data")
    except (tarfile.TarError, EOFError, OSError) as e:
        raise NodusError("BadRequest", f"{ARGUMENT}: the upload is not a tar archive ({e})", fix=FIX_ARCHIVE) from None
    return kind


def _member_json(archive: Path, name: str) -> Any:
    with tarfile.open(archive, mode="r:*") as tar:
        for member in tar:
            if member.name.removeprefix("./") == name and member.isfile():
                f = tar.extractfile(member)
                try:
                    return orjson.loads(f.read() if f is not None else b"")
                except orjson.JSONDecodeError:
                    break
    raise NodusError("BadRequest", f"{ARGUMENT}: {name} is not JSON", fix=FIX_ARCHIVE)


def _read_json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        raise NodusError("BadRequest", f"{ARGUMENT}: {path.name} is not JSON", fix=FIX_ARCHIVE) from None

"""The operator's registry (`--image-registry HOST:PORT[/PREFIX]`): where `nodus image push` puts a
project's images, and whose credentials (`--image-registry-auth-file`, a docker config JSON) admission
resolves with and the agents pull with. Customers never hold them.

Every project owns one namespace of repositories, `[PREFIX/]<project>/…`; `project_of` says whose an
image reference is, so admission refuses a Job naming another project's image (docs/adr/0032-image-push.md).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import orjson

from .images import ImageRefused, RegistryCredentials, registry_of, repository_of

COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
"""One path component of an OCI repository name (the distribution spec's grammar)."""
NAME = re.compile(rf"{COMPONENT}(?:/{COMPONENT})*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
MAX_REPOSITORY = 255
"""The distribution spec's limit on a repository name (registry host excluded)."""


class NameRefused(ValueError):
    """A name or tag outside the OCI grammar; the message says which and why."""


def split_name(text: str) -> tuple[str, str]:
    """`NAME[:TAG]` as (name, tag), the tag `latest` when none is given; NameRefused names the rule broken."""
    name, tag = text, "latest"
    last = text.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = text.rsplit(":", 1)
    if not NAME.fullmatch(name):
        raise NameRefused(f"{name!r} is not an image name: lowercase letters and digits in components separated "
                          "by '/', each joined inside only by '.', '_', '__' or dashes (for example team/trainer)")
    if not TAG.fullmatch(tag):
        raise NameRefused(f"{tag!r} is not a tag: letters, digits, '_', '.' and '-', not starting with '.' or "
                          "'-', at most 128")
    return name, tag


@dataclass(frozen=True, slots=True)
class OperatorRegistry:
    host: str
    """HOST:PORT, as image references start."""
    prefix: str = ""
    """Repositories live under PREFIX/<project>/ ("" puts projects at the top)."""
    credentials: RegistryCredentials = RegistryCredentials()
    insecure: bool = False
    """Reached over plain HTTP (the host is in --insecure-registry)."""

    def __repr__(self) -> str:  # never a password in a log line
        return f"OperatorRegistry(host={self.host!r}, prefix={self.prefix!r}, insecure={self.insecure})"

    @classmethod
    def parse(cls, address: str, auth_file: str = "", insecure: frozenset[str] = frozenset()) -> OperatorRegistry:
        """From the flags; ValueError says what is wrong with which (main.py stops the start with it)."""
        host, _, prefix = address.strip().rstrip("/").partition("/")
        if not re.fullmatch(r"[A-Za-z0-9.-]+(?::\d{1,5})?|\[[0-9a-fA-F:]+\](?::\d{1,5})?", host):
            raise ValueError(f"--image-registry {address!r}: write it as HOST:PORT[/PREFIX]")
        if prefix and not NAME.fullmatch(prefix):
            raise ValueError(f"--image-registry {address!r}: the prefix {prefix!r} is not a repository path "
                             "(lowercase components separated by '/')")
        credentials = RegistryCredentials()
        if auth_file:
            try:
                raw = Path(auth_file).read_bytes()
            except OSError as e:
                raise ValueError(f"--image-registry-auth-file {auth_file}: {e.strerror or e}") from None
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError:
                parsed = None
            if not isinstance(parsed, dict) or not isinstance(parsed.get("auths"), dict):
                raise ValueError(f"--image-registry-auth-file {auth_file}: not a docker config JSON "
                                 '(an "auths" object, as `skopeo login --authfile FILE` or `docker login` writes)')
            logins = [(u, p) for h, u, p in RegistryCredentials(docker_config=raw).logins(host) if h == host]
            if not logins:
                raise ValueError(f"--image-registry-auth-file {auth_file}: it holds no login for {host} "
                                 f"(`skopeo login --authfile {auth_file} {host}` adds one)")
            credentials = RegistryCredentials(username=logins[0][0], password=logins[0][1])
        return cls(host, prefix, credentials, host in insecure)

    def repository(self, project: str, name: str) -> str:
        """The project's repository for `name`; NameRefused when the whole is past the spec's 255."""
        repo = "/".join(p for p in (self.prefix, project, name) if p)
        if len(repo) > MAX_REPOSITORY:
            raise NameRefused(f"{repo!r} is longer than {MAX_REPOSITORY} characters: choose a shorter name")
        return repo

    def project_prefix(self, project: str) -> str:
        return "/".join(p for p in (self.prefix, project) if p) + "/"

    def holds(self, image: str) -> bool:
        """The reference names this registry and a repository under PREFIX (where projects' images live)."""
        try:
            return registry_of(image) == self.host and repository_of(image).startswith(
                f"{self.prefix}/" if self.prefix else "")
        except ImageRefused:
            return False

    def project_of(self, image: str) -> str:
        """The project whose namespace the image is in ("" for one this registry does not hold)."""
        if not self.holds(image):
            return ""
        rest = repository_of(image).removeprefix(f"{self.prefix}/" if self.prefix else "")
        project, slash, _ = rest.partition("/")
        return project if slash else ""

    def logins(self) -> list[tuple[str, str, str]]:
        """(registry, username, password) as an Assignment's image_pull_credentials carry them."""
        return self.credentials.logins(self.host)

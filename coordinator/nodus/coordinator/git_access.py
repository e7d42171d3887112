"""Credentials for private git repositories (source.git): a Git Connection of the Job's spec.connections
whose spec.git.urlPrefix the repository's URL starts with (the longest prefix wins), and the username and
password (a token) of its Secret's latest version. The coordinator's `git ls-remote` at admission and the
agent's checkout of the attempt's node use them as HTTP basic auth, passed to git in its environment
(GIT_CONFIG_COUNT: `http.extraHeader`), never in an argument or a URL, so no process listing or log
shows them (docs/adr/0050)."""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from nodus.v1 import agent_pb2

from .api.connection import GIT_KEYS
from .errors import NodusError
from .vault import Vault

Read = Callable[[str, str, str], Awaitable["dict[str, Any] | None"]]
"""(plural, project, name) → the stored object or None."""


@dataclass(frozen=True, slots=True)
class GitLogin:
    connection: str
    secret: str
    username: str
    password: str

    def as_credentials(self) -> dict[str, str]:
        """Location.credentials as the agent reads them."""
        return {"username": self.username, "password": self.password}


def git_env(username: str, password: str) -> dict[str, str]:
    """git's environment for HTTP basic auth: one http.extraHeader through GIT_CONFIG_COUNT."""
    basic = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.extraHeader",
            "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}"}


async def login_for(read: Read, vault: Vault, project: str, spec: dict[str, Any], url: str) -> GitLogin | None:
    """The login for `url` from the Job's Git Connections; None when none of them covers it. Raises
    NodusError naming the Connection when its Secret is missing or lacks a key."""
    best: tuple[int, str, str] | None = None
    for name in spec.get("connections") or []:
        conn = await read("connections", project, name)
        cspec = (conn or {}).get("spec") or {}
        git = cspec.get("git") or {}
        prefix = str(git.get("urlPrefix") or "")
        if cspec.get("type") == "Git" and prefix and url.startswith(prefix) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), str(name), str(git.get("secret") or ""))
    if best is None:
        return None
    _, conn_name, secret_name = best
    where = f'Secret "{secret_name}" (spec.git.secret of Connection "{conn_name}")'
    needs = f"a Secret with the keys {' and '.join(GIT_KEYS)}"
    secret = await read("secrets", project, secret_name)
    version = int(((secret or {}).get("status") or {}).get("version") or 0)
    if secret is None or not version:
        raise NodusError("NotFound", f'{where} does not exist in project "{project}"', name=secret_name,
                         kind="secrets", fix=f"create {needs} named {secret_name}")
    stored = await vault.get(project, secret_name, version)
    values: dict[str, str] = {}
    for key in GIT_KEYS:
        if key not in stored:
            raise NodusError("NotFound", f'{where} has no key "{key}"', name=secret_name, kind="secrets",
                             fix=f"give it {needs}")
        try:
            values[key] = base64.b64decode(stored[key], validate=True).decode().strip()
        except (binascii.Error, ValueError):
            raise NodusError("BadRequest", f'{where}: the value of "{key}" is not UTF-8 text', name=secret_name,
                             kind="secrets", fix=f"write {key} as plain text (stringData)") from None
    return GitLogin(conn_name, secret_name, values["username"], values["password"])


async def fill(built: agent_pb2.Assignment, read: Read, vault: Vault, job: dict[str, Any]) -> None:
    """Puts the login for the Assignment's source.git repository into its Location.credentials; the
    Assignment goes only to the node the attempt is assigned to (ADR 0045)."""
    if not built.HasField("source") or built.source.WhichOneof("source") != "git":
        return
    repo = built.source.git.repo
    login = await login_for(read, vault, job["metadata"]["namespace"], job.get("spec") or {}, repo.uri)
    if login is not None:
        repo.credentials.update(login.as_credentials())

"""A small REST client for the CLI: kubeconfig, discovery, errors as one line plus the fix."""
from __future__ import annotations

import base64
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import orjson
import requests
import yaml

from .errors import CliError as CliError  # re-exported: every verb imports it from here

GROUP = "nodus.dev"


def default_kubeconfig() -> Path:
    for var in ("NODUS_KUBECONFIG", "KUBECONFIG"):
        if os.environ.get(var):
            return Path(os.environ[var].split(os.pathsep)[0])
    return Path.home() / ".kube" / "config"


@dataclass(frozen=True, slots=True)
class Resource:
    kind: str
    plural: str
    singular: str
    version: str
    short_names: tuple[str, ...]
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{GROUP}/{self.version}"


class Client:
    @classmethod
    def of(cls, args: Any) -> "Client":
        """The client the top-level --kubeconfig and -n/--namespace name."""
        return cls(Path(args.kubeconfig) if args.kubeconfig else default_kubeconfig(), args.namespace)

    def __init__(self, kubeconfig: Path, namespace: str | None = None) -> None:
        try:
            config = yaml.safe_load(kubeconfig.read_text())
        except OSError as e:
            raise CliError(f"cannot read kubeconfig {kubeconfig}: {e.strerror}",
                           "pass --kubeconfig DATA_DIR/kubeconfig or set NODUS_KUBECONFIG") from None
        ctx_name = config.get("current-context")
        ctx: dict[str, Any] = next((c["context"] for c in config.get("contexts", []) if c["name"] == ctx_name), {})
        cluster = next((c["cluster"] for c in config.get("clusters", []) if c["name"] == ctx.get("cluster")), None)
        user: dict[str, Any] = next((u["user"] for u in config.get("users", []) if u["name"] == ctx.get("user")), {})
        if cluster is None:
            raise CliError(f"kubeconfig {kubeconfig} has no cluster for context {ctx_name!r}")
        self.server = cluster["server"].rstrip("/")
        self.token = user.get("token", "")
        self.namespace = namespace or ctx.get("namespace") or "default"
        self.session = requests.Session()
        # The kubeconfig decides whom to trust: REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE in the environment
        # would otherwise replace its CA (requests lets the environment win over Session.verify).
        self.session.trust_env = False
        self.session.headers["Authorization"] = f"Bearer {self.token}"
        self.session.headers["User-Agent"] = "nodus-cli/0.1"
        if cluster.get("certificate-authority-data"):
            fd, path = tempfile.mkstemp(prefix="nodus-ca-", suffix=".crt")
            with os.fdopen(fd, "wb") as f:
                f.write(base64.b64decode(cluster["certificate-authority-data"]))
            self.session.verify = path
        elif cluster.get("certificate-authority"):
            self.session.verify = cluster["certificate-authority"]
        self._resources: list[Resource] | None = None

    # -- transport --------------------------------------------------------------------------------
    def request(self, method: str, path: str, *, body: Any = None, content_type: str = "application/json",
                params: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                stream: bool = False) -> requests.Response:
        hdrs = dict(headers or {})
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else orjson.dumps(body)
            hdrs["Content-Type"] = content_type
        try:
            resp = self.session.request(method, self.server + path, data=data, params=params, headers=hdrs,
                                        stream=stream, timeout=None if stream else 30)
        except requests.exceptions.SSLError as e:
            raise CliError(f"TLS error talking to {self.server}: {e}",
                           "use the kubeconfig the coordinator wrote (it carries its CA)") from None
        except requests.exceptions.ConnectionError:
            raise CliError(f"cannot reach the coordinator at {self.server}",
                           "start it (`nodus-coordinator --data-dir DIR`) or check the kubeconfig's server") from None
        if resp.status_code >= 400:
            raise self._error(resp)
        return resp

    @staticmethod
    def _error(resp: requests.Response) -> CliError:
        try:
            status = resp.json()
        except ValueError:
            return CliError(f"HTTP {resp.status_code}: {resp.text.strip()[:200]}")
        message = status.get("message") or f"HTTP {resp.status_code}"
        causes = (status.get("details") or {}).get("causes") or []
        if causes and status.get("reason") == "Invalid":
            message = message.split(" is invalid:")[0] + " is invalid: " + "; ".join(
                f"{c.get('field')}: {c.get('message')}" for c in causes)
        return CliError(message, status.get("fix", ""), status.get("requestId", ""))

    # -- discovery --------------------------------------------------------------------------------
    def resources(self) -> list[Resource]:
        if self._resources is None:
            found: list[Resource] = []
            group = self.request("GET", f"/apis/{GROUP}").json()
            for v in group.get("versions", []):
                doc = self.request("GET", f"/apis/{v['groupVersion']}").json()
                for r in doc.get("resources", []):
                    if "/" in r["name"]:
                        continue
                    found.append(Resource(r["kind"], r["name"], r.get("singularName", ""), v["version"],
                                          tuple(r.get("shortNames") or ()), r.get("namespaced", True)))
            self._resources = found
        return self._resources

    def resolve(self, name: str) -> Resource:
        needle = name.lower().removesuffix("." + GROUP)
        for r in self.resources():
            if needle in (r.plural, r.singular, r.kind.lower(), *r.short_names):
                return r
        kinds = ", ".join(sorted(r.plural for r in self.resources()))
        raise CliError(f'the server doesn\'t have a resource type "{name}"', f"use one of: {kinds}")

    def for_kind(self, kind: str, api_version: str) -> Resource:
        for r in self.resources():
            if r.kind == kind and r.api_version == api_version:
                return r
        raise CliError(f"no kind {kind!r} is served in {api_version!r}",
                       "check apiVersion and kind (`nodus get` lists the kinds)")

    # -- paths ------------------------------------------------------------------------------------
    def collection(self, r: Resource, namespace: str | None) -> str:
        if namespace is None:
            return f"/apis/{r.api_version}/{r.plural}"
        return f"/apis/{r.api_version}/namespaces/{namespace}/{r.plural}"

    def item(self, r: Resource, namespace: str, name: str) -> str:
        return f"{self.collection(r, namespace)}/{name}"

    def watch(self, r: Resource, namespace: str | None, params: dict[str, Any],
              table: bool = False) -> Iterator[dict[str, Any]]:
        headers = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"} if table else None
        resp = self.request("GET", self.collection(r, namespace), params={**params, "watch": "true"},
                            headers=headers, stream=True)
        for line in resp.iter_lines():
            if line:
                yield orjson.loads(line)

"""The coordinator's flag for the REST address attempts are told (`NODUS_API_SERVER`, ADR 0065).

An attempt with a ServiceAccount's token calls the API at `$NODUS_API_SERVER`. By default that is the
admin kubeconfig's server, which is loopback when the coordinator listens on loopback or on every
address (0.0.0.0 is written as 127.0.0.1): reachable only from the coordinator's own host and network
namespace. `--attempt-api-server URL` names the address attempts elsewhere reach (the host's address, a
load balancer, a DNS name); the coordinator's own serving certificate then names its host too.

main.py adds the flag (`add_flags`), puts `hosts(args)` among its certificate's names before it binds
(so a bad URL stops the start, naming the flag), and hands `endpoint(...)` to the agent servicer.
"""
from __future__ import annotations

import argparse
from urllib.parse import urlsplit

from .controllers.workload_tokens import ApiEndpoint

FLAG = "--attempt-api-server"


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(FLAG, help="https://HOST[:PORT] (or http:// behind a proxy) that attempts reach the REST API at, "
                   "told to them as NODUS_API_SERVER with their ServiceAccount's token; default: the admin "
                   "kubeconfig's server, given only to attempts that can reach it (its host is loopback: attempts "
                   "on the coordinator's host outside a pod)")


def url(args: argparse.Namespace) -> str:
    """--attempt-api-server as given, checked ("" when unset)."""
    value = str(getattr(args, "attempt_api_server", None) or "").strip()
    if not value:
        return ""
    parts = urlsplit(value)
    try:
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.query or parts.fragment:
        raise SystemExit(f"{FLAG}: {value!r} is not an https://HOST[:PORT] URL; name the address attempts reach "
                         "the REST API at, for example https://10.0.0.5:8080")
    return value.rstrip("/")


def hosts(args: argparse.Namespace) -> list[str]:
    """The host --attempt-api-server names, for the coordinator's own serving certificate."""
    given = url(args)
    return [str(urlsplit(given).hostname)] if given else []


def endpoint(args: argparse.Namespace, kubeconfig_url: str, ca_pem: bytes) -> ApiEndpoint:
    """What attempts are told: --attempt-api-server, else the kubeconfig's server (given only where reachable)."""
    given = url(args)
    return ApiEndpoint(given or kubeconfig_url, ca_pem, configured=bool(given))

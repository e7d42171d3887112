"""run/launch.json: one gang member's launch, written by the agent (gang.py) when its gang starts and
read by its supervisor at the gate. It is a serialized `nodus.launchers.model.Launch` plus where the
gang meets (rank 0's endpoint) and how long a worker may wait for it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodus.launchers.model import Launch, Role


@dataclass(frozen=True, slots=True)
class GangLaunch:
    """run/launch.json: one gang member's steps and where its gang meets."""

    launch: Launch
    head: str
    """Rank 0's rendezvous endpoint, host:port (an IPv6 host in brackets)."""
    head_timeout_s: float
    """How long `launch.waits_for_head` may wait for `head` to accept connections."""

    @classmethod
    def parse(cls, raw: Any) -> GangLaunch:
        """The launch the agent wrote; a ValueError names what is wrong with it."""
        if not isinstance(raw, dict):
            raise ValueError("launch.json is not an object")
        try:
            launch = Launch(launcher=str(raw["launcher"]), rank=int(raw["rank"]), role=Role(raw["role"]),
                            argv=_words(raw["argv"], "argv"), env=_text_map(raw.get("env") or {}, "env"),
                            setup=tuple(_words(s, "setup") for s in raw.get("setup") or ()),
                            teardown=tuple(_words(s, "teardown") for s in raw.get("teardown") or ()),
                            files=_text_map(raw.get("files") or {}, "files"),
                            runs_command=bool(raw.get("runs_command", True)),
                            waits_for_head=bool(raw.get("waits_for_head", False)))
            head = str(raw.get("head") or "")
            timeout = float(raw.get("head_timeout_s") or 0)
        except KeyError as e:
            raise ValueError(f"launch.json has no {e.args[0]!r}") from None
        if not launch.argv:
            raise ValueError("launch.json has an empty argv")
        if not all(p.startswith("/") for p in launch.files):
            raise ValueError("launch.json names a file by a relative path")
        if launch.waits_for_head:
            split_endpoint(head)  # a ValueError when it is not host:port
        return cls(launch, head, timeout)

    def to_json(self) -> dict[str, Any]:
        la = self.launch
        return {"launcher": la.launcher, "rank": la.rank, "role": la.role.value, "argv": list(la.argv),
                "env": dict(la.env), "setup": [list(s) for s in la.setup], "teardown": [list(s) for s in la.teardown],
                "files": dict(la.files), "runs_command": la.runs_command, "waits_for_head": la.waits_for_head,
                "head": self.head, "head_timeout_s": self.head_timeout_s}


def _words(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise ValueError(f"launch.json: {what} must be a list of strings")
    return tuple(value)


def _text_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"launch.json: {what} must map names to strings")
    return dict(value)


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6]:port"."""
    host, sep, port = endpoint.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"not a host:port endpoint: {endpoint!r}")
    return host, int(port)

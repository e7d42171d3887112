"""The audit log: one JSON line per write through REST or gRPC, in DATA_DIR/audit.log.

Each line says who (the token id and its subject, never the secret), what (verb, resource, project,
name), the outcome (HTTP status, or the gRPC code) and when, with the request id every answer
carries. Bodies are never written, so a Secret's values cannot reach it. The file is rotated by
size (audit.log.1 … audit.log.N), as the standard library's RotatingFileHandler does, with mode 0600
(docs/adr/0046-tokens-rate-limits-audit.md).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import orjson

DEFAULT_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_BACKUPS = 5

READ_VERBS = frozenset(("get", "list", "watch"))
"""Verbs that change nothing; every other verb of the transports is a write, and audited."""


def is_write(verb: str) -> bool:
    """REST verbs (get, list, watch, create, update, patch, delete) and gRPC ones (getcredits,
    listnodes, revoketoken …): a read starts with get or list, or is watch."""
    return not (verb in READ_VERBS or verb.startswith(("get", "list")))


@dataclass(frozen=True, slots=True)
class AuditEntry:
    request_id: str
    transport: str
    """rest or grpc."""
    verb: str
    resource: str
    project: str
    name: str
    code: str
    """The HTTP status ("201", "403") or the gRPC code ("OK", "PERMISSION_DENIED")."""
    token_id: str = ""
    """"" when the request carried no valid token."""
    subject: str = ""

    def line(self, now: datetime) -> bytes:
        return orjson.dumps({
            "time": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "requestId": self.request_id,
            "transport": self.transport, "tokenId": self.token_id, "subject": self.subject, "verb": self.verb,
            "resource": self.resource, "project": self.project, "name": self.name, "code": self.code})


class AuditLog:
    """Appends entries to `path`, rotated at `max_bytes` keeping `backups` old files.

    Each entry is one write(2) of its line to the file opened for appending (mode 0600, re-opened after
    each rotation): the line reaches the OS before the answer goes out, as the logging handler's flush
    did, without a LogRecord and the handler's seek and tell per entry (33 µs of CPU per write, a
    fiftieth of a create's)."""

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS) -> None:
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self._lock = threading.Lock()  # the gRPC servers' threads record too
        self._fd = self._open()
        self._size = os.fstat(self._fd).st_size

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def record(self, entry: AuditEntry) -> None:
        line = entry.line(datetime.now(timezone.utc)) + b"\n"
        with self._lock:
            if self.backups > 0 and self._size and self._size + len(line) >= self.max_bytes:
                self._rotate()
            os.write(self._fd, line)
            self._size += len(line)

    def _rotate(self) -> None:
        """audit.log becomes audit.log.1, .1 becomes .2 … and the oldest beyond `backups` goes."""
        os.close(self._fd)
        for i in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._fd, self._size = self._open(), 0

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

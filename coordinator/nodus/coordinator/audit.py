"""The audit log: one JSON line per write through REST or gRPC, in DATA_DIR/audit.log.

Each line says who (the token id and its subject, never the secret), what (verb, resource, project,
name), the outcome (HTTP status, or the gRPC code) and when, with the request id every answer
carries. Bodies are never written, so a Secret's values cannot reach it. The file is rotated by
size (audit.log.1 … audit.log.N), as the standard library's RotatingFileHandler does, with mode 0600
(docs/adr/0046-tokens-rate-limits-audit.md).
"""
from __future__ import annotations

import io
import logging
import logging.handlers
import os
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


class _PrivateRotatingFile(logging.handlers.RotatingFileHandler):
    """Opens (and after each rotation re-opens) its file 0600."""

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return io.TextIOWrapper(io.FileIO(fd, "a"), encoding=self.encoding or "utf-8")


class AuditLog:
    """Appends entries to `path`, rotated at `max_bytes` keeping `backups` old files."""

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS) -> None:
        self.path = path
        self._handler = _PrivateRotatingFile(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def record(self, entry: AuditEntry) -> None:
        line = entry.line(datetime.now(timezone.utc)).decode()
        self._handler.handle(logging.makeLogRecord({"msg": line, "levelno": logging.INFO, "levelname": "INFO"}))

    def close(self) -> None:
        self._handler.close()

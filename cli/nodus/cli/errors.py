"""The CLI's one error type, in a module of its own: the file verbs of `nodus checkpoint` raise it
without importing the REST client (entry.py)."""
from __future__ import annotations

import sys


class CliError(Exception):
    """An error the CLI prints as one line plus the fix."""

    def __init__(self, message: str, fix: str = "", request_id: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.request_id = request_id

    def report(self) -> None:
        """Print it as every verb does: the message, then the fix and the request, when known."""
        print(f"error: {self.message}", file=sys.stderr)
        if self.fix:
            print(f"  fix: {self.fix}", file=sys.stderr)
        if self.request_id:
            print(f"  request: {self.request_id}", file=sys.stderr)

"""`nodus-agent`: the node daemon's entry point.

The daemon itself (inventory, the Connect stream, attempts) is the agent issue's work; until it
lands this entry point says so plainly instead of pretending to join.
"""
from __future__ import annotations

import sys


def main() -> None:
    print("nodus-agent: the node agent is not part of this release yet; the coordinator and its "
          "resource API are (see README.md)", file=sys.stderr)
    sys.exit(2)

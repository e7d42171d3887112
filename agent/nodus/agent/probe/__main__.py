"""`python -m nodus.agent.probe [--preload] < plan.json` (the agent runs one per gang member, gang.py)."""
from __future__ import annotations

import os
import sys

from . import main

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # no interpreter teardown: daemon threads may sit in sockets or in torch

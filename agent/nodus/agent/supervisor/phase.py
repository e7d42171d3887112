"""The phases a supervisor writes in status.json, as one enum.

The strings are the layout's (`layout.py`, shared with the agent, which folds them into the
Attempt's phase in `attempts.observe`); this enum is the supervisor's typed view of them. The
legal order, each step optional but the last:

    SPAWNED → INITIALIZING → STARTING_SIDECARS → RUNNING → STOPPING → SUCCEEDED | FAILED | CANCELLED | LOST

A stop or a fault may end the attempt from any phase before the end.
"""
from __future__ import annotations

import enum

from .. import layout as L


class SupervisorPhase(enum.StrEnum):
    SPAWNED = L.SPAWNED
    """The supervisor runs and has started nothing yet (the agent keeps the phase it had)."""
    INITIALIZING = L.INITIALIZING
    """The init command runs."""
    STARTING_SIDECARS = L.STARTING_SIDECARS
    """Sidecars start, in order, each until it is ready (a gang member then waits at its gate)."""
    RUNNING = L.RUNNING
    """The main command (or a gang member's main step) runs."""
    STOPPING = L.STOPPING
    """The main command ended or is being stopped; teardown, sidecars and outputs follow."""
    SUCCEEDED = L.SUCCEEDED
    """The command exited 0 and every declared output was collected."""
    FAILED = L.FAILED
    """The customer's failure: a non-zero exit, the OOM killer, an init, sidecar or launch step that failed."""
    CANCELLED = L.CANCELLED
    """Stopped on request (cancel.json)."""
    LOST = L.LOST
    """Ended for a reason that is not the customer's: a supervisor fault, a signal, a lost gang head."""

    @property
    def terminal(self) -> bool:
        """The supervisor writes nothing after a terminal phase and exits."""
        return self in terminal_phases()


def terminal_phases() -> frozenset[SupervisorPhase]:
    return _TERMINAL


_TERMINAL = frozenset({SupervisorPhase.SUCCEEDED, SupervisorPhase.FAILED, SupervisorPhase.CANCELLED,
                       SupervisorPhase.LOST})


class Gate(enum.StrEnum):
    """A gang member's gate, as the supervisor writes it in status.json's `gate` (absent outside a gang)."""

    WAITING = "waiting"
    """Its sidecars are ready and it runs nothing more until the agent writes run/launch.json."""
    OPEN = "open"
    """launch.json arrived: the launcher's command runs (or is about to)."""

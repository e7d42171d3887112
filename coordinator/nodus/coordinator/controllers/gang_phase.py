"""Where a gang stands (a gang Job's status.gang.phase); the words of gang.proto's GangPhase.

`gang.gang_status` derives it from the members each time; nothing moves it by itself, so unlike an
Attempt's phase it has no transition table: it is a summary, not a state machine.
"""
from __future__ import annotations

import enum


class GangPhase(str, enum.Enum):
    QUEUED = "Queued"
    """No member of the current epoch exists yet, or not every member is placed."""
    ASSEMBLING = "Assembling"
    """Every member is placed; they prepare and reserve their rendezvous ports."""
    MESHING = "Meshing"
    """Every member assembled; the probe measures the network between them."""
    STARTING = "Starting"
    """The command is starting through the launcher on every member."""
    RUNNING = "Running"
    """Every member runs the command."""
    RECOVERING = "Recovering"
    """The epoch broke (a member lost or failed): it is stopped and a new epoch will be placed."""
    STOPPING = "Stopping"
    """The Job ended, is suspended or its epoch is being stopped: members are asked to stop."""
    RELEASING = "Releasing"
    """Every live member is Stopping: outputs are collected and capacity is about to be freed."""
    DONE = "Done"
    """Terminal for the epoch: nothing of it runs any more."""

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({GangPhase.DONE})


def terminal_phases() -> frozenset[GangPhase]:
    return TERMINAL

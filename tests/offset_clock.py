"""A coordinator clock a test moves forward (`nodus-coordinator --clock-offset-file`): leases, billing
increments and timeouts play out in seconds. It moves in steps shorter than the lease, each waiting
until the live nodes have heartbeated at the new time, so no healthy node looks lost however loaded
the machine is."""
from __future__ import annotations

import time
from pathlib import Path


from agent_double import AgentProcess, wait_for
from conftest import Coordinator
from nodus.v1 import node_pb2, node_pb2_grpc

STEP = 20.0
"""Seconds of coordinator time per step: a third of the lease."""


class Clock:
    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0.0
        path.write_text("0")
        self.coordinator: Coordinator | None = None
        self.agents: list[AgentProcess] = []
        """Whose nodes must keep their leases: each step waits for their heartbeats at the new time."""

    def advance(self, seconds: float) -> None:
        """Moves the coordinator's clock forward in steps shorter than the lease; after each, waits until
        every running agent's node has heartbeated at the new time, so no healthy node looks lost
        however slowly a loaded machine delivers its heartbeats."""
        while seconds > 0:
            step = min(STEP, seconds)
            self.offset += step
            seconds -= step
            self.path.write_text(str(self.offset))
            self._renewed(time.time() + self.offset - STEP / 2)

    def _renewed(self, since: float) -> None:
        if self.coordinator is None:
            time.sleep(1.2)
            return
        c = self.coordinator
        names = {a.node for a in self.agents if a.proc is not None}

        def fresh() -> bool:
            with c.channel() as channel:
                nodes = node_pb2_grpc.NodeServiceStub(channel).ListNodes(
                    node_pb2.ListNodesRequest(), metadata=(("authorization", f"Bearer {c.token}"),), timeout=10).nodes
            return all(n.last_heartbeat_time.ToNanoseconds() / 1e9 >= since for n in nodes if n.name in names)
        wait_for(fresh, 30, interval=0.2, what="every live node to heartbeat at the new time")

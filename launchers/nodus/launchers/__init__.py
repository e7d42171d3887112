"""Per-launcher argv and environment for gang members: pure functions, no imports of ours.

`launch(launcher, MemberPlan(rank, topology, rendezvous, command, args, env))` returns a
`Launch`: the member's setup steps, main step, teardown steps, files to write and environment,
plus two flags (`runs_command`, `waits_for_head`) that let the agent run any launcher the same
way. Nothing here reads the clock, the disk or the network. See docs/adr/0008-launchers.md.
"""
from __future__ import annotations

from .contract import GANG_VARIABLES, gang_env
from .model import Launch, MemberPlan, Rendezvous, Role, Topology
from .pycommand import PythonCommand, parse_python
from .registry import LAUNCHERS, check, launch, launch_gang

__all__ = [
    "GANG_VARIABLES", "LAUNCHERS", "Launch", "MemberPlan", "PythonCommand", "Rendezvous", "Role",
    "Topology", "check", "gang_env", "launch", "launch_gang", "parse_python",
]

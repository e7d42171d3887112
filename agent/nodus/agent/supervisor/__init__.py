"""The per-attempt supervisor: `python -m nodus.agent.supervisor ATTEMPT_DIR --lock-fd N`.

The agent spawns one supervisor per attempt, in its own session, and the supervisor does the whole
local life of the attempt: cgroup → init command → sidecars (in order, each ready) → main command
→ sidecars stopped (in reverse) → outputs collected. It records what it sees in `run/status.json`
(atomically), pokes the agent over a datagram socket after every write, and exits. It holds an
flock on `run/supervisor.lock` for its whole life (inherited from the agent, which took it before
the spawn), so "is the supervisor alive?" is a lock probe that pid reuse cannot fool.

Because the supervisor, not the agent, is the workload's parent, killing the agent (even kill -9)
neither kills nor orphans the work; a restarted agent re-reads status.json and watches the lock.
The supervisor never talks to the coordinator: uploads, logs and progress are the agent's.

A gang member (spec.json has `gang`) stops at a gate after its sidecars: it writes `"gate":
"waiting"` and runs nothing more until the agent writes `run/launch.json` (a serialized
`launchers.model.Launch` with rank 0's endpoint and a wait budget). Then it writes `"gate": "open"`
and runs the launch: files → wait for the head → setup steps → the main step → teardown steps.

Its parts: `lifecycle` (the main loop and the status file), `processes` (the children, the one
select loop that pumps them, and the StepRuntime seam with its fork-and-exec side), `containers`
(the OCI side of the seam: each step a runc container of the attempt's pod, when spec.json has
"oci"), `sidecars` (the sidecars and a gang member's teardown steps), `member` (a gang member's
launch files and its wait for the head), `phase` (what status.json says).
"""

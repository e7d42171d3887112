"""An agent connected to a follower replica gets its assignment whatever order the follower's cache
learns of the Attempt and of its Job (ADR 0090).

A replica's cache follows each prefix of the store (jobs/, attempts/, ...) with a watch of its own. On
PostgreSQL each watch reads the log when it is woken, so on a follower the attempts/ watch can deliver an
Attempt (created and bound by the leader) before the jobs/ watch delivers its Job (created through a third
replica a moment earlier). The node's stream cannot build the Assignment without the Job; before the fix it
was woken only by changes of the node's Attempts, so an attempt that was the last change on its node was
never sent: 17-19 of 2,000 Jobs never reached an agent in `bench/fleet.py --postgres --replicas 3`.

Here the follower is a Cache fed by hand in that order (the leader's side is the Job controller's harness on
the same store), with the real AgentServicer and a stream Session on it.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from job_harness import PROJECT, JobHarness

from nodus.coordinator.agent_session import Session
from nodus.coordinator.agents import AgentServicer
from nodus.coordinator.clock import ManualClock
from nodus.coordinator.controllers.cache import Cache, attempt_key, decode, job_key
from nodus.coordinator.controllers.fleet import Fleet
from nodus.coordinator.controllers.objects import Objects
from nodus.coordinator.controllers.placement import bind
from nodus.coordinator.identity import Identity
from nodus.coordinator.nodes import NodeRegistry
from nodus.coordinator.scheduler import Placement
from nodus.coordinator.vault import Vault, load_or_create_key


def _sent(session: Session) -> list[str]:
    """The kinds of the messages the stream queued for its agent, in order (drained)."""
    out = []
    while not session._out.empty():
        message = session._out.get_nowait()
        if message is not None:
            out.append(message.WhichOneof("message"))
    return out


async def _attempt_before_its_job(path: Path) -> None:
    leader = await JobHarness.open(path)
    try:
        await leader.create_job("j")
        await leader.drain()  # the Job controller creates the attempt
        [name] = leader.attempts("j")
        await leader.mutate_attempt(name, bind(Placement("n1", explain="n1: the only fitting node"), leader.clock.now()))
        await leader.caught_up()

        follower = Cache(leader.store)  # fed by hand below, in the order a lagging jobs/ watch gives
        clock = ManualClock()
        objects = Objects(leader.store, follower)
        registry = NodeRegistry(Fleet(follower, clock), objects, clock, lease_duration=15, heartbeat_interval=3)
        identity = Identity(leader.store)
        await identity.ensure_project(PROJECT, "test")
        service = AgentServicer(registry, objects, identity, Vault(leader.store, load_or_create_key(path / "secret.key")),
                                clock)
        session = Session(service, "n1", "session-1", 1)
        service.sessions["n1"] = session

        async def feed(key: str) -> None:
            rec = await leader.store.get(key)
            assert rec is not None
            follower.apply(key, decode(key, rec.value, rec.revision), rec.revision)

        await feed(attempt_key(PROJECT, name))
        assert session.dirty.is_set()
        session.dirty.clear()
        await session._diff()  # what `follow` does when woken: no Job here yet, so nothing can be built
        assert _sent(session) == []

        await feed(job_key(PROJECT, "j"))  # the jobs/ watch catches up
        assert session.dirty.is_set(), "the Job's arrival did not wake the stream of the node its attempt is bound to"
        session.dirty.clear()
        await session._diff()
        assert _sent(session) == ["assignment"]
        await asyncio.sleep(0)
    finally:
        await leader.close()


def test_an_attempt_the_follower_saw_before_its_job_reaches_its_agent_when_the_job_arrives(tmp_path: Path) -> None:
    asyncio.run(_attempt_before_its_job(tmp_path))

"""The agent's side of the mesh probe: processes started ahead, handed their plan and their member's
reserved listening socket over a Unix socket (SCM_RIGHTS), and one kept warm per host."""
from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from agent_double import free_port
from nodus.agent.probe_process import WarmProbes, start_probe


def _reserved() -> socket.socket:
    """What the agent's Gangs.accept reserves for a member's echo port: bound and listening, not inheritable."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    s.set_inheritable(False)
    return s


def _plan(rank: int, ports: list[int], **extra: Any) -> dict[str, Any]:
    return {"rank": rank, "size": len(ports), "budget_s": 20,
            "peers": [{"rank": r, "address": "127.0.0.1", "probe_port": p} for r, p in enumerate(ports)],
            "store": {"address": "127.0.0.1", "port": free_port()}, **extra}


def _report(out: bytes) -> dict[str, Any]:
    lines = [ln for ln in out.decode().splitlines() if ln.strip()]
    return json.loads(lines[-1])


def test_probes_started_ahead_serve_the_sockets_the_agent_reserved() -> None:
    """The peers ping the ports the agent reserved (and reported at Assemble) before either probe had a
    plan: each probe's echo server runs on the socket handed over with its plan."""
    async def main() -> list[tuple[bytes, bytes]]:
        reserved = [_reserved(), _reserved()]
        ports = [s.getsockname()[1] for s in reserved]
        probes = [await start_probe(preload=False) for _ in reserved]
        assert all(p.waiting for p in probes)
        try:
            return list(await asyncio.gather(*(
                p.run(_plan(r, ports, allreduce=False), reserved[r], 30) for r, p in enumerate(probes))))
        finally:
            for s in reserved:
                s.close()

    for rank, (out, err) in enumerate(asyncio.run(main())):
        report = _report(out)
        assert report["error"] == "", err.decode()
        assert report["rank"] == rank and set(report["rtt_ms"]) == {str(1 - rank)}
        assert report["phase_seconds"]["rtt"] > 0


def test_a_probe_waiting_for_a_plan_exits_when_the_agent_goes_away() -> None:
    async def main() -> int:
        probe = await start_probe(preload=False)
        probe.kill()  # closes the agent's end first, as an agent's exit does
        async with asyncio.timeout(30):
            return await probe.proc.wait()

    assert asyncio.run(main()) != 0


def test_a_plan_handed_to_a_probe_is_checked_like_one_on_stdin() -> None:
    async def main() -> tuple[bytes, bytes, int | None]:
        probe = await start_probe(preload=False)
        out, err = await probe.run({"rank": 5, "size": 2, "peers": []}, None, 30)
        return out, err, probe.proc.returncode

    out, err, code = asyncio.run(main())
    assert code == 2 and b"rank" in err


def test_the_warm_probe_is_the_one_started_ahead_and_another_follows() -> None:
    async def main() -> None:
        warm = WarmProbes(keep=True)
        first = warm.take()          # nothing ready yet: started now
        warm.replenish()             # after a member's probe: one ahead
        ready = warm._ready
        assert ready is not None
        probe = await ready
        assert warm.take() is ready and probe.waiting
        assert warm._ready is None, "the next one starts once the taken one has measured"
        warm.replenish()
        off = WarmProbes(keep=False)
        off.replenish()
        assert off._ready is None, "--warm-probe off keeps none"
        spare = await warm._ready  # type: ignore[misc]
        warm.close()
        for p in (await first, probe):
            p.kill()
        async with asyncio.timeout(30):
            codes = [await p.proc.wait() for p in (await first, probe, spare)]
        assert all(c is not None for c in codes)

    asyncio.run(main())

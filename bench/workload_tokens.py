"""What a ServiceAccount's workload tokens cost the coordinator (ADR 0055), each beside its anchor, in one run.

In process, on a real SQLite store (synchronous=FULL, as the coordinator opens it), the real Identity and
the watch-fed cache holding N running attempts of one Job that names a ServiceAccount:

- mint: `workload_tokens.attach` per attempt (read the account, create the token, write its index record),
  beside `identity.create_token` alone, what `nodus token create` costs in the store.
- one attempt ends: its status written Succeeded, then `WorkloadTokens.reconcile` of its key (a prefix list
  of its own index records, the account read, the revocation, the index record deleted), beside the same
  status write of an attempt without an account followed by `identity.revoke_token` alone.
- resync: `reconcile("")` over the N live tokens with nothing due (every one kept), beside N `store.get`s
  of the token records; then with every one due for renewal (the clock moved past half the lifetime),
  beside N `identity.extend_token`s of other tokens (one write each).

Run it from the repository root: `.venv/bin/python bench/workload_tokens.py [--attempts 500] [--save]`. Wall-clock
and CPU seconds are printed with the load average; the ratios to the anchors are what count. Nothing is
asserted.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import orjson

import record
from nodus.coordinator.clock import ManualClock
from nodus.coordinator.controllers import workload_tokens as wt
from nodus.coordinator.controllers.cache import Cache, attempt_key, job_key
from nodus.coordinator.controllers.job_controller import new_attempt
from nodus.coordinator.controllers.objects import Objects
from nodus.coordinator.identity import Identity, Role
from nodus.coordinator.store import SqliteStore
from nodus.v1 import agent_pb2


async def timed(label: str, n: int, body: Callable[[], Awaitable[Any]]) -> float:
    wall, cpu = time.perf_counter(), time.process_time()
    await body()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"  {label:<58} {wall * 1000 / n:8.3f} ms each  ({n} in {wall:.2f} s wall, {cpu:.2f} s CPU)")
    return wall / n


async def run(root: Path, n: int) -> None:
    clock = ManualClock(1_000_000.0)
    store = await SqliteStore.open(root / "store.db")
    identity = Identity(store, clock=clock.now)
    await identity.ensure_project("default")
    cache = Cache(store)
    await cache.start()
    objects = Objects(store, cache)
    await store.create(wt.account_key("default", "bot"), orjson.dumps(
        {"metadata": {"name": "bot", "namespace": "default", "uid": "u-sa"}, "spec": {"role": "editor"}}))
    job: dict[str, Any] = {"apiVersion": "nodus.dev/v1", "kind": "Job",
                           "metadata": {"name": "j", "namespace": "default", "uid": "u1"},
                           "spec": {"command": ["true"], "serviceAccountName": "bot"}}
    await objects.create(job_key("default", "j"), job)
    attempts = []
    for i in range(n):
        a = new_attempt(job, i, 1, clock.now())
        a["status"] = {**a["status"], "phase": "Running"}
        await objects.create(attempt_key("default", a["metadata"]["name"]), a)
        attempts.append(a)
    api = wt.ApiEndpoint("https://127.0.0.1:1", b"ca")
    controller = wt.WorkloadTokens(cache, store, identity, ttl=wt.TTL_SECONDS)

    print(f"{n} running attempts of one Job with a ServiceAccount; load average {os.getloadavg()}")
    anchors: list[str] = []

    async def plain() -> None:
        for _ in range(n):
            _, record = await identity.create_token("default", Role.EDITOR, "anchor", ttl_seconds=3600)
            anchors.append(record["id"])
    base = await timed("anchor: identity.create_token", n, plain)

    async def mint() -> None:
        for a in attempts:
            await wt.attach(agent_pb2.Assignment(), a, job, identity, store, api)
    cost = await timed("attach (account read, token, index record)", n, mint)
    again = await timed("anchor again, after (the noise of this host)", n, plain)
    print(f"    ratio {cost / base:.2f}x the anchor before, {cost / again:.2f}x after")

    plain_job = {**job, "metadata": {**job["metadata"], "name": "k", "uid": "u2"}, "spec": {"command": ["true"]}}
    ends = min(100, n // 2)
    others = [new_attempt(plain_job, i, 1, clock.now()) for i in range(ends)]
    for a in others:
        await objects.create(attempt_key("default", a["metadata"]["name"]), a)

    async def revoke_plain() -> None:
        for a, token_id in zip(others, anchors):
            await objects.mutate(attempt_key("default", a["metadata"]["name"]),
                                 lambda o: {**o, "status": {**o["status"], "phase": "Succeeded"}})
            await identity.revoke_token(token_id)
    base = await timed("anchor: mark an attempt Succeeded + identity.revoke_token", ends, revoke_plain)

    async def end_attempts() -> None:
        for a in attempts[:ends]:
            key = attempt_key("default", a["metadata"]["name"])
            await objects.mutate(key, lambda o: {**o, "status": {**o["status"], "phase": "Succeeded"}})
            await controller.reconcile(key)
    cost = await timed(f"an attempt ends: mark it Succeeded + reconcile its key ({n} live)", ends, end_attempts)
    print(f"    ratio {cost / base:.2f}x the anchor")

    live = n - ends
    ids = [e["tokenId"] for _, _, e in await wt.entries(store)]

    async def gets() -> None:
        for token_id in ids:
            await store.get(f"_identity/tokens/{token_id}")
    base = await timed("anchor: store.get of each live token record", live, gets)
    cost = await timed("resync, nothing due (every token kept)", live, lambda: controller.reconcile(""))
    print(f"    ratio {cost / base:.2f}x the anchor")
    clock.advance(wt.TTL_SECONDS / 2 + 1)

    async def extend() -> None:
        for token_id in anchors[ends:ends + live]:
            await identity.extend_token(token_id, wt.TTL_SECONDS)
    base = await timed("anchor: identity.extend_token (one write)", live, extend)
    cost = await timed("resync, every token due for renewal", live, lambda: controller.reconcile(""))
    print(f"    ratio {cost / base:.2f}x the anchor (the token's write and its index record's); load average "
          f"{os.getloadavg()}")
    await cache.stop()
    await store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--attempts", type=int, default=500)
    record.add_flags(p)
    args = record.shrink(p.parse_args(), {"attempts": 20})
    with tempfile.TemporaryDirectory(prefix="nodus-bench-wt-") as d, record.Report("workload_tokens", args):
        asyncio.run(run(Path(d), args.attempts))


if __name__ == "__main__":
    main()

"""Workload tokens (ADR 0055): minted into an attempt's Assignment, renewed while it lives, revoked when it
ends, when it is deleted, when its ServiceAccount is deleted or its role lowered. `decide` is pure; the
controller runs here against a real SQLite store, the real Identity and the watch-fed cache, on a manual
clock (nothing sleeps)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from nodus.agent.runtime import process as agent_process
from nodus.coordinator.clock import ManualClock
from nodus.coordinator.controllers import workload_tokens as wt
from nodus.coordinator.controllers.cache import Cache, attempt_key, job_key
from nodus.coordinator.controllers.job_controller import new_attempt
from nodus.coordinator.controllers.objects import Objects
from nodus.coordinator.errors import NodusError
from nodus.coordinator.identity import Identity
from nodus.coordinator.store import SqliteStore
from nodus.coordinator.strategies import ServiceAccountStrategy
from nodus.v1 import agent_pb2

TTL = 600.0


def running(attempt_id: str = "att-1", phase: str = "Running") -> dict[str, Any]:
    return {"spec": {"id": attempt_id}, "status": {"phase": phase}}


def sa(uid: str = "u-sa", role: str = "editor") -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "spec": {"role": role}}


ENTRY = {"tokenId": "t1", "attemptId": "att-1", "serviceAccount": "bot", "serviceAccountUID": "u-sa",
         "role": "editor", "expireUnix": 1000.0 + TTL}


@pytest.mark.parametrize(("attempt", "account", "now", "verdict", "why"), [
    (running(), sa(), 1000.0, wt.Verdict.KEEP, ""),
    (running(), sa(), 1000.0 + TTL / 2 + 1, wt.Verdict.RENEW, ""),
    (running(phase="Pending"), sa(), 1000.0, wt.Verdict.KEEP, ""),
    (running(phase="Succeeded"), sa(), 1000.0, wt.Verdict.REVOKE, "its attempt ended (Succeeded)"),
    (running(phase="Failed"), sa(), 1000.0, wt.Verdict.REVOKE, "its attempt ended (Failed)"),
    (running(phase="Lost"), sa(), 1000.0, wt.Verdict.REVOKE, "its attempt ended (Lost)"),
    (running(phase="Cancelled"), sa(), 1000.0, wt.Verdict.REVOKE, "its attempt ended (Cancelled)"),
    (None, sa(), 1000.0, wt.Verdict.REVOKE, "its attempt was deleted"),
    (running("att-2"), sa(), 1000.0, wt.Verdict.REVOKE, "its attempt was deleted"),
    (running(), None, 1000.0, wt.Verdict.REVOKE, 'ServiceAccount "bot" was deleted'),
    (running(), sa(uid="u-new"), 1000.0, wt.Verdict.REVOKE, 'ServiceAccount "bot" was deleted'),
    (running(), sa(role="viewer"), 1000.0, wt.Verdict.REVOKE, "the ServiceAccount's role was lowered to viewer"),
])
def test_decide(attempt: dict[str, Any] | None, account: dict[str, Any] | None, now: float, verdict: wt.Verdict,
                why: str) -> None:
    assert wt.decide(ENTRY, attempt, account, now, TTL) == wt.Decision(verdict, why)


def test_the_agent_names_the_token_mount_as_the_coordinator_does() -> None:
    assert agent_process.TOKEN_MOUNT == wt.TOKEN_MOUNT


async def _world(path: Path, role: str) -> tuple[ManualClock, SqliteStore, Identity, Cache, Objects, dict[str, Any],
                                                   list[dict[str, Any]]]:
    """A real store, identity and cache on a manual clock, with the ServiceAccount `bot` of `role` in project
    default, a Job `j` running as it, and two of its attempts (not yet stored)."""
    clock = ManualClock(1_000_000.0)
    store = await SqliteStore.open(path / "store.db")
    identity = Identity(store, clock=clock.now)
    await identity.ensure_project("default")
    cache = Cache(store)
    await cache.start()
    objects = Objects(store, cache)
    account = {"apiVersion": "nodus.dev/v1", "kind": "ServiceAccount",
               "metadata": {"name": "bot", "namespace": "default", "uid": "u-sa"}, "spec": {"role": role}}
    await store.create(wt.account_key("default", "bot"), orjson.dumps(account))
    job = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "default", "uid": "u1"},
           "spec": {"command": ["true"], "serviceAccountName": "bot"}}
    await objects.create(job_key("default", "j"), job)
    return clock, store, identity, cache, objects, job, [new_attempt(job, i, 1, clock.now()) for i in range(2)]


async def _scenario(path: Path) -> None:
    clock, store, identity, cache, objects, job, attempts = await _world(path, "editor")
    for a in attempts:
        await objects.create(attempt_key("default", a["metadata"]["name"]), a)
    api = wt.ApiEndpoint("https://127.0.0.1:1", b"-----BEGIN CERTIFICATE-----\n")
    tokens = []
    for a in attempts:
        built = agent_pb2.Assignment(attempt_id=a["spec"]["id"])
        await wt.attach(built, a, job, identity, store, api, ttl=TTL)
        [mount] = [m for m in built.secrets if m.name == wt.TOKEN_MOUNT]
        assert set(mount.data) == {"token", "namespace", "ca.crt"} and built.env[wt.API_SERVER_ENV] == api.url
        tokens.append(mount.data["token"].decode())
    callers = [await identity.authenticate(f"Bearer {t}") for t in tokens]
    assert {(c.subject, c.project, c.role.name) for c in callers} == {("system:serviceaccount:default:bot", "default",
                                                                         "EDITOR")}
    controller = wt.WorkloadTokens(cache, store, identity, ttl=TTL)

    # Past half its lifetime a live attempt's token is renewed: the same token outlives its first expiry.
    clock.advance(TTL / 2 + 1)
    await controller.reconcile("")
    clock.advance(TTL / 2 + 1)
    for t in tokens:
        assert (await identity.authenticate(f"Bearer {t}")).subject.endswith(":bot")

    # The first attempt ends: only its token is revoked.
    first = attempt_key("default", attempts[0]["metadata"]["name"])
    await objects.mutate(first, lambda o: {**o, "status": {**o["status"], "phase": "Succeeded"}})
    queued = await asyncio.wait_for(controller.queue.get(), 30)  # the attempt's change queued it
    assert queued == first
    await controller.reconcile(queued)
    controller.queue.done(queued)
    with pytest.raises(NodusError) as e:
        await identity.authenticate(f"Bearer {tokens[0]}")
    assert e.value.reason == "Unauthorized" and "was revoked at" in e.value.message
    assert (await identity.authenticate(f"Bearer {tokens[1]}")).role.name == "EDITOR"
    assert len(await wt.entries(store)) == 1, "a revoked token leaves the live index"

    # Deleting the account revokes the rest at once.
    assert await wt.revoke_account(identity, store, "default", "bot") == 1
    with pytest.raises(NodusError):
        await identity.authenticate(f"Bearer {tokens[1]}")
    assert await wt.entries(store) == []

    # An attempt assigned after its account was deleted fails, naming the account.
    await store.delete(wt.account_key("default", "bot"))
    with pytest.raises(NodusError) as e:
        await wt.attach(agent_pb2.Assignment(), attempts[1], job, identity, store, api)
    assert 'ServiceAccount "bot"' in e.value.message and "create the ServiceAccount bot again" in (e.value.fix or "")
    await cache.stop()
    await store.close()


def test_minted_renewed_and_revoked_against_a_real_store(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))


def test_a_job_without_an_account_gets_no_token(tmp_path: Path) -> None:
    async def go() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        built = agent_pb2.Assignment()
        job = {"metadata": {"name": "j"}, "spec": {"command": ["true"]}}
        await wt.attach(built, {"metadata": {"namespace": "default", "name": "a"}, "spec": {"id": "x"}}, job,
                        Identity(store), store, wt.ApiEndpoint("https://x"))
        assert not built.secrets and wt.API_SERVER_ENV not in built.env
        await store.close()
    asyncio.run(go())


def test_lowering_an_accounts_role_revokes_its_tokens_at_once(tmp_path: Path) -> None:
    async def go() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        identity = Identity(store)
        await identity.ensure_project("default")
        old = {"metadata": {"name": "bot", "namespace": "default", "uid": "u-sa", "generation": 1},
               "spec": {"role": "editor"}}
        await store.create(wt.account_key("default", "bot"), orjson.dumps(old))
        job = {"metadata": {"name": "j"}, "spec": {"serviceAccountName": "bot"}}
        built = agent_pb2.Assignment()
        await wt.attach(built, {"metadata": {"namespace": "default", "name": "j-0-1"}, "spec": {"id": "x"}}, job,
                        identity, store, wt.ApiEndpoint())
        token = built.secrets[0].data["token"].decode()
        strategy = ServiceAccountStrategy(identity, store)
        described = {**old, "spec": {"role": "editor", "description": "now described"}}
        await strategy.on_update("default", "bot", old, described, "")
        assert (await identity.authenticate(f"Bearer {token}")).role.name == "EDITOR", "a description keeps it"
        assert described["metadata"]["generation"] == 2
        await strategy.on_update("default", "bot", old, {**old, "spec": {"role": "viewer"}}, "")
        with pytest.raises(NodusError) as e:
            await identity.authenticate(f"Bearer {token}")
        assert "was revoked at" in e.value.message
        assert await wt.entries(store) == []
        await store.close()
    asyncio.run(go())


@pytest.mark.parametrize(("api", "same_host", "own_netns", "told"), [
    (wt.ApiEndpoint("https://127.0.0.1:8080"), True, False, "https://127.0.0.1:8080"),  # a local process attempt
    (wt.ApiEndpoint("https://127.0.0.1:8080"), False, False, ""),  # an agent on another host
    (wt.ApiEndpoint("https://127.0.0.1:8080"), True, True, ""),  # a pod: its own loopback
    (wt.ApiEndpoint("https://localhost:8080"), True, True, ""),
    (wt.ApiEndpoint("https://[::1]:8080"), False, False, ""),
    (wt.ApiEndpoint("https://10.0.0.5:8080"), False, True, "https://10.0.0.5:8080"),  # listens on an address
    (wt.ApiEndpoint("https://127.0.0.1:8080", configured=True), False, True, "https://127.0.0.1:8080"),  # as told
    (wt.ApiEndpoint(), True, False, ""),
])
def test_the_api_address_an_attempt_is_told(api: wt.ApiEndpoint, same_host: bool, own_netns: bool, told: str) -> None:
    assert wt.url_for(api, same_host, own_netns) == told


@pytest.mark.parametrize(("peer", "local"), [
    ("ipv4:127.0.0.1:5000", True), ("ipv6:[::1]:5000", True), ("unix:/run/nodus.sock", True),
    ("ipv4:10.0.0.7:5000", False), ("ipv6:[fd00::2]:5000", False), ("weird", False),
])
def test_an_agent_on_this_host_is_told_by_its_peer_address(peer: str, local: bool) -> None:
    from nodus.coordinator.agents import same_host
    assert same_host(peer) is local


def test_the_attempt_api_server_flag_is_checked() -> None:
    import argparse

    from nodus.coordinator import workload_settings as ws
    args = argparse.Namespace(attempt_api_server="https://10.0.0.5:8080/")
    assert ws.url(args) == "https://10.0.0.5:8080" and ws.hosts(args) == ["10.0.0.5"]
    assert ws.endpoint(args, "https://127.0.0.1:8080", b"") == wt.ApiEndpoint("https://10.0.0.5:8080", b"", True)
    assert ws.endpoint(argparse.Namespace(attempt_api_server=None), "https://127.0.0.1:1", b"x") == wt.ApiEndpoint(
        "https://127.0.0.1:1", b"x", False)
    for bad in ("10.0.0.5:8080", "ftp://h", "https://", "https://h:port", "https://h?x=1"):
        with pytest.raises(SystemExit) as e:
            ws.url(argparse.Namespace(attempt_api_server=bad))
        assert "--attempt-api-server" in str(e.value) and "https://HOST[:PORT]" in str(e.value), bad


@pytest.mark.parametrize(("record", "now", "gone"), [
    ({"workload": {"attempt": "a"}, "expireUnix": 1000.0}, 1000.0 + 3600, True),
    ({"workload": {"attempt": "a"}, "expireUnix": 1000.0}, 1000.0 + 3599, False),
    ({"workload": {"attempt": "a"}, "expireUnix": 1000.0, "revokeTime": "x"}, 1000.0 + 10, False),
    ({"expireUnix": 1000.0, "revokeTime": "x"}, 1e9, False),  # a user's token: kept as ever
    ({"expireUnix": 0}, 1e9, False),
])
def test_a_dead_workload_token_is_forgotten_a_grace_after_its_expiry(record: dict[str, Any], now: float,
                                                                      gone: bool) -> None:
    assert wt.collectable(record, now, 3600.0) is gone


def test_dead_workload_token_records_leave_the_store(tmp_path: Path) -> None:
    """Against a real store: a revoked workload token's record is deleted once TTL + grace have passed; a
    live attempt's token (renewed) and a revoked user token stay."""
    async def go() -> None:
        clock, store, identity, cache, objects, job, attempts = await _world(tmp_path, "viewer")
        ids = []
        for a in attempts:
            await objects.create(attempt_key("default", a["metadata"]["name"]), a)
            built = agent_pb2.Assignment()
            await wt.attach(built, a, job, identity, store, wt.ApiEndpoint(), ttl=TTL)
            ids.append([e["tokenId"] for _, _, e in await wt.entries(store, f"default/{a['metadata']['name']}/")][0])
        _, user = await identity.create_token("default", wt.Role.VIEWER, "someone", ttl_seconds=60)
        await identity.revoke_token(user["id"])
        controller = wt.WorkloadTokens(cache, store, identity, ttl=TTL, grace=300.0)
        ended = attempt_key("default", attempts[0]["metadata"]["name"])
        await objects.mutate(ended, lambda o: {**o, "status": {**o["status"], "phase": "Succeeded"}})
        assert await asyncio.wait_for(controller.queue.get(), 30) == ended  # the cache has the change
        await controller.reconcile(ended)
        controller.queue.done(ended)
        assert (await identity.get_token(ids[0]) or {}).get("revokeTime"), "revoked, and kept while it says so"
        assert await controller.forget_dead() == 0, "not before its expiry and the grace"

        for _ in range(8):  # the resyncs of TTL + grace: each renews the live token, the dead one ages
            clock.advance(TTL / 4)
            await controller.reconcile("")
        assert await identity.get_token(ids[0]) is None, "the revoked workload token's record is gone"
        assert not (await identity.get_token(ids[1]) or {}).get("revokeTime"), "the live attempt's token stays"
        assert (await identity.get_token(user["id"]) or {}).get("revokeTime"), "a user's revoked token stays"
        await cache.stop()
        await store.close()
    asyncio.run(go())

"""What bench/fleet.py reads back through REST: Jobs by phase, Lost attempts, and where unreached Jobs stopped."""
from __future__ import annotations

import contextlib
import urllib.request
from typing import Any

import aiohttp
import orjson

import api
from daemons import Coordinator

ATTEMPTS = "/apis/nodus.dev/v1/namespaces/default/attempts"


async def listed(c: Coordinator, url: str, params: dict[str, str]) -> list[dict[str, Any]]:
    """Every item of a REST list, read in pages of 1,000."""
    items: list[dict[str, Any]] = []
    params = {**params, "limit": "1000"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=api.client_ssl(c.ca)),
                                     headers={"Authorization": f"Bearer {c.token}"},
                                     timeout=aiohttp.ClientTimeout(total=300)) as s:
        while True:
            async with s.get(c.http + url, params=params) as r:
                page = orjson.loads(await r.read())
            items += page.get("items") or []
            if not (token := (page.get("metadata") or {}).get("continue")):
                return items
            params = {**params, "continue": token}


async def job_phases(c: Coordinator, label: str) -> dict[str, int]:
    """The Jobs labelled bench=LABEL by status.phase."""
    phases: dict[str, int] = {}
    for job in await listed(c, api.JOBS, {"labelSelector": f"bench={label}"}):
        phase = (job.get("status") or {}).get("phase") or "-"
        phases[phase] = phases.get(phase, 0) + 1
    return phases


async def lost_attempts(c: Coordinator, prefix: str) -> int:
    """How many Attempts of Jobs named PREFIX… are Lost (their node's lease expired: replaced, run twice)."""
    return sum(1 for a in await listed(c, ATTEMPTS, {}) if a["metadata"]["name"].startswith(prefix)
               and (a.get("status") or {}).get("phase") == "Lost")


async def unreached(cs: list[Coordinator], names: list[str]) -> list[str]:
    """Each of these Jobs (those no agent got an assignment of) as every replica sees it: its phase, and each
    attempt's node, phase and reason, so that where they stopped shows (never placed, or placed and never
    sent to the agent of that node)."""
    lines = []
    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=api.client_ssl(c.ca)), headers={"Authorization": f"Bearer {c.token}"},
            timeout=aiohttp.ClientTimeout(total=60))) for c in cs]
        for name in names:
            for i, (c, s) in enumerate(zip(cs, sessions)):
                async with s.get(c.http + api.JOBS + "/" + name) as r:
                    job = orjson.loads(await r.read()) if r.status == 200 else {}
                async with s.get(c.http + ATTEMPTS, params={"labelSelector": f"nodus.dev/job={name}"}) as r:
                    items = orjson.loads(await r.read()).get("items") or [] if r.status == 200 else []
                seen = [f"{a['metadata']['name']} on {a['spec'].get('node') or '-'} "
                        f"{(a.get('status') or {}).get('phase')} {(a.get('status') or {}).get('reason', '')}".rstrip()
                        for a in items]
                lines.append(f"{name} at replica {i}: Job {(job.get('status') or {}).get('phase')}; "
                             f"attempts {seen or 'none'}")
    return lines


def revision(c: Coordinator) -> int:
    """The store-wide revision as the coordinator's /metrics says it now (nodus_store_revision): on either
    store, how many writes were made up to now."""
    request = urllib.request.Request(c.http + "/metrics", headers={"Authorization": f"Bearer {c.token}"})
    with urllib.request.urlopen(request, context=api.client_ssl(c.ca), timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("nodus_store_revision "):
                return int(float(line.split()[1]))
    raise RuntimeError(f"{c.http}/metrics has no nodus_store_revision")


def writes_since(store_url: str, head: int, seconds: float) -> dict[str, float]:
    """The store's writes per second after revision `head`, over `seconds`, by kind (the key's first part;
    a delete as "<kind> delete"): what a steady fleet still writes (ADR 0120)."""
    import psycopg
    with psycopg.connect(store_url, autocommit=True) as conn:
        rows = conn.execute("SELECT split_part(key, '/', 1), type, count(*) FROM log WHERE revision > %s "
                            "GROUP BY 1, 2 ORDER BY 3 DESC", (head,)).fetchall()
    return {f"{kind}{' delete' if kind_type == 2 else ''}": count / seconds for kind, kind_type, count in rows}

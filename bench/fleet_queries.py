"""What bench/fleet.py reads back through REST: Jobs by phase, Lost attempts, and where unreached Jobs stopped."""
from __future__ import annotations

import contextlib
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

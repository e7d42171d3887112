"""A Job's kept checkpoints, as the REST gateway lists and serves them (`nodus checkpoint ls/get`)."""
from __future__ import annotations

from typing import Any

from ..api.attempt import INDEX_LABEL, JOB_LABEL
from ..api.kinds import resolve
from ..controllers import checkpoints as rules
from ..errors import NodusError
from ..identity import SYSTEM, Caller
from ..resources import ResourceService
from ..selectors import parse_field_selector, parse_label_selector


def attempt_number(obj: dict[str, Any]) -> int:
    number = (obj.get("spec") or {}).get("number")
    return number if isinstance(number, int) else 0


async def committed(service: ResourceService, caller: Caller, project: str, name: str,
                    index: int) -> list[dict[str, Any]]:
    """The index's committed checkpoints a restore could use, oldest first (a Dcp checkpoint once
    every rank stored its part, with the parts), each with the number of the attempt that took it."""
    job = await service.get(caller, resolve("jobs"), project, name)
    page = await service.list(SYSTEM, resolve("attempts"), project,
                              labels=parse_label_selector(f"{JOB_LABEL}={name},{INDEX_LABEL}={index}"),
                              fields=parse_field_selector(None))
    uid = job["metadata"].get("uid")
    mine = [{"status": {"checkpoints": [{**c, "attempt": attempt_number(a)}
                                        for c in (a.get("status") or {}).get("checkpoints") or []]}}
            for a in page.items if (a.get("spec") or {}).get("jobUID") == uid]
    return rules.complete(mine)


async def held_part(service: ResourceService, caller: Caller, project: str, name: str, index: int, seq: int,
                    rank: int) -> tuple[dict[str, Any], int]:
    """Rank `rank`'s part of checkpoint `seq` (the checkpoint itself when it has no parts) and how many
    parts it has, when Nodus holds it; NotFound, or BadRequest for one in the Connection's bucket."""
    found = [c for c in await committed(service, caller, project, name, index) if int(c.get("seq", 0)) == seq]
    if not found:
        raise NodusError("NotFound", f'job "{name}" has no committed checkpoint {seq} for index {index}',
                         name=str(seq), kind="jobs/checkpoints", group="nodus.dev",
                         fix=f"list what is kept with `nodus checkpoint ls --job {name} --index {index}` "
                             "(checkpoints go retainAfterFinish after the Job ends)")
    parts = found[0].get("parts") or [found[0]]
    part = next((p for p in parts if int(p.get("rank") or 0) == rank), None)
    if part is None:
        raise NodusError("NotFound", f"checkpoint {seq} of job \"{name}\" has no part for rank {rank}",
                         name=str(seq), kind="jobs/checkpoints", group="nodus.dev",
                         fix=f"ranks 0 to {len(parts) - 1} each stored a part")
    if rules.in_s3(part):
        uri = str(part.get("uri") or "")
        raise NodusError("BadRequest", f"checkpoint {seq} of job \"{name}\" is in the Connection's bucket "
                         f"({uri}), not held by Nodus", name=str(seq), kind="jobs/checkpoints", group="nodus.dev",
                         fix=f"read it with your keys: nodus checkpoint restore {uri.rpartition('/')[0]} "
                             f"--seq {seq} --into DIR")
    return part, len(parts)

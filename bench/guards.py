"""What the API's guards cost a request (ADR 0046), beside the same work without them in the same run.

In-process, on a SQLite store in a temporary directory:
- authenticate() of a cached token with the per-token rate limit (a limit so high it never refuses,
  so every call takes from its bucket) beside the same Identity without a limiter (the anchor);
- one audit log line written (AuditLog.record, through the RotatingFileHandler) beside serializing
  the same entry (the anchor);
- a token revoked on one Identity until the other, on the same store, refuses it (the watch).

    .venv/bin/python bench/guards.py [--calls 20000] [--tiny] [--save]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import record
from nodus.coordinator.audit import AuditEntry, AuditLog
from nodus.coordinator.errors import NodusError
from nodus.coordinator.identity import Identity, Role
from nodus.coordinator.ratelimit import RateSettings, TokenBuckets
from nodus.coordinator.store.sqlite import SqliteStore


async def per_call(identity: Identity, header: str, calls: int) -> float:
    """Microseconds per authenticate() call, the median of 5 rounds."""
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            await identity.authenticate(header)
        rounds.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(rounds)


async def run(tmp: Path, calls: int) -> None:
    store = await SqliteStore.open(tmp / "store.db")
    try:
        plain = Identity(store)
        guarded = Identity(store, limiter=TokenBuckets(RateSettings(rate=1e9, burst=10**9)))
        await plain.ensure_project("p")
        token, record_ = await plain.create_token("p", Role.VIEWER)
        header = f"Bearer {token}"
        anchor = await per_call(plain, header, calls)
        limited = await per_call(guarded, header, calls)
        print(f"authenticate, cached token: {limited:.2f} us/call with the rate limit, "
              f"{anchor:.2f} us/call without (anchor); the bucket adds {limited - anchor:.2f} us")

        log = AuditLog(tmp / "audit.log")
        entry = AuditEntry("req_0123456789abcdef", "rest", "create", "jobs", "p", "job-1", "201", record_["id"],
                           f"token:{record_['id']}")
        now = datetime.now(timezone.utc)
        started = time.perf_counter()
        for _ in range(calls):
            entry.line(now)
        serialize = (time.perf_counter() - started) / calls * 1e6
        started = time.perf_counter()
        for _ in range(calls):
            log.record(entry)
        write = (time.perf_counter() - started) / calls * 1e6
        log.close()
        print(f"audit record: {write:.2f} us/write (one JSON line, flushed) beside {serialize:.2f} us to "
              f"serialize it (anchor)")

        await guarded.authenticate(header)  # cached, and following the store
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        await plain.revoke_token(record_["id"])
        while True:
            try:
                await guarded.authenticate(header)
            except NodusError:
                break
            await asyncio.sleep(0.001)
        print(f"revocation on one Identity refused by another on the same store after "
              f"{(time.perf_counter() - started) * 1e3:.1f} ms (its cache would have held it 5000 ms)")
    finally:
        await store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"calls": 200})
    with tempfile.TemporaryDirectory(prefix="nodus-guards-") as tmp, record.Report("guards", args):
        asyncio.run(run(Path(tmp), args.calls))


if __name__ == "__main__":
    main()

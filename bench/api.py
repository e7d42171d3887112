#!/usr/bin/env python3
"""REST API benchmark for `nodus-coordinator`, each figure printed beside an anchor measured in the same run.

    .venv/bin/python bench/api.py [--seconds N] [--watchers 100] [--concurrency 64]
                                  [--store-url local|postgresql://… [--replicas 3]]

Figures (see bench/README.md):
  A  bare SQLite insert loop, WAL + synchronous=FULL, one INSERT+COMMIT per ~2 KB row   (rows/s)
  B  bare echo of the same ~2 KB JSON body by a tiny aiohttp app over TLS, own process  (req/s)
  1  durable creates/s against a real coordinator (201s only; errors counted apart)
  2  gets/s of existing objects, same client and concurrency
  3  watch delivery latency: W watch streams, creates at a steady rate, per (watcher, object)
     latency = ADDED event arrival - time the create's 201 arrived at the creator (CLOCK_MONOTONIC,
     which is system-wide, so the two processes' stamps compare)
  4  TLS on gRPC (bench/api_tls.py): gRPC creates/s and calls/s with TLS, and agent heartbeats/s with mTLS,
     each beside plaintext (--grpc-insecure on loopback) in the same run; target: TLS costs <= 15 %

With --store-url the coordinator keeps its store on PostgreSQL (`local`: a throwaway cluster with fsync
on, made with initdb and pg_ctl as the tests make theirs) and anchor A is a bare psycopg loop on the
same server instead (one INSERT + COMMIT per ~2 KB row, synchronous_commit on); with --replicas N the
creates and gets go round the N replicas and watcher w watches replica w mod N.

A benchmark, not a test: it asserts nothing. The load generator runs in this process; the
coordinator, the echo server and the watch client each run in a process of their own.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import secrets
import shutil
import signal
import ssl
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

import api_tls
import record
from api_procs import (BODY_TARGET, JOBS, Coordinator, CpuMeter, echo_server_main, profile, psycopg_anchor,
                       sqlite_anchor, start_replicas, stop_process, unprofile, watch_client_main)

TESTS = Path(__file__).resolve().parent.parent / "tests"
TARGET_CREATES = 1000.0
TARGET_WATCH_P99_MS = 50.0
TARGET_PG_RATIO, TARGET_PG_WATCH_P99_MS = 0.5, 100.0
"""On PostgreSQL (issue 14): creates at >= half the bare psycopg loop, watch p99 <= 100 ms."""
WARMUP_S = 1.0


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# bodies
# ------------------------------------------------------------------------------------------------
def _padding_env() -> list[dict[str, str]]:
    """Env entries that bring a Job body to ~BODY_TARGET bytes (computed once, shared by all bodies)."""
    name = "b-xxxxxx-0000000"
    env: list[dict[str, str]] = []
    while len(job_body(name, env)) < BODY_TARGET:
        env.append({"name": f"PAD_{len(env) + 1}", "value": "x" * 100})
    if env:
        over = len(job_body(name, env)) - BODY_TARGET
        env[-1]["value"] = "x" * max(1, 100 - over)
    return env


def job_body(name: str, env: list[dict[str, str]]) -> bytes:
    spec: dict[str, Any] = {"command": ["python3", "-c", "print(1)"]}
    if env:
        spec["env"] = env
    return orjson.dumps({"apiVersion": "nodus.dev/v1", "kind": "Job",
                         "metadata": {"name": name, "labels": {"bench": "api"}}, "spec": spec})


# ------------------------------------------------------------------------------------------------
# process helpers
# ------------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------------------------------
# closed-loop load: C workers, keep-alive, count completions inside the measured window
# ------------------------------------------------------------------------------------------------
@dataclass
class LoadResult:
    ok: int = 0
    seconds: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    ok_names: list[str] = field(default_factory=list)
    cpu: str = ""

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


def client_ssl(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


async def closed_loop(session: aiohttp.ClientSession, concurrency: int, seconds: float, expect: int,
                      make: Any, meter_pids: dict[str, int]) -> LoadResult:
    """`make(i)` -> (method, url, body or None, name); counts `expect` statuses finishing in the window."""
    res = LoadResult()
    counter = iter(range(10**12))
    t_start = time.monotonic() + WARMUP_S
    t_end = t_start + seconds
    meter: list[CpuMeter] = []

    async def worker() -> None:
        while True:
            now = time.monotonic()
            if now >= t_end:
                return
            method, url, body, name = make(next(counter))
            t0 = time.monotonic()
            try:
                async with session.request(method, url, data=body) as r:
                    payload = await r.read()
                    status = r.status
            except Exception as e:  # noqa: BLE001 - counted and reported
                status, payload = -1, repr(e).encode()
            t1 = time.monotonic()
            if t_start <= t1 < t_end:
                if status == expect:
                    res.ok += 1
                    res.latencies.append(t1 - t0)
                else:
                    key = f"HTTP {status}" if status > 0 else payload.decode(errors="replace").split("(")[0]
                    res.errors[key] += 1
                    if len(res.samples) < 3:
                        res.samples.append(f"{key}: {payload[:300].decode(errors='replace')}")
            if status == expect and name:
                res.ok_names.append(name)

    async def start_meter() -> None:
        await asyncio.sleep(max(0.0, t_start - time.monotonic()))
        meter.append(CpuMeter(meter_pids))
        await asyncio.sleep(max(0.0, t_end - time.monotonic()))
        res.cpu = meter[0].report()

    await asyncio.gather(start_meter(), *(worker() for _ in range(concurrency)))
    res.seconds = seconds
    return res


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def lat_text(v: list[float]) -> str:
    return f"latency p50 {pct(v, .5) * 1e3:.1f} ms, p99 {pct(v, .99) * 1e3:.1f} ms"


# ------------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------------
@dataclass
class State:
    tmp: Path
    coordinators: list[Coordinator] = field(default_factory=list)
    children: list[mp.process.BaseProcess] = field(default_factory=list)


async def phases(args: argparse.Namespace, st: State, results: dict[str, Any]) -> None:
    c = st.coordinators[0]
    assert c.proc is not None
    servers = {("server" if len(st.coordinators) == 1 else f"replica {i}"): r.proc.pid
               for i, r in enumerate(st.coordinators) if r.proc is not None}
    urls = [r.http + JOBS for r in st.coordinators]
    env = _padding_env()
    run_id = secrets.token_hex(3)
    sample = job_body(f"b-{run_id}-0000000", env)
    results["body_bytes"] = len(sample)
    spawn = mp.get_context("spawn")
    ctx = client_ssl(c.ca)
    timeout = aiohttp.ClientTimeout(total=60)

    def session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=args.concurrency, ssl=ctx, keepalive_timeout=120),
            timeout=timeout, headers={"Authorization": f"Bearer {c.token}", "Content-Type": "application/json"})

    # -- anchor B: echo ------------------------------------------------------------------------
    parent, child = spawn.Pipe()
    tls_dir = c.data_dir / "tls"
    echo = spawn.Process(target=echo_server_main, args=(str(tls_dir / "tls.crt"), str(tls_dir / "tls.key"), child),
                         daemon=True, name="bench-echo")
    echo.start()
    st.children.append(echo)
    if not parent.poll(30):
        raise RuntimeError("echo server did not start")
    echo_url = f"https://127.0.0.1:{parent.recv()}/echo"
    log(f"anchor B: echo {len(sample)} B JSON over TLS, concurrency {args.concurrency}, {args.seconds:.0f}s")
    async with session() as s:
        res = await closed_loop(s, args.concurrency, args.seconds, 201,
                                lambda i: ("POST", echo_url, sample, ""),
                                {"server": echo.pid, "client": os.getpid()})
    results["echo"] = res
    stop_process(echo)
    st.children.remove(echo)

    # -- creates ---------------------------------------------------------------------------------
    url = urls[0]
    log(f"creates: concurrency {args.concurrency}, {args.seconds:.0f}s over {len(urls)} coordinator(s)")

    def make_create(i: int) -> tuple[str, str, bytes, str]:
        name = f"b-{run_id}-{i:07d}"
        return "POST", urls[i % len(urls)], job_body(name, env), name

    spies = profile(args, servers)
    try:
        async with session() as s:
            res = await closed_loop(s, args.concurrency, args.seconds, 201, make_create,
                                    {**servers, "client": os.getpid()})
    finally:
        unprofile(spies)
    results["creates"] = res
    names = res.ok_names

    # -- gets ------------------------------------------------------------------------------------
    log(f"gets: concurrency {args.concurrency}, {args.seconds:.0f}s over {len(names)} objects")
    if names:
        async with session() as s:
            res = await closed_loop(s, args.concurrency, args.seconds, 200,
                                    lambda i: ("GET", f"{urls[i % len(urls)]}/{names[(i * 7919) % len(names)]}",
                                               None, ""),
                                    {**servers, "client": os.getpid()})
        results["gets"] = res

    # -- watch -----------------------------------------------------------------------------------
    async with session() as s:
        async with s.get(url, params={"limit": "1"}) as r:
            body = await r.read()
            if r.status != 200:
                raise RuntimeError(f"list for the watch resourceVersion: HTTP {r.status} {body[:500]!r}")
            rv = orjson.loads(body)["metadata"]["resourceVersion"]
    log(f"watch: opening {args.watchers} watches at resourceVersion {rv}")
    parent, child = spawn.Pipe()
    wproc = spawn.Process(target=watch_client_main, args=([r.http for r in st.coordinators], c.token, str(c.ca), args.watchers, rv,
                                                             child),
                          daemon=True, name="bench-watch")
    wproc.start()
    st.children.append(wproc)
    loop = asyncio.get_running_loop()
    if not await loop.run_in_executor(None, parent.poll, 60):
        raise RuntimeError("watch client did not report ready in 60s")
    _, open_s, open_errors = parent.recv()
    results["watch_open"] = (open_s, open_errors)
    await asyncio.sleep(0.5)
    n = int(args.watch_rate * args.watch_seconds)
    log(f"watch: {n} creates at {args.watch_rate:.0f}/s while {args.watchers} watchers listen")
    sent: dict[str, float] = {}
    acked: dict[str, float] = {}
    werrors: Counter[str] = Counter()
    meter = CpuMeter({**servers, "watch client": wproc.pid, "creator": os.getpid()})
    async with session() as s:
        async def create(name: str) -> None:
            sent[name] = time.monotonic()
            try:
                async with s.post(urls[len(sent) % len(urls)], data=job_body(name, env)) as r:
                    await r.read()
                    t = time.monotonic()
                    if r.status == 201:
                        acked[name] = t
                    else:
                        werrors[f"HTTP {r.status}"] += 1
            except Exception as e:  # noqa: BLE001 - reported
                werrors[type(e).__name__] += 1

        t0 = time.monotonic() + 0.05
        tasks = []
        for k in range(n):
            await asyncio.sleep(max(0.0, t0 + k / args.watch_rate - time.monotonic()))
            tasks.append(asyncio.create_task(create(f"w-{run_id}-{k:07d}")))
        await asyncio.gather(*tasks)
    wait_s = 10.0
    parent.send((list(acked), wait_s))
    if not await loop.run_in_executor(None, parent.poll, wait_s + 30):
        raise RuntimeError("watch client did not report results")
    _, per_watcher, other, errors = parent.recv()
    results["watch_cpu"] = meter.report()
    stop_process(wproc)
    st.children.remove(wproc)
    lat_ack: list[float] = []
    lat_sent: list[float] = []
    for got in per_watcher:
        for name, t in got.items():
            lat_ack.append(t - acked[name])
            lat_sent.append(t - sent[name])
    expected = len(acked) * args.watchers
    results["watch"] = {"ack": lat_ack, "sent": lat_sent, "expected": expected, "received": len(lat_ack),
                        "missed": expected - len(lat_ack), "create_errors": werrors, "other": other,
                        "errors": errors, "objects": len(acked), "watchers_ok": args.watchers - len(open_errors)}


def fmt_rate(v: float) -> str:
    return f"{v:,.0f}/s"


def report(args: argparse.Namespace, results: dict[str, Any]) -> None:
    out = []
    p = out.append
    p("")
    p(f"nodus API benchmark - {os.cpu_count()} CPUs, body {results.get('body_bytes', '?')} B, "
      f"concurrency {args.concurrency}, {args.seconds:.0f}s per throughput phase (+{WARMUP_S:.0f}s warm-up), "
      f"{args.watchers} watchers")
    p("")
    p("details")
    sq_rate, sq_n = results["anchor"]
    on_pg = bool(args.store_url)
    p(f"  store: {'PostgreSQL' if on_pg else 'embedded SQLite'}, {len(results['replicas'])} coordinator(s)"
      + (f" ({', '.join(results['replicas'])})" if on_pg else ""))
    anchor_label = ("bare psycopg insert (fsync=on, synchronous_commit=on)" if on_pg
                    else "bare SQLite insert (sync=FULL)")
    p(f"  A  {anchor_label}, 1 row/commit: {sq_n} rows, {fmt_rate(sq_rate)}")
    for key, label in (("echo", "B  bare 2 KB JSON echo (aiohttp+TLS, own process)"),
                       ("creates", "1  durable creates (201)"), ("gets", "2  gets (200)")):
        r: LoadResult | None = results.get(key)
        if r is None:
            p(f"  {label}: not run")
            continue
        err = sum(r.errors.values())
        p(f"  {label}: {r.ok} ok, {fmt_rate(r.rate)}, {lat_text(r.latencies)}; errors {err}"
          + (f" {dict(r.errors)}" if err else "") + f"; CPU: {r.cpu}")
        for s in r.samples:
            p(f"       e.g. {s}")
    w = results.get("watch")
    if w:
        open_s, open_errors = results["watch_open"]
        p(f"  3  watch: {w['watchers_ok']}/{args.watchers} watches opened in {open_s:.2f}s; {w['objects']} objects "
          f"created at {args.watch_rate:.0f}/s; {w['received']}/{w['expected']} ADDED events received, "
          f"{w['missed']} missed; other events {w['other'] or 0}; create errors {dict(w['create_errors']) or 0}")
        a, s = w["ack"], w["sent"]
        if a:
            p(f"     latency from the 201 reaching the creator: p50 {pct(a, .5) * 1e3:.1f} ms, "
              f"p90 {pct(a, .9) * 1e3:.1f} ms, p99 {pct(a, .99) * 1e3:.1f} ms, max {max(a) * 1e3:.1f} ms, "
              f"min {min(a) * 1e3:.1f} ms (negative: event arrived before the 201)")
            p(f"     latency from the create being sent:    p50 {pct(s, .5) * 1e3:.1f} ms, "
              f"p99 {pct(s, .99) * 1e3:.1f} ms")
        p(f"     CPU: {results.get('watch_cpu', '')}")
        for e in (open_errors + w["errors"])[:5]:
            p(f"     error: {e}")
    p("")
    echo = results["echo"].rate if results.get("echo") else 0.0
    watch_target = TARGET_PG_WATCH_P99_MS if on_pg else TARGET_WATCH_P99_MS
    rows = []
    cr = results.get("creates")
    if cr:
        rows.append(("durable creates/s", f"{cr.rate:,.0f}", anchor_label, fmt_rate(sq_rate),
                     f"{cr.rate / sq_rate:.2f}" if sq_rate else "-"))
        rows.append(("", "", "bare 2 KB JSON echo (same server)", fmt_rate(echo),
                     f"{cr.rate / echo:.2f}" if echo else "-"))
        errs = sum(cr.errors.values())
        if errs:
            rows.append(("  create errors", f"{errs}", "", "", ""))
    g = results.get("gets")
    if g:
        rows.append(("gets/s", f"{g.rate:,.0f}", "bare 2 KB JSON echo (same server)", fmt_rate(echo),
                     f"{g.rate / echo:.2f}" if echo else "-"))
        errs = sum(g.errors.values())
        if errs:
            rows.append(("  get errors", f"{errs}", "", "", ""))
    if w and w["ack"]:
        rows.append((f"watch p50 / p99 ({args.watchers} watchers)",
                     f"{pct(w['ack'], .5) * 1e3:.0f} ms / {pct(w['ack'], .99) * 1e3:.0f} ms",
                     f"target p99 <= {watch_target:.0f} ms", "", ""))
        rows.append(("watch events missed", f"{w['missed']}", "target 0", "", ""))
    widths = [31, 20, 55 if on_pg else 37, 15, 6]
    header = ("figure", "value", "anchor", "anchor value", "ratio")
    p("".join(h.ljust(wd) for h, wd in zip(header, widths)).rstrip())
    for row in rows:
        p("".join(str(x).ljust(wd) for x, wd in zip(row, widths)).rstrip())
    p("")
    verdict = []
    if cr and on_pg:
        ratio = cr.rate / sq_rate if sq_rate else 0.0
        verdict.append(f"durable creates >= {TARGET_PG_RATIO:.1f} x bare psycopg: "
                       f"{'met' if ratio >= TARGET_PG_RATIO else 'NOT met'} ({ratio:.2f})")
    elif cr:
        verdict.append(f"durable creates >= {TARGET_CREATES:,.0f}/s: {'met' if cr.rate >= TARGET_CREATES else 'NOT met'}"
                       f" ({cr.rate:,.0f}/s)")
    if w and w["ack"]:
        p99 = pct(w["ack"], .99) * 1e3
        verdict.append(f"watch p99 <= {watch_target:.0f} ms: "
                       f"{'met' if p99 <= watch_target and w['missed'] == 0 else 'NOT met'} "
                       f"({p99:.0f} ms, {w['missed']} missed)")
    p("targets: " + "; ".join(verdict))
    if results.get("tls"):
        p("")
        out.extend(api_tls.report_lines(results["tls"]))
    print("\n".join(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10, help="measured seconds per throughput phase (default 10)")
    ap.add_argument("--watchers", type=int, default=100, help="watch streams (default 100)")
    ap.add_argument("--concurrency", type=int, default=64, help="requests in flight (default 64)")
    ap.add_argument("--watch-rate", type=float, default=50, help="creates/s during the watch phase (default 50)")
    ap.add_argument("--watch-seconds", type=float, default=5, help="length of the watch phase (default 5)")
    ap.add_argument("--tmp-dir", default=None, help="parent of the temporary directory (default: system temp)")
    ap.add_argument("--store-url", default="",
                    help="keep the store on PostgreSQL: `local` starts a throwaway durable cluster, or a "
                         "postgresql://… URL of an empty database (the anchor's table goes there too)")
    ap.add_argument("--replicas", type=int, default=1, help="coordinators on the one store (needs --store-url)")
    ap.add_argument("--tls-seconds", type=float, default=5, help="seconds per TLS-on-gRPC measurement (default 5; "
                    "0 skips figure 4)")
    ap.add_argument("--tls-rounds", type=int, default=3, help="alternating rounds of figure 4 (default 3)")
    ap.add_argument("--tls-clients", type=int, default=8, help="concurrent callers of figure 4's calls (default 8)")
    ap.add_argument("--py-spy", metavar="DIR", default=None,
                    help="record each coordinator with `py-spy record --gil` over the create phase into "
                         "DIR/api-creates-<server>.txt (collapsed stacks; needs py-spy on PATH and ptrace rights)")
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"seconds": 1.0, "watchers": 4, "concurrency": 8, "watch_rate": 20.0,
                                           "watch_seconds": 1.0, "tls_seconds": 0.3, "tls_rounds": 1,
                                           "tls_clients": 2})

    def on_term(signum: int, frame: Any) -> None:
        signal.raise_signal(signal.SIGINT)  # handled like Ctrl-C (asyncio.run cancels its tasks cleanly)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where a shell started us with SIGINT ignored
    if args.replicas < 1 or (args.replicas > 1 and not args.store_url):
        ap.error("--replicas N: N >= 1, and more than one needs --store-url (the replicas share one PostgreSQL)")
    st = State(Path(tempfile.mkdtemp(prefix="nodus-bench-", dir=args.tmp_dir)))
    results: dict[str, Any] = {}
    cluster = None
    try:
        store_url = anchor_url = args.store_url
        if args.store_url == "local":
            sys.path.insert(0, str(TESTS))
            from postgres import PostgresCluster  # tests/postgres.py, here with fsync on
            pg_root = Path(tempfile.mkdtemp(prefix="nodus-bench-api-pg-", dir=args.tmp_dir))  # the server's user reads it
            pg = PostgresCluster(pg_root, durable=True)
            pg.start()
            cluster = pg
            store_url, anchor_url = pg.database(), pg.database()
        extra = ["--store-url", store_url] if store_url else []
        log(f"temp dir {st.tmp}; starting {args.replicas} nodus-coordinator(s)")
        st.coordinators = start_replicas(st.tmp, args.replicas, extra)
        results["replicas"] = [r.http for r in st.coordinators]
        if anchor_url:
            log(f"anchor A: bare psycopg insert loop, {args.seconds:.0f}s")
            results["anchor"] = psycopg_anchor(anchor_url, args.seconds)
        else:
            log(f"anchor A: bare SQLite insert loop, {args.seconds:.0f}s")
            results["anchor"] = sqlite_anchor(st.tmp / "anchor.db", args.seconds)
        asyncio.run(phases(args, st, results))
        if args.tls_seconds > 0:
            log(f"TLS on gRPC: {args.tls_rounds} rounds of {args.tls_seconds:g}s per figure")
            env = _padding_env()
            results["tls"] = api_tls.run(st.tmp / "tls-bench", lambda i: job_body(f"t-{i:07d}", env),
                                         args.concurrency, args.tls_clients, args.tls_seconds, args.tls_rounds)
        for r in st.coordinators:
            if r.proc is not None and r.proc.poll() is not None:
                log(f"coordinator {r.http} exited {r.proc.returncode} during the run")
        with record.Report("api", args):
            report(args, results)
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        sys.exit(130)
    except Exception:
        for r in st.coordinators:
            tail = r.log.read_text(errors="replace")[-4000:] if r.log.is_file() else ""
            if tail.strip():
                log(f"coordinator log tail ({r.data_dir.name}):\n{tail}")
        raise
    finally:
        for p in list(st.children):
            stop_process(p)
        for r in st.coordinators:
            r.stop()
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)
        shutil.rmtree(st.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

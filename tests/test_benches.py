"""Every bench in bench/ runs once, in its tiny configuration, so that none rots unnoticed.

Each test runs one bench as a subprocess with `--tiny` and checks that it exits 0 and that its report
prints each figure beside its anchor, as a number. Nothing is asserted about the numbers themselves:
this machine is shared and noisy, and the benches are where figures are read, not checked.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import netns

BENCH = Path(__file__).resolve().parent.parent / "bench"
NUM = r"-?[\d,]+(?:\.\d+)?"


def run_tiny(name: str, timeout: float = 240, *flags: str) -> str:
    proc = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--tiny", *flags], capture_output=True, text=True,
                          timeout=timeout, cwd=BENCH.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def figures(report: str, patterns: dict[str, str]) -> None:
    """Each pattern (a figure's line, with its numbers as groups) matches a line of the report."""
    for what, pattern in patterns.items():
        found = re.search(pattern, report, re.MULTILINE)
        assert found, f"{what}: no line matching {pattern!r} in\n{report}"
        for number in found.groups():
            float(number.replace(",", ""))


def test_api_bench_reports_creates_gets_and_watch_latency_beside_their_anchors() -> None:
    figures(run_tiny("api"), {
        "creates beside bare SQLite": rf"^durable creates/s\s+({NUM})\s+bare SQLite insert \(sync=FULL\)\s+({NUM})/s",
        "creates beside the echo": rf"^\s+bare 2 KB JSON echo \(same server\)\s+({NUM})/s\s+({NUM})$",
        "gets beside the echo": rf"^gets/s\s+({NUM})\s+bare 2 KB JSON echo \(same server\)\s+({NUM})/s",
        "watch p50 / p99": rf"^watch p50 / p99 \(\d+ watchers\)\s+({NUM}) ms / ({NUM}) ms\s*target p99",
        "watch events missed": rf"^watch events missed\s+({NUM})\s+target 0",
        "gRPC creates with TLS beside plaintext": rf"^gRPC creates/s\s+({NUM}) \(TLS\)\s+creates plaintext\s+"
                                                  rf"({NUM})/s\s+({NUM}) %\s+({NUM}), ({NUM}) vs ({NUM}), ({NUM})$",
        "operator calls with TLS": rf"^gRPC calls/s \(operator\)\s+({NUM}) \(TLS\)\s+operator plaintext\s+({NUM})/s"
                                   rf"\s+({NUM}) %",
        "agent calls with mTLS": rf"^agent heartbeats/s\s+({NUM}) \(mTLS\)\s+agent plaintext\s+({NUM})/s\s+({NUM}) %",
        "the load beside them": rf"^TLS on gRPC: .*load average before ({NUM}) ({NUM}) ({NUM}), after",
        "the TLS targets": r"^TLS targets: creates TLS costs <= 15 %: (?:met|NOT met).*agent mTLS costs <= 15 %",
    })


def test_api_bench_on_postgresql_with_three_replicas_reports_creates_beside_bare_psycopg() -> None:
    report = run_tiny("api", 300, "--store-url", "local", "--replicas", "3")
    figures(report, {
        "three replicas on PostgreSQL": r"^\s+store: PostgreSQL, 3 coordinator\(s\)",
        "creates beside bare psycopg": rf"^durable creates/s\s+({NUM})\s+bare psycopg insert \(fsync=on, "
                                       rf"synchronous_commit=on\)\s+({NUM})/s\s+({NUM})$",
        "gets beside the echo": rf"^gets/s\s+({NUM})\s+bare 2 KB JSON echo \(same server\)\s+({NUM})/s",
        "watch p50 / p99 over the replicas": rf"^watch p50 / p99 \(\d+ watchers\)\s+({NUM}) ms / ({NUM}) ms\s*"
                                             rf"target p99 <= 100 ms",
        "the PostgreSQL targets": r"^targets: durable creates >= 0.5 x bare psycopg: (?:met|NOT met)",
    })


@pytest.mark.host  # runc pods and the OCI registry (the image half)
def test_startup_bench_reports_latency_throughput_and_idle_agent_beside_the_floor() -> None:
    import os
    import shutil

    report = run_tiny("startup")
    figures(report, {
        "p50 beside the floor": rf"^create→Running p50\s+({NUM}) ms .*floor ({NUM}) ms \(`true`\), ({NUM}) ms",
        "p99 beside the SLO": rf"^create→Running p99\s+({NUM}) ms .*pod startup SLO ({NUM}) s p99",
        "indexes/s beside the floor": rf"^indexes/s \(.*\)\s+({NUM})/s .*floor: 1 spawn of `true` = ({NUM})/s",
        "RSS fresh": rf"^agent RSS \(idle, fresh\)\s+({NUM}) MB .*RSS ({NUM}) MB .*PSS ({NUM}) MB",
        "CPU after": rf"^agent CPU \(idle, after runs\)\s+({NUM}) % .*with zygote: ({NUM}) %",
        "where the time goes": rf"^  process\s+({NUM})\s+({NUM})\s+({NUM})\s+({NUM})$",
        "the indexes' phases": rf"^  the many-index Job's indexes \(medians, ms\): created → placed ({NUM}), placed → "
                               rf"inputs ready ({NUM}), inputs ready → started ({NUM}), started → finished ({NUM}), "
                               rf"end → next created ({NUM})$",
        "CPU per index beside the rate it allows": rf"^  CPU per index \(ms\): agent ({NUM}), supervisors ({NUM}), "
                                                  rf"coordinator ({NUM}); sum ({NUM}): .* at most ({NUM}) indexes/s",
        "load average": rf"load average ({NUM}) at the start, ({NUM}) at the end",
    })
    if any(shutil.which(t) is None for t in ("runc", "skopeo", "umoci", "docker-registry")) or os.geteuid() != 0:
        assert re.search(r"^create→Running p50 \(image, warm cache\)\s+skipped", report, re.MULTILINE), report
        return
    figures(report, {
        "image p50 beside runc run": rf"^create→Running p50 \(image, warm cache\)\s+({NUM}) ms\s+≤ floor \+ 30 ms = "
                                     rf"({NUM}) ms\s+(?:ok|MISSED)\s+runc run p50 ({NUM}) ms",
        "image p99 beside runc run": rf"^create→Running p99 \(image, warm cache\)\s+({NUM}) ms\s+runc run p99 ({NUM}) ms",
        "image time split": rf"^  image\s+({NUM})\s+({NUM})\s+({NUM})\s+({NUM})$",
        "image steps": rf"pod namespaces ({NUM}) \(a spare's, claimed\), writable layer ({NUM}), runc run --detach "
                       rf"({NUM}); sum ({NUM}) \(off the attempt's path: import nodus\.agent\.supervisor\.containers "
                       rf"in a fresh process ({NUM}), the zygote preloads it; a spare pod's namespaces made by the agent "
                       rf"after the attempt before ({NUM})\)",
    })


def test_checkpoint_bench_reports_save_restore_and_freeze_pause_beside_the_shell_pipeline() -> None:
    report = run_tiny("checkpoint")
    cols = rf"\s+({NUM})\s+({NUM})\s+({NUM})\s+({NUM})-({NUM})\s+"
    tail = rf"\s+({NUM})\s+({NUM})\s+({NUM})$"
    figures(report, {
        "mixed save beside tar|zstd": rf"^mixed {NUM} MiB\s+save{cols}≥ 1\.5\s+(?:met|MISSED){tail}",
        "mixed restore beside zstd|tar": rf"^mixed {NUM} MiB\s+restore{cols}≥ 1\.5\s+(?:met|MISSED){tail}",
        "text save": rf"^text {NUM} MiB\s+save{cols}≥ 1\.0\s+(?:met|MISSED){tail}",
        "text restore": rf"^text {NUM} MiB\s+restore{cols}≥ 1\.0\s+(?:met|MISSED){tail}",
        "random save": rf"^random {NUM} MiB\s+save{cols}-{tail}",
        "random restore": rf"^random {NUM} MiB\s+restore{cols}-{tail}",
        "archive sizes": rf"archive: nodus ({NUM}) MB, anchor ({NUM}) MB of ({NUM}) MB",
        "the anchors": r"^save anchor: tar -cf - data \| zstd -T0 -3 -o A && sync A; restore anchor: zstd -d",
        "freeze pause beside cp -a": rf"^freeze pause: (?:({NUM})s .* vs )?(?:n/a, .*)?plain cp -a (?:of the state )?({NUM})s",
    })
    assert report.count("restored tree vs source: identical") == 3, report


def test_gang_bench_reports_assembly_and_probe_beside_their_anchors() -> None:
    figures(run_tiny("gang"), {
        "one-node anchor": rf"^one-node Job: placed → started p50 / max\s+({NUM}) ms / ({NUM}) ms",
        "gang assembly": rf"^gang of 2: assembly p50 / max\s+({NUM}) ms / ({NUM}) ms .*({NUM})× the one-node p50",
        "probe busbw": rf"^probe busbw \(.*\), best\s+({NUM}) Gbit/s",
        "plain busbw": rf"^plain all-reduce busbw, same size, best\s+({NUM}) Gbit/s",
        "probe / plain": rf"^probe / plain \(best of each\)\s+({NUM})",
        "RTT beside the echo": rf"^probe worst RTT\s+({NUM}) ms .*raw TCP echo on loopback ({NUM}) ms",
        "through the daemons": rf"^gang of 2 through the daemons, probe on\s+({NUM}) Gbit/s .*rttMs ({NUM})",
        "probed gang start": rf"^gang of 2, probe on: create → started p50 / max\s+({NUM}) s / ({NUM}) s\s+≤ 3 s",
        "hosts' first": rf"^gang of 2, probe on, hosts' first: create → started\s+({NUM}) s",
        "inside the probe": rf"^\s+all-reduce sizes\s+({NUM}) / ({NUM})$",
    })


def test_agent_timings_bench_reports_each_timing_beside_its_anchor_or_target() -> None:
    pair = rf"p50 / max\s+({NUM}) ms / ({NUM}) ms"
    figures(run_tiny("agent_timings"), {
        "cancel, exits on SIGTERM": rf"^cancel → exit, exits on SIGTERM \(grace 30 s\), {pair}\s+beside a bare SIGTERM "
                                    rf"of it ({NUM}) ms; grace ({NUM}) ms",
        "cancel, ignores SIGTERM": rf"^cancel → exit, ignores SIGTERM \(grace 1 s\), {pair}\s+beside the configured "
                                   rf"grace ({NUM}) ms \(p50 over it by ({NUM}) ms\)",
        "init timeout": rf"^init timeout → Failed, {pair}\s+beside the configured timeout ({NUM}) ms",
        "progress folding": rf"^progress messages/s\s+({NUM})/s\s+beside the limit ({NUM})/s .* the program wrote "
                            rf"({NUM}) reports/s",
        "gate stop": rf"^gate stop → Cancelled, {pair}\s+beside a running member's stop ({NUM}) ms / ({NUM}) ms",
        "gate stop, polled": rf"^\s+cancel\.json alone \(polled at the gate\), {pair}",
        "probe, absent peer": rf"^probe, peer never comes: report after {pair}\s+beside its budget ({NUM}) ms",
        "probe, frozen peer": rf"^probe, peer frozen midway: report after {pair}\s+beside its budget ({NUM}) ms",
        "probe without torch": rf"^probe without torch \(RTT only, 2 members\): both reported after {pair}\s+beside "
                               rf"its budget ({NUM}) ms",
        "handshake hold": rf"^handshake hold .*, {pair}\s+beside a plain copy of the state ({NUM}) ms / ({NUM}) ms; "
                          rf"handshake timeout ({NUM}) ms",
        "kill -9 trial": rf"^kill -9 trial, {pair} per trial .*beside an interpreter start with the library ({NUM}) ms "
                         rf"and a 1\.5 MB save in process ({NUM}) ms",
    })


@pytest.mark.host  # network namespaces and veths
@pytest.mark.slow
@pytest.mark.skipif(netns.available() is not None, reason=str(netns.available()))
def test_gang_netns_bench_reports_the_probe_beside_a_raw_echo_and_a_plain_all_reduce() -> None:
    figures(run_tiny("gang_netns"), {
        "RTT beside the echo": rf"^probe RTT, gang 0: ({NUM}) ms  beside raw TCP echo ({NUM}) ms .*probe ÷ echo ({NUM})$",
        "unlimited busbw beside plain": rf"^probe busbw, unlimited .*: ({NUM}) Gbit/s  beside plain all-reduce "
                                        rf"({NUM}) Gbit/s; probe ÷ plain ({NUM})$",
        "limited busbw beside plain": rf"^probe busbw, (?:\d+ Mbit/s tbf: ({NUM}) Gbit/s  beside plain all-reduce "
                                      rf"({NUM}) Gbit/s; .*|tbf-limited: n/a, `tc` is not installed)$",
    })


@pytest.mark.host  # the OCI registry, skopeo and umoci
def test_oci_pull_bench_reports_pulls_beside_skopeo_copy_and_umoci_unpack() -> None:
    figures(run_tiny("oci_pull"), {
        "fetch beside skopeo copy": rf"^cold pull, fetched and verified\s+({NUM}) ms\s+skopeo copy \(same registry\)\s+"
                                    rf"({NUM}) ms\s+ratio ({NUM})\s+target ≥ 1\.0$",
        "the pull through skopeo": rf"^  the same pull through skopeo \(before ADR 0092\)\s+({NUM}) ms\s+ratio ({NUM})$",
        "unpacked beside copy + unpack": rf"^cold pull, unpacked\s+({NUM}) ms\s+skopeo copy \+ umoci raw unpack of it "
                                         rf"alone\s+({NUM}) ms\s+ratio ({NUM})$",
        "warm pull": rf"^warm pull \(cache hit\)\s+({NUM}) ms$",
    })


def test_placement_bench_reports_a_priced_pass_beside_one_without_a_book() -> None:
    figures(run_tiny("placement"), {
        "priced beside unpriced": rf"^priced pass ms\s+({NUM})\s+without a book\s+({NUM}) ms$",
        "per node per attempt": rf"^pricing adds\s+({NUM}) µs per node per attempt$",
    })


def test_backlog_bench_reports_a_waiting_queue_beside_an_idle_coordinator() -> None:
    figures(run_tiny("backlog"), {
        "CPU beside idle": rf"^coordinator CPU \(% of a core\)\s+({NUM}) %\s+({NUM}) %\s+<= 5 %$",
        "GET p99 beside idle": rf"^GET p99 during a burst\s+({NUM}) ms\s+({NUM}) ms\s+<= 20 ms$",
        "watch p99 beside idle": rf"^watch p99 during a burst \(\d+ w\.\)\s+({NUM}) ms\s+({NUM}) ms\s+<= 50 ms$",
        "drain": rf"^drain: attempts placed/s\s+({NUM})/s\s+({NUM}) in ({NUM})s\s+>= 200/s$",
        "missed events": rf"^  burst \(queue\): ({NUM}) GETs \(({NUM}) errors\), ({NUM}) creates; watch p50 ({NUM}) ms, "
                         rf"({NUM}) missed",
    })


def test_estimate_bench_reports_a_priced_dry_run_beside_one_without_a_book() -> None:
    figures(run_tiny("estimate"), {
        "priced beside unpriced": rf"^priced p50 / p99\s+({NUM}) ms /\s+({NUM}) ms\s+without a book\s+({NUM}) ms /"
                                  rf"\s+({NUM}) ms$",
        "what pricing adds": rf"^pricing adds at p99\s+({NUM}) ms\s+target <= 5 ms$",
        "accuracy's run": rf"^accuracy over ({NUM}) Jobs on a real coordinator and ({NUM}) agents \(({NUM}) allowed "
                          rf"interruptible capacity, ({NUM}) reclaimed mid-run\), ({NUM}) min of coordinator time$",
        "actual <= p90": rf"^actual <= p90\s+({NUM}) of ({NUM})\s+\(({NUM}) %\)\s+target >= 90 %$",
        "actual <= p50": rf"^actual <= p50\s+({NUM}) of ({NUM})\s+\(({NUM}) %\)\s+target 40-60 %$",
        "a Job's row": rf"^\s+e000\s+a100-dev-spot\s+({NUM})m\s+({NUM})m\s+({NUM})\s+({NUM})\s+({NUM})\s+({NUM})\s",
    })


def test_sweep_bench_reports_admission_expansion_and_store_writes_beside_plain_jobs() -> None:
    figures(run_tiny("sweep"), {
        "admit beside its target": rf"^admit \(POST to 201\)\s+({NUM}) ms\s+target ≤ ({NUM}) s\s+(?:ok|MISSED)",
        "cells/s beside plain Jobs/s": rf"^cells created/s\s+({NUM})/s\s+target ≥ ({NUM})/s\s+(?:ok|MISSED)\s+"
                                       rf"plain Jobs created/s \(API\) ({NUM})/s",
        "CPU per cell beside per plain Job": rf"^coordinator CPU per cell created\s+({NUM}) ms\s+per plain Job "
                                            rf"created \(API\) ({NUM}) ms",
        "writes per transition beside plain Jobs'": rf"^store writes per cell transition\s+({NUM})\s+"
                                                    rf"plain Jobs' writes per transition ({NUM})",
        "status writes and bytes": rf"^Sweep status writes per cell transition\s+({NUM})\s+status bytes written "
                                   rf"({NUM}) MB\s+final status ({NUM}) MB",
        "load beside the figures": rf"^load average \(1, 5, 15 min\)\s+before ({NUM}) ({NUM}) ({NUM})\s+after",
    })


def test_grpc_tls_bench_reports_tls_and_mtls_calls_beside_plaintext() -> None:
    figures(run_tiny("grpc_tls"), {
        "operator plaintext": rf"^\s+operator plaintext\s+({NUM}) calls/s\s+\(anchor\)",
        "operator TLS": rf"^\s+operator TLS\s+({NUM}) calls/s\s+costs\s+({NUM}) %",
        "agent plaintext": rf"^\s+agent plaintext\s+({NUM}) calls/s\s+\(anchor\)",
        "agent mTLS": rf"^\s+agent mTLS\s+({NUM}) calls/s\s+costs\s+({NUM}) %",
        "handshake": rf"^\s+agent mTLS\s+({NUM}) ms$",
    })


def test_guards_bench_reports_the_rate_limit_and_audit_costs_beside_their_anchors() -> None:
    figures(run_tiny("guards"), {
        "rate limit": rf"^authenticate, cached token: ({NUM}) us/call with the rate limit, ({NUM}) us/call without "
                      rf"\(anchor\); the bucket adds ({NUM}) us$",
        "audit": rf"^audit record: ({NUM}) us/write \(one JSON line, flushed\) beside ({NUM}) us to serialize it "
                 rf"\(anchor\)$",
        "revocation": rf"^revocation on one Identity refused by another on the same store after ({NUM}) ms",
    })


def test_workload_tokens_bench_reports_mint_revoke_and_resync_beside_their_anchors() -> None:
    figures(run_tiny("workload_tokens"), {
        "mint": rf"^\s+attach \(account read, token, index record\)\s+({NUM}) ms each",
        "mint anchor": rf"^\s+anchor: identity.create_token\s+({NUM}) ms each",
        "mint ratio": rf"^\s+ratio ({NUM})x the anchor before, ({NUM})x after$",
        "an attempt ends": rf"^\s+an attempt ends: .*\s({NUM}) ms each",
        "resync": rf"^\s+resync, every token due for renewal\s+({NUM}) ms each",
        "resync anchor": rf"^\s+anchor: store.get of each live token record\s+({NUM}) ms each",
    })


def test_supervisor_bench_reports_an_attempts_start_cpu_and_faults_beside_the_floor() -> None:
    report = run_tiny("supervisor")
    figures(report, {
        "the load": rf"^nodus supervisor benchmark: .*load average ({NUM}) at the start, ({NUM}) at the end",
        "fork → RUNNING beside the floor": rf"^fork → RUNNING p50 / p99 \(ms\)\s+({NUM}) / ({NUM})\s+({NUM}) / ({NUM})",
        "fork → exit": rf"^fork → exit p50 \(ms\)\s+({NUM})\s+({NUM})$",
        "CPU": rf"^CPU per attempt \(ms\)\s+({NUM})\s+({NUM})$",
        "page faults": rf"^page faults per attempt\s+({NUM})\s+({NUM})$",
    })

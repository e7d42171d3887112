"""`nodus-coordinator`: the control plane process.

One asyncio loop serves the gRPC API and the HTTPS REST gateway over one resource service and one
store. First start bootstraps the data dir: the store, the projects `default` and `nodus`, a CA and
serving certificate, an admin kubeconfig (0600) and an agent join token.
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
from aiohttp import web

from nodus import config as daemon_config

from . import gc_settings, grpc_api, replica_settings, workload_settings
from .bootstrap import bootstrap
from .api import units
from .blobs.open import add_flags as add_blob_flags, from_args as open_blob_store
from .clock import OffsetClock, SystemClock
from .errors import NodusError
from .heap import HeapSettings, settle as settle_heap
from .api.limits import AdmissionLimits
from .controllers.gang import GangConfig
from .controllers.job_controller import WORKERS as JOB_WORKERS
from .plane import ControlPlane
from .controllers.cache import Cache
from .controllers.fleet import Fleet
from .pricebook_api import apply_file as apply_price_book
from .gateway import downloads
from .gateway.app import make_app
from .gateway import images as image_routes
from .image_push import ImagePushService
from .images import ImageResolver
from .operator_registry import OperatorRegistry
from .identity import Identity
from .resources import ResourceService
from .store.base import Store
from .store.copy import copy_sqlite_to_postgres
from .store.opening import open_store
from .enrol import Enrolments
from .tls import CertificateAuthority, TlsFiles, agent_credentials, ensure_tls, grpc_credentials, write_private
from .vault import Vault, load_or_create_key
from . import audit_query, tokens_settings, vault_rotate

log = logging.getLogger("nodus.coordinator")

DEFAULTS = {
    "data_dir": "/var/lib/nodus/coordinator",
    "grpc_listen": "127.0.0.1:7070",
    "http_listen": "127.0.0.1:8080",
    "store_url": "",
    "tls_cert": "",
    "tls_key": "",
    "grpc_insecure": False,
    "agent_listen": "",
    "node_certificate_lifetime": "24h",
    "compact_interval": 300.0,
    "lease_duration": "15s",
    "heartbeat_interval": "3s",
    "controllers": "on",
    "log_level": "INFO",
    "gang_probe": "on",
    "gang_probe_bytes": "16Mi",
    "gang_probe_budget": "30s",
    "clock_offset_file": "",
    "gang_max_nodes": 8,
    "job_workers": JOB_WORKERS,
    "free_storage": "10Gi",
    "retention_interval": "1m",
    "event_ttl": "1h",
    "gc_freeze": "on",
    "price_book": "",
    "image_registry": "",
    "image_registry_auth_file": "",
}


def _split(hostport: str) -> tuple[str, int]:
    host, _, port = hostport.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


@dataclass(slots=True)
class Endpoints:
    grpc: str
    http: str


async def _compact_loop(store: Store, interval: float) -> None:
    """Keeps at least `interval` seconds of history, as kube-apiserver keeps five minutes."""
    previous = store.revision
    while True:
        await asyncio.sleep(interval)
        if previous > store.compacted_revision:
            await store.compact(previous)
        previous = store.revision


REST_STOP_GRACE = 3.0
"""How long a stop lets REST requests in flight finish before it cancels them (aiohttp's default of 60 s
let one request whose body never came hold a SIGTERM for a minute; watches are ended at once)."""
STOP_WATCHDOG_SECONDS = 5.0
"""A stop slower than this logs what every task still waits on (systemd's stop timeout then kills)."""


async def _stop_watchdog(after: float) -> None:
    await asyncio.sleep(after)
    me = asyncio.current_task()
    for task in asyncio.all_tasks():
        if task is me:
            continue
        log.warning("still stopping after %.0f s; task %s waits at:%s", after, task.get_name(),
                    "".join(f"\n    {where}" for where in _awaiting(task.get_coro())))


def _awaiting(coro: Any) -> list[str]:
    """file:line of each coroutine (and async generator) in the chain `coro` awaits, outermost first."""
    out: list[str] = []
    while coro is not None and len(out) < 40:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            out.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None) or getattr(coro, "gi_yieldfrom", None)
    return out


def _notify(message: str) -> None:
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.connect(addr)
            s.sendall(message.encode())
        except OSError as e:
            log.warning("sd_notify failed: %s", e)


async def serve(args: argparse.Namespace, stop: asyncio.Event | None = None) -> None:
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    store = await open_store(args.store_url, data_dir)
    clock = OffsetClock(Path(args.clock_offset_file)) if args.clock_offset_file else SystemClock()
    identity = tokens_settings.identity(store, args, data_dir, clock.now)  # rate limits, audit log (ADR 0046)
    vault = Vault(store, load_or_create_key(data_dir / "secret.key"))
    fleet = Fleet(Cache(store), clock)  # the watch-fed view the controllers and the estimates read
    resolver = _image_resolver(args)
    service = ResourceService(store, identity, vault, limits=_admission_limits(args), images=resolver, fleet=fleet)
    lease, heartbeat = _lease_settings(args)
    if args.price_book:
        await apply_price_book(store, Path(args.price_book), clock)
    blobs = await open_blob_store(args, data_dir)  # outputs, logs, checkpoints, volumes (ADRs 0011, 0044)
    free_storage, retention_interval = _storage_settings(args)
    plane = ControlPlane(store, fleet, service, vault, clock, lease_duration=lease, heartbeat_interval=heartbeat,
                         gangs=_gang_settings(args), blobs=blobs, retention_interval=retention_interval,
                         gc=gc_settings.gc(args),
                         free_storage=free_storage, image_registry=resolver.operator, event_ttl=_event_ttl(args),
                         leader=replica_settings.leader(args), job_workers=_job_workers(args))
    await plane.start(controllers=args.controllers != "off")

    grpc_host, grpc_port = _split(args.grpc_listen)
    http_host, http_port = _split(args.http_listen)
    grpc_insecure = _grpc_insecure(args, grpc_host)
    agent_host, agent_port = _agent_listen(args, grpc_host, grpc_port)
    own = ensure_tls(data_dir, [http_host, grpc_host, agent_host, *workload_settings.hosts(args)])  # signs nodes' too
    tls = TlsFiles(Path(args.tls_cert), Path(args.tls_key), None) if args.tls_cert and args.tls_key else own
    agent_listen = None
    if not grpc_insecure:  # node identity (docs/adr/0039-grpc-tls-and-node-identity.md)
        # Certificates are stamped on the real clock (TLS checks them so), not --clock-offset-file's.
        plane.agents.enrolments = Enrolments(store, identity, CertificateAuthority.load(data_dir / "tls"),
                                             SystemClock(), _certificate_lifetime(args), data_dir / "join-token")
        agent_listen = (f"{agent_host}:{agent_port}", agent_credentials(own))

    grpc_server = await grpc_api.start(service, f"{grpc_host}:{grpc_port}", blobs,
                                       servicers=plane.servicers(), clock=clock,
                                       credentials=None if grpc_insecure else grpc_credentials(tls),
                                       agent_port=agent_listen, node_peer=plane.agents.peer,
                                       scope=None if grpc_insecure else plane.agents.scope)  # ADR 0045
    plane.serving(grpc_server.agent_port)  # agents can reconnect from now: the leases' grace starts (ADR 0088)
    app, gateway = make_app(service)
    gateway.replica = plane.replica_status  # /readyz?verbose: leader or follower, epoch, watch lag
    app[downloads.BLOBS] = blobs
    app[image_routes.IMAGES] = ImagePushService(resolver.operator, resolver, data_dir / "image-uploads")
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=REST_STOP_GRACE)
    await runner.setup()
    site = web.TCPSite(runner, http_host, http_port, ssl_context=tls.server_context(), backlog=1024)
    await site.start()
    bound_http = http_port or runner.addresses[0][1]
    endpoints = Endpoints(f"{_client_host(grpc_host)}:{grpc_server.port}",
                          f"https://{_client_host(http_host)}:{bound_http}")
    await bootstrap(data_dir, identity, endpoints.http, tls, endpoints.grpc, grpc_insecure)
    # What an attempt with a ServiceAccount reaches the REST API by: --attempt-api-server or the kubeconfig's (ADR 0065).
    plane.agents.api = workload_settings.endpoint(args, endpoints.http, tls.ca.read_bytes() if tls.ca else b"")
    write_private(data_dir / "endpoints.json", orjson.dumps({
        "grpc": endpoints.grpc, "http": endpoints.http, "grpcTls": not grpc_insecure,
        **({"agent": f"{_client_host(agent_host)}:{grpc_server.agent_port}"} if grpc_server.agent_port else {})}))
    # Start-up is done and the cache has synced: its heap leaves the collector's generations (heap.py).
    settle_heap(_heap_settings(args))
    gateway.ready = True
    grpc_server.set_serving()
    log.info("nodus-coordinator ready: REST %s, gRPC %s (%s), data %s", endpoints.http, endpoints.grpc,
             "plaintext, --grpc-insecure" if grpc_insecure else "TLS", data_dir)
    print(f"nodus-coordinator ready: REST {endpoints.http} gRPC {endpoints.grpc} "
          f"kubeconfig {data_dir / 'kubeconfig'}", flush=True)
    _notify("READY=1")

    compactor = asyncio.create_task(_compact_loop(store, float(args.compact_interval)))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    await stop.wait()
    _notify("STOPPING=1")
    gateway.ready = False
    compactor.cancel()
    t0 = time.monotonic()
    log.info("stopping")
    watchdog = asyncio.create_task(_stop_watchdog(STOP_WATCHDOG_SECONDS))
    await plane.stop()
    t1 = time.monotonic()
    await grpc_server.server.stop(grace=2)
    t2 = time.monotonic()
    await runner.cleanup()
    t3 = time.monotonic()
    await store.close()
    watchdog.cancel()
    log.info("stopped in %.2f s: controllers and agent streams %.2f s, gRPC %.2f s, REST %.2f s, store %.2f s",
             time.monotonic() - t0, t1 - t0, t2 - t1, t3 - t2, time.monotonic() - t3)


def _store_copy(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="nodus-coordinator store copy",
                                description="Copy a stopped coordinator's SQLite store into an empty PostgreSQL "
                                            "store; start the coordinator on it with --store-url and the same "
                                            "--data-dir (the vault key, secret.key, stays there).")
    p.add_argument("--from", dest="source", required=True, help="sqlite://DIR: the coordinator's data dir")
    p.add_argument("--to", dest="target", required=True, help="postgresql://USER@HOST:PORT/DBNAME (empty)")
    args = p.parse_args(argv)
    if not args.source.startswith("sqlite://"):
        p.error(f"--from: {args.source!r} is not sqlite://DIR")
    if not args.target.startswith(("postgresql://", "postgres://")):
        p.error("--to: expected postgresql://USER@HOST:PORT/DBNAME")
    try:
        copied = asyncio.run(copy_sqlite_to_postgres(Path(args.source[len("sqlite://"):]) / "store.db", args.target))
    except NodusError as e:
        raise SystemExit(f"store copy: {e.message}") from e
    except psycopg.Error as e:
        raise SystemExit(f"store copy: --to: cannot write the PostgreSQL store: {e}") from e
    print(f"copied {copied.keys} keys and {copied.history} history entries at revision {copied.revision} "
          f"(compacted {copied.compacted})")


def _grpc_insecure(args: argparse.Namespace, host: str) -> bool:
    """--grpc-insecure: plaintext gRPC, allowed only on a loopback --grpc-listen (what crosses it:
    tokens, the join token, Secret values in Assignments)."""
    if not _bool_setting(args.grpc_insecure):
        return False
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise SystemExit(f"--grpc-insecure serves gRPC in plaintext and is allowed only on a loopback "
                         f"--grpc-listen (127.0.0.1, ::1 or localhost), not {args.grpc_listen}: drop --grpc-insecure "
                         f"(agents then take --coordinator-ca DATA_DIR/tls/ca.crt) or listen on loopback")
    return True


def _agent_listen(args: argparse.Namespace, grpc_host: str, grpc_port: int) -> tuple[str, int]:
    """--agent-listen, the agents' mTLS port: by default the gRPC host and the next port (any free
    port when gRPC takes one, port 0)."""
    if args.agent_listen:
        return _split(str(args.agent_listen))
    return grpc_host, grpc_port + 1 if grpc_port else 0


def _certificate_lifetime(args: argparse.Namespace) -> float:
    try:
        lifetime = units.parse_duration_ns(str(args.node_certificate_lifetime)) / units.NS_PER_SECOND
    except ValueError as e:
        raise SystemExit(f"--node-certificate-lifetime: {e}") from None
    if not 10 <= lifetime <= 366 * 24 * 3600:
        raise SystemExit(f"--node-certificate-lifetime must be between 10s and 8784h (got "
                         f"{args.node_certificate_lifetime})")
    return lifetime


def _bool_setting(value: object) -> bool:
    """A boolean flag as the command line (True), the config file (a bool) or NODUS_* (text) gives it."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise SystemExit(f"--grpc-insecure: expected true or false, got {value!r}")


def _lease_settings(args: argparse.Namespace) -> tuple[float, float]:
    """--lease-duration and --heartbeat-interval as seconds; a heartbeat must fit in a lease twice."""
    try:
        lease = units.parse_duration_ns(str(args.lease_duration)) / units.NS_PER_SECOND
        heartbeat = units.parse_duration_ns(str(args.heartbeat_interval)) / units.NS_PER_SECOND
    except ValueError as e:
        raise SystemExit(f"--lease-duration / --heartbeat-interval: {e}") from None
    if lease <= 0 or heartbeat <= 0 or heartbeat * 2 > lease:
        raise SystemExit("--heartbeat-interval must be positive and at most half of --lease-duration "
                         f"(got {args.heartbeat_interval} and {args.lease_duration})")
    return lease, heartbeat


def _gang_settings(args: argparse.Namespace) -> GangConfig:
    try:
        size = int(units.parse_quantity(str(args.gang_probe_bytes)))
        budget = units.parse_duration_ns(str(args.gang_probe_budget)) / units.NS_PER_SECOND
    except (ValueError, ArithmeticError) as e:
        raise SystemExit(f"--gang-probe-bytes / --gang-probe-budget: {e}") from None
    if not 8 <= size <= 1 << 30:
        raise SystemExit(f"--gang-probe-bytes must be between 8 and 1Gi (got {args.gang_probe_bytes})")
    if not 1 <= budget <= 30:
        raise SystemExit(f"--gang-probe-budget must be between 1s and 30s (got {args.gang_probe_budget})")
    return GangConfig(probe=args.gang_probe != "off", probe_max_bytes=size, probe_budget_seconds=budget)


def _admission_limits(args: argparse.Namespace) -> AdmissionLimits:
    """--gang-max-nodes as the limits every admission of this coordinator applies."""
    try:
        return AdmissionLimits(gang_max_nodes=int(args.gang_max_nodes))
    except ValueError as e:
        raise SystemExit(f"--gang-max-nodes: {e}") from None


def _image_resolver(args: argparse.Namespace) -> ImageResolver:
    """Admission resolves every Job's image through skopeo; without it image Jobs are refused (503
    naming the cause), never admitted unpinned, so say so at start too."""
    if shutil.which("skopeo") is None:
        log.error("skopeo is not on the PATH: Jobs with an image are refused until it is installed (scripts/setup)")
    hosts = args.insecure_registry or ()
    if isinstance(hosts, str):  # NODUS_INSECURE_REGISTRY: a comma-separated list
        hosts = [h.strip() for h in hosts.split(",") if h.strip()]
    insecure = frozenset(str(h) for h in hosts)
    operator = None
    if args.image_registry:  # where `nodus image push` puts projects' images (docs/adr/0032-image-push.md)
        try:
            operator = OperatorRegistry.parse(str(args.image_registry), str(args.image_registry_auth_file or ""),
                                              insecure)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    elif args.image_registry_auth_file:
        raise SystemExit("--image-registry-auth-file needs --image-registry HOST:PORT[/PREFIX]")
    return ImageResolver(insecure=insecure, operator=operator)


def _heap_settings(args: argparse.Namespace) -> HeapSettings:
    try:
        return HeapSettings.of(args.gc_freeze)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def _job_workers(args: argparse.Namespace) -> int:
    workers = int(args.job_workers)
    if not 1 <= workers <= 1024:
        raise SystemExit(f"--job-workers must be between 1 and 1024 (got {workers})")
    return workers


def _event_ttl(args: argparse.Namespace) -> float:
    try:
        ttl = units.parse_duration_ns(str(args.event_ttl)) / units.NS_PER_SECOND
    except ValueError as e:
        raise SystemExit(f"--event-ttl: {e}") from None
    if not 60 <= ttl <= 720 * 3600:
        raise SystemExit(f"--event-ttl must be between 1m and 720h (got {args.event_ttl})")
    return ttl


def _storage_settings(args: argparse.Namespace) -> tuple[int, float]:
    """--free-storage in bytes and --retention-interval in seconds."""
    try:
        free = int(units.parse_quantity(str(args.free_storage)))
    except (ValueError, ArithmeticError) as e:
        raise SystemExit(f"--free-storage: {e}") from None
    if free < 0:
        raise SystemExit(f"--free-storage: the free storage inclusion must not be negative, got {free}")
    try:
        interval = units.parse_duration_ns(str(args.retention_interval)) / units.NS_PER_SECOND
    except ValueError as e:
        raise SystemExit(f"--retention-interval: {e}") from None
    if not 1 <= interval <= 3600:
        raise SystemExit(f"--retention-interval must be between 1s and 1h (got {args.retention_interval})")
    return free, interval


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodus-coordinator", description="The Nodus control plane.")
    p.add_argument("--config", help="YAML file of settings (keys as the long flags, without --)")
    p.add_argument("--data-dir", help=f"state directory (default {DEFAULTS['data_dir']}; env NODUS_DATA_DIR)")
    p.add_argument("--grpc-listen", help=f"gRPC HOST:PORT (default {DEFAULTS['grpc_listen']})")
    p.add_argument("--http-listen", help=f"HTTPS REST HOST:PORT (default {DEFAULTS['http_listen']})")
    p.add_argument("--store-url", help="postgresql://… (default: SQLite in the data dir)")
    p.add_argument("--tls-cert", help="serving certificate (PEM); default: one signed by a CA made in the data dir")
    p.add_argument("--tls-key", help="its private key (PEM)")
    p.add_argument("--agent-listen", help="HOST:PORT of the agents' mTLS port, where enrolled nodes connect with "
                   "their certificates (default: the --grpc-listen host, its port + 1)")
    p.add_argument("--node-certificate-lifetime", help="how long a node certificate lasts, as a duration (default "
                   "24h); agents renew at two thirds of it")
    p.add_argument("--grpc-insecure", action="store_const", const=True,
                   help="serve gRPC in plaintext (development on loopback only: refused on any other --grpc-listen; "
                        "default: TLS with the serving certificate REST uses)")
    p.add_argument("--compact-interval", type=float, help="seconds of watch history kept (default 300)")
    p.add_argument("--lease-duration", help="how long a node's lease lasts without a heartbeat, as a duration "
                   "(default 15s); past it the node is NotReady and its attempts are replaced")
    p.add_argument("--heartbeat-interval", help="how often agents send a heartbeat (default 3s; at most half the "
                   "lease duration)")
    p.add_argument("--controllers", choices=("on", "off"),
                   help="off serves the API (and agents) without running the Job, placement and lease controllers: "
                        "for a replica that does not lead, or for tests of the API's own semantics (default on)")
    p.add_argument("--gang-probe", choices=("on", "off"),
                   help="measure a gang's network (RTT between members, all-reduce bus bandwidth) before it starts "
                        "(default on)")
    p.add_argument("--job-workers", type=int, help="Jobs the Job controller reconciles at once, 1-1024: more share "
                   "the store's commits and turn Jobs over faster (default 64)")
    p.add_argument("--free-storage", help="bytes of checkpoints and outputs each Job keeps free of charge; "
                   "status.storage.billedBytes is the share above it (default 10Gi)")
    p.add_argument("--price-book", help="price book YAML to apply at start (examples/pricebook.yaml); without one "
                   "(and none applied before) Nodus charges nothing and refuses nothing for money")
    p.add_argument("--retention-interval", help="how often checkpoints past their retention (retainAfterFinish, "
                   "the TTL, a deleted Job) and superseded ones are deleted, 1s-1h (default 1m)")
    p.add_argument("--event-ttl", help="how long a Job's Events (kubectl describe, kubectl get events) are kept "
                   "after they happened, 1m-720h (default 1h, as kube-apiserver's --event-ttl)")
    p.add_argument("--gang-max-nodes", type=int, help="the most nodes a gang may ask for, 2-16 (default 8 during "
                   "the beta)")
    p.add_argument("--gang-probe-bytes", help="largest all-reduce message the probe measures (default 16Mi)")
    p.add_argument("--gang-probe-budget", help="time budget of one probe, at most 30s (default 30s)")
    p.add_argument("--clock-offset-file", help="for drills and tests: a file holding seconds added to the wall "
                   "clock (re-read every 50 ms), to see timeouts, TTLs and leases play out without waiting")
    p.add_argument("--insecure-registry", action="append",
                   help="a registry HOST:PORT reached over plain HTTP when admission resolves images (repeatable; "
                        "the agents' own list must name it too)")
    p.add_argument("--image-registry", help="HOST:PORT[/PREFIX] of the operator's registry: `nodus image push` "
                   "puts a project's images under PREFIX/<project>/ there, and Jobs naming them pull with its "
                   "credentials (plain HTTP when --insecure-registry names the host)")
    p.add_argument("--image-registry-auth-file", help="docker config JSON (what `skopeo login --authfile FILE` "
                   "writes) holding the login for --image-registry; customers never see it")
    p.add_argument("--gc-freeze", choices=("on", "off"),
                   help="after start-up, move the synced cache out of the garbage collector's generations so full "
                        "collections do not rescan it (default on; docs/adr/0035-gc-freeze.md)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING (default INFO)")
    p.set_defaults(_defaults=DEFAULTS)
    gc_settings.add_flags(p)  # --blob-gc-interval, --blob-gc-grace (ADR 0047)
    replica_settings.add_flags(p)  # --leader-lease, --leader-renew-interval (ADR 0043)
    add_blob_flags(p)  # --blob-url, --blob-endpoint, --blob-region (ADR 0044)
    tokens_settings.add_flags(p)  # --rate-limit, --rate-burst, --audit-log-* (ADR 0046)
    workload_settings.add_flags(p)  # --attempt-api-server (ADR 0065)
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] in (["store", "copy"], ["vault", "rotate"], ["audit", "query"]):  # beside the daemon (ADR 0046)
        {"store": _store_copy, "vault": vault_rotate.main, "audit": audit_query.main}[argv[0]](argv[2:])
        return
    if argv[:1] in (["install"], ["uninstall"]):  # the host set up or taken down (install.py, ADR 0056)
        from .install import main as install_main
        install_main(argv[0], argv[1:])
        return
    args = daemon_config.resolve(parser(), argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()

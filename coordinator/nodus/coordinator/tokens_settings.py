"""The coordinator's flags for what guards its API: per-token rate limits and the audit log.

main.py adds them to its parser (`add_flags`) and builds its Identity with them (`identity`);
docs/adr/0046-tokens-rate-limits-audit.md says why each default is what it is.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from .api import units
from .audit import DEFAULT_BACKUPS, AuditLog
from .identity import Identity
from .ratelimit import DEFAULT_BURST, DEFAULT_RATE, RateSettings, TokenBuckets
from .store.base import Store

DEFAULTS = {
    "rate_limit": DEFAULT_RATE,
    "rate_burst": DEFAULT_BURST,
    "rate_limit_operators": "off",
    "audit_log_max_size": "100Mi",
    "audit_log_backups": DEFAULT_BACKUPS,
}


def add_flags(p: argparse.ArgumentParser) -> None:
    """The flags, and their defaults beside the parser's own (`_defaults`, as nodus.config reads them)."""
    p.add_argument("--rate-limit", type=float, help=f"requests a second each token may send on average; over it "
                   f"the API answers 429 with Retry-After (default {DEFAULT_RATE:g}; 0 turns limits off)")
    p.add_argument("--rate-burst", type=int, help=f"requests a token may send at once (default {DEFAULT_BURST})")
    p.add_argument("--rate-limit-operators", choices=("on", "off"),
                   help="limit operator tokens (admin of every project) too (default off: exempt, as "
                        "kube-apiserver exempts system:masters)")
    p.add_argument("--audit-log-max-size", help="DATA_DIR/audit.log is rotated at this size (default 100Mi)")
    p.add_argument("--audit-log-backups", type=int,
                   help=f"rotated audit logs kept, audit.log.1 … (default {DEFAULT_BACKUPS})")
    p.set_defaults(_defaults={**(p.get_default("_defaults") or {}), **DEFAULTS})


def rate_settings(args: argparse.Namespace) -> RateSettings:
    try:
        return RateSettings(float(args.rate_limit), int(args.rate_burst), str(args.rate_limit_operators) == "on")
    except ValueError as e:
        raise SystemExit(str(e)) from None


def audit_log(args: argparse.Namespace, data_dir: Path) -> AuditLog:
    try:
        size = int(units.parse_quantity(str(args.audit_log_max_size)))
    except (ValueError, ArithmeticError) as e:
        raise SystemExit(f"--audit-log-max-size: {e}") from None
    if size < 4096:
        raise SystemExit(f"--audit-log-max-size must be at least 4Ki (got {args.audit_log_max_size})")
    if int(args.audit_log_backups) < 1:
        raise SystemExit(f"--audit-log-backups must be at least 1 (got {args.audit_log_backups})")
    return AuditLog(data_dir / "audit.log", size, int(args.audit_log_backups))


def identity(store: Store, args: argparse.Namespace, data_dir: Path, clock: Callable[[], float]) -> Identity:
    """The coordinator's Identity, its tokens rate-limited and its writes audited as the flags say; token
    expiry on the coordinator's clock (--clock-offset-file moves it as it moves every other deadline)."""
    return Identity(store, clock=clock, limiter=TokenBuckets(rate_settings(args)), audit=audit_log(args, data_dir))

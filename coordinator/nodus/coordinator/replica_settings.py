"""The coordinator's flags for running several replicas on one store: the controllers' leader lease.

main.py adds them to its parser (`add_flags`) and hands `leader(args)` to the control plane;
docs/adr/0043-leader-lease-and-fencing.md says why the defaults are what they are.
"""
from __future__ import annotations

import argparse

from .api import units
from .controllers.leader import LeaderSettings

DEFAULTS = {"leader_lease": "10s", "leader_renew_interval": "2s"}


def add_flags(p: argparse.ArgumentParser) -> None:
    """The flags, and their defaults beside the parser's own (`_defaults`, as nodus.config reads them)."""
    p.add_argument("--leader-lease", help="how long the controllers' lease lasts without a renewal; a replica "
                   "takes over that long after the leader died (default 10s; with one replica it never matters)")
    p.add_argument("--leader-renew-interval", help="how often every replica claims or renews the lease, at most "
                   "half of --leader-lease (default 2s)")
    p.set_defaults(_defaults={**(p.get_default("_defaults") or {}), **DEFAULTS})


def leader(args: argparse.Namespace) -> LeaderSettings:
    """--leader-lease and --leader-renew-interval as seconds; a lease must outlast two renewals."""
    try:
        duration = units.parse_duration_ns(str(args.leader_lease)) / units.NS_PER_SECOND
        renew = units.parse_duration_ns(str(args.leader_renew_interval)) / units.NS_PER_SECOND
    except ValueError as e:
        raise SystemExit(f"--leader-lease / --leader-renew-interval: {e}") from None
    if not 0 < renew <= duration / 2:
        raise SystemExit("--leader-renew-interval must be positive and at most half of --leader-lease "
                         f"(got {args.leader_renew_interval} and {args.leader_lease})")
    return LeaderSettings(duration, renew)

"""status.estimate, pure: what a create would cost, computed from the Job's shape, the active price
book, a placement preview and this fleet's own measurements (issue 12, part 3).

Duration, first found wins: `spec.expectedDuration` (on the reference accelerator, as placement reads
it), else the median of comparable finished Jobs of this fleet (same project and command or image
digest), else none: a NoDuration warning and costUSD per hour of running. Without a price book the
estimate says so (pricebookVersion empty, an Unpriced warning) and refuses nothing.

Every amount is a Decimal, shown as a decimal string; one index of a gang of `members` nodes costs
`members` allocations of the offering. The ETag of a dry run names this estimate: the spec's hash,
the book's version and the rate, and a create with `If-Match` is bound to it (`binding`).
"""
from __future__ import annotations

import enum
import hashlib
import hmac
from dataclasses import dataclass, field
from decimal import Decimal
from statistics import median_low
from typing import Any, Callable, Mapping, Sequence

import orjson

from ..api import units
from ..clock import rfc3339
from .estimate import Band, Tariff, cents, cost_band
from .holds import first_hold
from .policy import RESTART_OVERHEAD_S
from .pricebook import Offering, PriceBook

VALID_FOR_S = 900
"""validUntil is this long after the estimate: prices and free capacity are read again after it."""
BOUND_MARGIN = Decimal("1.10")
"""A create bound to an estimate is never placed above its rate plus 10 %."""
DEFAULT_STARTUP_TIMEOUT_S = 900
DEFAULT_ASSEMBLY_RETRIES = 2
ETAG_PREFIX = "e1"


class DurationSource(enum.Enum):
    """Where the estimate's run time came from."""

    DECLARED = "expectedDuration"
    """spec.expectedDuration."""
    HISTORY = "history"
    """The median of comparable finished Jobs of this fleet."""
    NONE = "none"
    """Neither: costUSD is per hour of running."""


@dataclass(frozen=True, slots=True)
class Shape:
    """What of a Job's spec the estimate reads."""

    completions: int = 1
    slots: int = 1
    """Indexes that start at once (parallelism)."""
    members: int = 1
    """Nodes per index: a gang's size, 1 otherwise."""
    startup_timeout_s: int = DEFAULT_STARTUP_TIMEOUT_S
    assembly_retries: int = DEFAULT_ASSEMBLY_RETRIES
    duration_s: Decimal | None = None
    source: DurationSource = DurationSource.NONE
    max_cost_usd: Decimal | None = None
    topology: str = ""
    """A gang's resolved topology, in words."""
    factors: tuple[Decimal, ...] = ()
    """The spread of the run around `duration_s`, from this fleet's own record (`spread`): a run takes
    `duration_s` × one of these, each as likely. For a declared duration, the project's finished Jobs'
    actual/declared ratios and the declaration itself (a 1: the user's word counts as one run, so one
    odd Job does not outweigh it); for a duration from history, the history over its median. Empty
    without a record: the run takes exactly `duration_s`."""
    continuity: str = "Checkpointed"
    """spec.recovery.continuity: what a reclaim of interruptible capacity makes the run redo (`redo_s`)."""
    runs: int = 0
    """Finished runs behind `factors` (the project's record, or the comparable Jobs' history): fewer than
    THIN_RECORD cannot show their own 90th percentile."""

    @classmethod
    def of(cls, spec: Mapping[str, Any], history: Sequence[Decimal] = (),
           topology: Mapping[str, Any] | None = None, overruns: Sequence[Decimal] = ()) -> Shape:
        """The shape of an admitted Job spec; `history` is the run seconds of comparable finished Jobs,
        `topology` a gang's status.topology (nodes from spec.distributed.nodes or totalGPUs), `overruns`
        the project's finished Jobs' actual run over their declared expectedDuration."""
        completions = int(spec.get("completions") or 1)
        slots = max(1, min(int(spec.get("parallelism") or 1), completions))
        dist = spec.get("distributed") or {}
        members = int((topology or {}).get("nodes") or dist.get("nodes") or 1) if dist else 1
        words = ""
        if dist and topology:
            words = (f'{topology.get("nodes")} nodes × {topology.get("gpusPerNode")} GPUs '
                     f'({topology.get("network", "Regional")})')
        timeout = DEFAULT_STARTUP_TIMEOUT_S
        if dist.get("startupTimeout"):
            timeout = int(units.duration_seconds(str(dist["startupTimeout"])))
        retries = int(dist.get("maxAssemblyRetries", DEFAULT_ASSEMBLY_RETRIES)) if dist else 0
        duration, source = None, DurationSource.NONE
        factors: tuple[Decimal, ...] = ()
        runs = 0
        if spec.get("expectedDuration"):
            duration, source = units.duration_seconds(str(spec["expectedDuration"])), DurationSource.DECLARED
            factors = spread([*overruns, Decimal(1)]) if overruns else ()  # the declaration counts as one run
            runs = len(overruns)
        elif history:
            duration, source = median_low(sorted(history)), DurationSource.HISTORY
            if duration > 0:
                factors = spread([h / duration for h in history])
            runs = len(history)
        cap = units.parse_money(spec["maxCostUSD"]) if spec.get("maxCostUSD") else None
        continuity = str((spec.get("recovery") or {}).get("continuity") or "Checkpointed")
        return cls(completions, slots, members, timeout, retries, duration, source, cap, words or (
            f"{members} nodes" if members > 1 else ""), factors, continuity, runs)


def redo_s(continuity: str, run_s: Decimal) -> Decimal:
    """The work one reclaim of interruptible capacity makes a run of `run_s` do again, by its continuity.
    A reclaim is a notice (NodeService.Reclaim, checkpoints/reclaim.py): a Checkpointed Job checkpoints
    within the grace and its replacement restores that checkpoint, so it redoes nothing (what the reclaim
    costs is the replacement's allocation: its boot and restore, measured per offering like every start,
    and its increments); a Restartable one resumes from its last progress cursor, which Nodus cannot see
    (RESTART_OVERHEAD_S, placement's assumption); an Ephemeral one starts over, on average half way."""
    if continuity == "Checkpointed":
        return Decimal(0)
    if continuity == "Ephemeral":
        return run_s / 2
    return RESTART_OVERHEAD_S


THIN_RECORD = 9
"""A record of fewer finished runs cannot show its own 90th percentile: the next run passes the largest
of n about once in n + 1 (`spread`), so the largest of a handful is a p75 or less, and no record at all
says nothing of how much longer than declared a run may take."""
UNMEASURED_OVERRUN = Decimal("1.5")
"""While the record is thin the p90 lets the run take at least this many times its duration: the one
assumed figure of the estimate (a declared duration is a guess, and guesses of run time overrun by half
often enough that a p90 without this floor covers about half of a project's first Jobs). The record
replaces it once it holds THIN_RECORD runs."""

SPREAD_POINTS = 64
"""A record is summed over at most this many of its order statistics (the estimate's latency stays flat
however many Jobs a project ran)."""


def spread(ratios: Sequence[Decimal]) -> tuple[Decimal, ...]:
    """Run-length factors from a record of n ratios (actual over declared, or over the median), each as
    likely: the record's order statistics and its largest once more. The next run is as likely to fall
    in any of the n + 1 gaps the record leaves, the last of them beyond its largest (a run of n Jobs says
    nothing about how much longer the next may take): so P(next <= the k-th smallest) = k / (n + 1), and
    a p90 of few Jobs is their largest. A long record is thinned to SPREAD_POINTS evenly spaced ranks."""
    ordered = sorted(r for r in ratios if r >= 0)
    if not ordered:
        return ()
    n = len(ordered)
    if n > SPREAD_POINTS - 1:
        m = SPREAD_POINTS - 1
        ordered = [ordered[min(n - 1, (2 * i + 1) * n // (2 * m))] for i in range(m)]
    return (*ordered, ordered[-1])


@dataclass(frozen=True, slots=True)
class Preview:
    """The placement a create would get now (the scheduler's answer, in customer words)."""

    offering: Offering | None
    explain: str
    warm_reuse: bool = False
    region_class: str = ""


@dataclass(frozen=True, slots=True)
class Startup:
    """Measured provisioning→start seconds of this fleet's attempts on the chosen offering."""

    cold: tuple[Decimal, ...] = ()
    warm: tuple[Decimal, ...] = ()


@dataclass(frozen=True, slots=True)
class Notes:
    """Warnings and blocking reasons; other parts (credits) add theirs to `blocking`."""

    warnings: list[dict[str, str]] = field(default_factory=list)
    blocking: list[dict[str, str]] = field(default_factory=list)

    def warn(self, code: str, message: str) -> None:
        self.warnings.append({"code": code, "message": message})


def _usd(amount: Decimal) -> str:
    return units.format_money(cents(amount))


def _band(b: Band) -> dict[str, str]:
    return {"p50": _usd(b.p50), "p90": _usd(b.p90)}


def _quantile(values: Sequence[Decimal], q: Decimal) -> Decimal:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _durations(values: Sequence[Decimal]) -> dict[str, str] | None:
    if not values:
        return None
    return {"p50": units.format_duration(_quantile(values, Decimal("0.5"))),
            "p90": units.format_duration(_quantile(values, Decimal("0.9")))}


def _startup(startup: Startup) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, values in (("cold", startup.cold), ("warm", startup.warm)):
        band = _durations(values)
        out[name] = band if band is not None else {"p50": "", "p90": "", "message": "no measurements"}
    return out


def quote(book: PriceBook | None, shape: Shape, preview: Preview | None, startup: Startup, now: float,
          interruptible_allowed: bool = False) -> dict[str, Any]:
    """status.estimate for a Job of `shape` placed as `preview` under `book` (None: no price book)."""
    notes = Notes()
    zero = "0.00"
    estimate: dict[str, Any] = {"pricebookVersion": book.version if book is not None else "",
                                "validUntil": rfc3339(float(int(now + VALID_FOR_S)))}
    if preview is not None:
        offering = preview.offering
        estimate["placementPreview"] = {
            "offering": offering.id if offering else "", "regionClass": offering.region_class if offering
            else preview.region_class, "interruptible": bool(offering and offering.interruptible),
            "warmReuse": preview.warm_reuse, "explain": preview.explain}
    if shape.topology:
        estimate["topology"] = shape.topology
    estimate["startup"] = _startup(startup)
    offering = preview.offering if preview is not None else None
    if book is None or offering is None:
        if book is None:
            notes.warn("Unpriced", "no price book is active: this coordinator charges nothing and refuses nothing "
                                   "for money")
        else:
            notes.warn("Unpriced", "no offering of the price book fits now" + (
                f": {preview.explain}" if preview is not None and preview.explain else ""))
        estimate.update(costUSD={"p50": zero, "p90": zero}, overheadUSD={"p50": zero, "p90": zero},
                        rateUSDPerHour="", holdUSD=zero, concurrentHoldUSD=zero, gangHoldUSD=zero,
                        assemblyBoundUSD=zero, minimumChargeUSD=zero)
        if shape.duration_s is None:
            notes.warn("NoDuration", "no spec.expectedDuration and no comparable finished Job of this fleet")
        estimate.update(warnings=notes.warnings, blockingReasons=notes.blocking)
        return estimate
    estimate.update(_priced(shape, offering, startup, notes))
    if offering.interruptible:
        notes.warn("InterruptibleSelected", f"offering {offering.id} is interruptible: expect about "
                   f"{offering.interruptions_per_hour} reclaims per hour, each costing a restore; the p90 counts them")
    if not (preview is not None and preview.warm_reuse):
        cold = estimate["startup"]["cold"]
        measured = (f"this fleet's measured starts: {cold['p50']} at p50, {cold['p90']} at p90" if cold["p50"]
                    else "no measurements of its start time yet")
        notes.warn("ColdStart", f"no warm node of offering {offering.id} is kept for this project: the attempt "
                                f"boots a node first ({measured})")
    estimate.update(warnings=notes.warnings, blockingReasons=notes.blocking)
    return estimate


def _priced(shape: Shape, offering: Offering, startup: Startup, notes: Notes) -> dict[str, Any]:
    tariff = Tariff.of(offering)
    allocations = shape.completions * shape.members
    boot_s = _quantile(startup.cold, Decimal("0.5")) if startup.cold else Decimal(0)
    rate = offering.rate_usd_per_hour
    if shape.duration_s is None:
        notes.warn("NoDuration", "no spec.expectedDuration and no comparable finished Job of this fleet: costUSD is "
                                 f"per hour of running ({shape.slots * shape.members} node(s) at "
                                 f"${units.format_money(rate)}/h); set expectedDuration for a total")
        hour = cents(rate * shape.slots * shape.members)
        cost = Band(hour, hour)
        overhead = Band(Decimal(0), Decimal(0))
    else:
        run_s = shape.duration_s / offering.relative_speed
        spot = offering.interruptions_per_hour
        redo = redo_s(shape.continuity, run_s) if spot > 0 else Decimal(0)
        full = cost_band(tariff, run_s, startup_s=boot_s, interruptions_per_hour=spot,
                         restart_overhead_s=redo, factors=shape.factors)
        bare = cost_band(tariff, run_s, factors=shape.factors)
        p90 = full.p90
        if shape.factors:  # a record of runs shorter than said never narrows the p90 below the run said
            p90 = max(p90, cost_band(tariff, run_s, startup_s=boot_s, interruptions_per_hour=spot,
                                     restart_overhead_s=redo).p90)
        if shape.runs < THIN_RECORD:  # nor does a record too short to show its own p90 (or none)
            p90 = max(p90, cost_band(tariff, run_s * UNMEASURED_OVERRUN, startup_s=boot_s,
                                     interruptions_per_hour=spot, restart_overhead_s=redo).p90)
        cost = Band(full.p50 * allocations, p90 * allocations)
        overhead = Band(max(full.p50 - bare.p50, Decimal(0)) * allocations,
                        max(full.p90 - bare.p90, Decimal(0)) * allocations)
    hold = first_hold(tariff, Decimal(0), shape.max_cost_usd)
    gang = hold * shape.members if shape.members > 1 else Decimal(0)
    assembly = (cents(shape.members * rate * shape.startup_timeout_s * (shape.assembly_retries + 1) / 3600)
                if shape.members > 1 else Decimal(0))
    return {"costUSD": _band(cost), "overheadUSD": _band(overhead), "rateUSDPerHour": units.format_money(rate),
            "holdUSD": _usd(hold), "concurrentHoldUSD": _usd(hold * shape.members * shape.slots),
            "gangHoldUSD": _usd(gang), "assemblyBoundUSD": _usd(assembly),
            "minimumChargeUSD": _usd(tariff.minimum_charge_usd)}


# -- the ETag that names an estimate -------------------------------------------------------------------

def spec_hash(spec: Any) -> str:
    return hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()


ETAG_PURPOSE = "estimate-etag"
"""What the coordinator's ETag key is derived for (Vault.signer)."""
Signer = Callable[[bytes], str]
"""A keyed digest (the coordinator's: Vault.signer), so only the coordinator that quoted can mint an ETag."""


def _digest(sign: Signer, spec: Any, version: str, rate: str) -> str:
    return sign(f"{spec_hash(spec)}\n{version}\n{rate}".encode())[:32]


def etag(spec: Any, estimate: Mapping[str, Any], sign: Signer) -> str:
    """The dry run's ETag: the book's version and the rate it quoted, and a keyed digest of them with the
    spec, so a later create can tell whether it is this exact spec's estimate without storing anything,
    and no client can make one up for a rate it was never quoted."""
    version, rate = str(estimate.get("pricebookVersion") or ""), str(estimate.get("rateUSDPerHour") or "")
    return f'"{ETAG_PREFIX}.{version}.{rate}.{_digest(sign, spec, version, rate)}"'


@dataclass(frozen=True, slots=True)
class Binding:
    """What a create with If-Match is bound to."""

    etag: str
    pricebook_version: str
    rate_usd_per_hour: Decimal | None
    """None when the estimate was unpriced: nothing to bound."""

    @property
    def max_rate_usd_per_hour(self) -> Decimal | None:
        return None if self.rate_usd_per_hour is None else cents(self.rate_usd_per_hour * BOUND_MARGIN)

    def as_status(self) -> dict[str, str]:
        out = {"etag": self.etag, "pricebookVersion": self.pricebook_version}
        if self.rate_usd_per_hour is not None:
            out.update(rateUSDPerHour=units.format_money(self.rate_usd_per_hour),
                       maxRateUSDPerHour=units.format_money(self.max_rate_usd_per_hour or Decimal(0)))
        return out


def binding(if_match: str, spec: Any, sign: Signer) -> Binding | None:
    """The estimate `if_match` names when it is an estimate of exactly `spec`; None otherwise. The
    version may be older than the active book's: binding is what keeps a quote after validUntil."""
    text = if_match.strip()
    if text.startswith("W/"):
        text = text[2:]
    text = text.strip('"')
    parts = text.split(".")
    if len(parts) < 4 or parts[0] != ETAG_PREFIX:
        return None
    digest = parts[-1]
    # The version may itself hold dots; the rate (a decimal) holds one at most.
    for split in (len(parts) - 3, len(parts) - 2):
        version, rate = ".".join(parts[1:split]), ".".join(parts[split:-1])
        if hmac.compare_digest(_digest(sign, spec, version, rate), digest):
            try:
                parsed = units.parse_money(rate) if rate else None
            except ValueError:
                return None
            return Binding(f'"{text}"', version, parsed)
    return None


# -- a Sweep: its cells' estimates, summed -------------------------------------------------------------

def _sum(cells: Sequence[tuple[Mapping[str, Any], int]], key: str, part: str | None = None) -> str:
    total = Decimal(0)
    for estimate, weight in cells:
        value: Any = estimate.get(key) or {}
        amount = value.get(part) if part else value
        total += Decimal(str(amount or 0)) * weight
    return _usd(total)


def _most(cells: Sequence[tuple[Mapping[str, Any], int]], key: str) -> str:
    values = [Decimal(e[key]) for e, _ in cells if e.get(key)]
    return units.format_money(max(values)) if values else ""


def combine(cells: Sequence[tuple[Mapping[str, Any], int]], max_parallel: int) -> dict[str, Any]:
    """A Sweep's estimate from (a cell's estimate, how many cells price the same) pairs, the first cell
    first. Totals add up (the p90 of the sum is at most the sum of the p90s, so it errs high); the rate
    and single holds are the highest cell's (the If-Match bound holds every cell's attempts to it); the
    holds at once are those of the `max_parallel` costliest cells."""
    first = cells[0][0]
    holds = sorted((Decimal(e.get("concurrentHoldUSD") or 0) for e, w in cells for _ in range(w)), reverse=True)
    warnings: list[dict[str, str]] = []
    for e, _ in cells:
        warnings += [w for w in e.get("warnings") or [] if w not in warnings]
    out: dict[str, Any] = {
        "costUSD": {"p50": _sum(cells, "costUSD", "p50"), "p90": _sum(cells, "costUSD", "p90")},
        "overheadUSD": {"p50": _sum(cells, "overheadUSD", "p50"), "p90": _sum(cells, "overheadUSD", "p90")},
        "rateUSDPerHour": _most(cells, "rateUSDPerHour"), "holdUSD": _most(cells, "holdUSD") or "0.00",
        "concurrentHoldUSD": _usd(sum(holds[:max_parallel], Decimal(0))),
        "gangHoldUSD": _most(cells, "gangHoldUSD") or "0.00", "assemblyBoundUSD": _sum(cells, "assemblyBoundUSD"),
        "minimumChargeUSD": _most(cells, "minimumChargeUSD") or "0.00",
        "pricebookVersion": first.get("pricebookVersion", ""),
        "validUntil": min(e.get("validUntil", "") for e, _ in cells), "startup": first.get("startup", {}),
        "warnings": warnings, "blockingReasons": [b for e, _ in cells for b in e.get("blockingReasons") or []]}
    if "placementPreview" in first:
        out["placementPreview"] = {**first["placementPreview"],
                                   "explain": "first cell: " + first["placementPreview"].get("explain", "")}
    return out

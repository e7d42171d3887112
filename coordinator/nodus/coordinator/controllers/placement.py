"""The scheduler's executor: places waiting attempts, one pass at a time.

One task does every placement, so two attempts never take the same capacity: a pass reads the nodes
and the reservations of live placed attempts (derived from the Attempt objects, so they survive a
restart), decides every waiting attempt at once with `scheduler.place_all` (oldest first), and writes
each binding (spec.node, spec.gpuIndexes, phase Provisioning) with compare-and-swap. An attempt that
fits nowhere gets `status.placement.explain` (written only when it changes) and waits; a pass runs
again whenever something that could make room changes: a new waiting attempt, a placed attempt that
ended or went away, a node that registered, was cordoned or uncordoned, or whose readiness changed.

With a price book active, each pass reads it (from the cache) and places by the owning Job's `placement` policy and
profile (scheduler.py, money/policy.py). A binding then freezes the offering's customer rate on the
Attempt (spec.rateUSDPerHour, spec.interruptible) and writes the Job's `status.placement` (offering,
rate as a decimal string, region class, interruptible): the Job controller keeps status fields it
does not derive, so the copy stays until the next placement replaces it. Without a book neither is
written and placement is as before.

Warm holds (with a book) are derived each pass from the store like reservations: a node whose newest
attempt ended (not Lost) less than its Job's `scaledownWindow` ago, with nothing live on it, is kept
for that project (`warm_holds`). A pass that leaves a hold in place wakes again by the time it ends
(at least every RECHECK_SECONDS, since a test's clock may jump), so what waits for the node then places.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from decimal import Decimal
from typing import Any, Callable, Iterable, Sequence, TypeGuard

from ..api import units
from ..clock import Clock, parse, rfc3339
from ..money.pricebook import PriceBook
from ..scheduler import Amount, NodeView, Placement, Request, Reservation
from ..scheduler_classes import NodeClasses
from ..scheduler_gang import place_gang
from ..errors import NodusError
from ..money.estimate import Tariff
from ..money.ledger import Kind
from ..money.ledger import Request as LedgerRequest
from ..money.ledger_store import Ledger
from .attempt_machine import AttemptPhase, Placed, Refusal, phase_of, transition
from ..money.budget_store import BudgetGuard, Budgets
from ..money.holds import first_hold
from .billing import UNFUNDED_RECHECK_S
from .cache import ATTEMPTS, BOOKS, JOBS, LEASES, NODES, SWEEPS, Cache, attempt_key, job_key, owner_of
from .objects import Objects
from .placement_queue import RETRY_SECONDS, Headroom, PlacementQueue
from .reasons import AttemptReason
from .views import AttemptView

log = logging.getLogger("nodus.controllers.placement")


def _waiting(obj: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    if obj is None:
        return False
    spec = obj.get("spec") or {}
    return not spec.get("node") and not spec.get("stop") and not phase_of(obj).terminal


def _holding(obj: dict[str, Any] | None) -> bool:
    return obj is not None and bool((obj.get("spec") or {}).get("node")) and not phase_of(obj).terminal


RECHECK_SECONDS = 1.0
"""How long a pass waits at most while a warm hold is pending."""
DUE_BATCH_SECONDS = 0.5
"""How long the loop lets retry deadlines gather after the first: a queue parked over half a minute of
creates retries in a few dozen wake-ups, not one per attempt."""
BIND_RETRY_SECONDS = 1.0
"""When an attempt whose binding lost to a concurrent write is decided again."""
POLICY_FIELDS = ("interruptible", "maxRateUSDPerHour", "profile", "pool")
"""What placement reads of the Job's own spec.placement (an Attempt copies only the hard constraints)."""
BORN_PARKED_MAX = 4096
"""First decisions remembered at most (`explain_new`): past it they are forgotten, and their attempts decided by a pass."""


def _request(attempt: AttemptView, job: dict[str, Any] | None = None, now: float = 0.0) -> Request:
    spec = (job or {}).get("spec") or {}
    policy = {k: v for k, v in (spec.get("placement") or {}).items() if k in POLICY_FIELDS}
    deadline = parse(spec.get("completeByTime"))
    within = None if deadline is None else Decimal(str(round(deadline - now, 3)))
    request = Request.of(attempt.resources, attempt.image or None, {**policy, **attempt.constraints},
                         spec.get("expectedDuration"), within)
    # A Job created with If-Match is never placed above the bound of the estimate it was bound to.
    bound = (((job or {}).get("status") or {}).get("estimate") or {}).get("binding") or {}
    if bound.get("maxRateUSDPerHour"):
        request = replace(request, policy=replace(request.policy,
                                                  bound_usd_per_hour=Decimal(bound["maxRateUSDPerHour"])))
    return replace(request, project=attempt.project)


def warm_holds(attempts: Iterable[AttemptView], window: Callable[[str, str], float | None],
               now: float) -> list[Reservation]:
    """The nodes kept warm: per node, its newest ended attempt when nothing live is on the node, the
    attempt did not end Lost (the node went away), and it ended less than `window(project, job)` (its
    Job's scaledownWindow in seconds; None when unset) ago."""
    live: set[str] = set()
    newest: dict[str, AttemptView] = {}
    for a in attempts:
        if not a.node:
            continue
        if not a.phase.terminal:
            live.add(a.node)
        elif a.finished is not None and (a.node not in newest or a.finished > (newest[a.node].finished or 0.0)):
            newest[a.node] = a
    holds = []
    for node, a in sorted(newest.items()):
        span = window(a.project, a.job)
        if node in live or a.phase is AttemptPhase.LOST or not span or a.finished is None:
            continue
        if a.finished + span > now:
            holds.append(Reservation(node, Amount(), warm_for=a.project, until=a.finished + span))
    return holds


def job_placement(placement: Placement, node: NodeView | None) -> dict[str, Any] | None:
    """status.placement of a Job whose attempt was placed on a priced offering, in customer terms; None
    on a node the book does not price."""
    offering = placement.offering
    if offering is None:
        return None
    return {"offering": offering.id, "rateUSDPerHour": units.format_money(offering.rate_usd_per_hour),
            "regionClass": offering.region_class or (node.region if node is not None else ""),
            "interruptible": offering.interruptible, "warmReuse": placement.warm_reuse}


def placed_on(placement: Placement, node: NodeView | None) -> Any:
    """The mutation of the Job: its status.placement says where its newest attempt went (and goes
    away when that is a node the book does not price, rather than name an earlier offering)."""
    want = job_placement(placement, node)

    def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
        status = dict(obj.get("status") or {})
        if status.get("placement") == want:
            return None
        if want is None:
            status.pop("placement", None)
        else:
            status["placement"] = want
        obj["status"] = status
        return obj
    return mutate


def bind(placement: Placement, now: float, node: NodeView | None = None, pricebook_version: str = "") -> Any:
    def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
        if not _waiting(obj):
            return None
        status = transition(obj, Placed(now, placement.explain))
        if isinstance(status, Refusal):
            log.warning("attempt %s not bound: %s", obj["metadata"].get("name"), status)
            return None
        obj["spec"]["node"] = placement.node
        if node is not None:
            # The customer-facing words for where it runs (status.gang.members, status.placement).
            if node.offering:
                obj["spec"]["offering"] = node.offering
            if node.region:
                obj["spec"]["regionClass"] = node.region
        if placement.offering is not None:
            # The rate the attempt is charged at, frozen here: a later price book changes only later attempts.
            offering = placement.offering
            obj["spec"]["rateUSDPerHour"] = units.format_money(offering.rate_usd_per_hour)
            obj["spec"]["billingIncrementSeconds"] = offering.billing_increment_s
            obj["spec"]["minimumChargeSeconds"] = offering.minimum_charge_s
            if pricebook_version:
                obj["spec"]["pricebookVersion"] = pricebook_version  # the version its charges are explained by
            obj["spec"]["interruptible"] = offering.interruptible
        if placement.gpu_indexes:
            obj["spec"]["gpuIndexes"] = list(placement.gpu_indexes)
        obj["status"] = status
        obj["metadata"]["generation"] = int(obj["metadata"].get("generation") or 1) + 1
        return obj
    return mutate


def _explained(obj: dict[str, Any] | None) -> str | None:
    """The explain an attempt carries (None: none written)."""
    return (((obj or {}).get("status") or {}).get("placement") or {}).get("explain")


def explain(placement: Placement) -> Any:
    def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
        status = dict(obj.get("status") or {})
        if not _waiting(obj) or (status.get("placement") or {}).get("explain") == placement.explain:
            return None
        status.update(reason=AttemptReason.WAITING_FOR_CAPACITY, placement={"explain": placement.explain})
        obj["status"] = status
        return obj
    return mutate


class PlacementController:
    """Places waiting attempts; those that fit nowhere wait in `queue`'s unschedulable set until an
    event that can change their answer (placement_queue.py, docs/adr/0038)."""

    def __init__(self, registry: Any, objects: Objects, clock: Clock, retry_seconds: float = RETRY_SECONDS) -> None:
        self.registry, self.objects, self.clock = registry, objects, clock
        self.ledger = Ledger(objects.store)
        self.budgets = Budgets(objects.store, self.ledger)
        self.cache = registry.cache
        self.queue = PlacementQueue(retry_seconds)
        self.tried = 0
        """How many attempt decisions the passes made (what the queue saves shows here)."""
        self._nodes: set[str] = set()
        """Nodes whose capacity may have grown since the last pass: their fitting parked attempts wake."""
        self._dirty = asyncio.Event()
        self._release: float | None = None
        """When the earliest warm hold of the last pass ends (None: no hold pending)."""
        self._born_parked: dict[str, Request] = {}
        """Attempt key → its request, of the new attempts `explain_new` found fitting nowhere: parked as they
        arrive, not decided again by a pass (ADR 0128). Any event that can change where an attempt fits clears it
        (`_changed`), so what it holds was decided on the fleet as it still is."""
        self.cache.listen(ATTEMPTS, self._on_attempt)
        self.cache.listen(NODES, self._on_node)
        self.cache.listen(LEASES, self._on_lease)
        self.cache.listen(JOBS, self._on_job)
        self.cache.listen(SWEEPS, self._on_sweep)
        self.cache.listen(BOOKS, self._on_book)

    def explain_new(self, attempts: Sequence[dict[str, Any]], job: dict[str, Any]) -> str:
        """The explain a pass would write now on `attempts`, new single attempts of `job` not stored yet (one
        request: the Job's), when they fit no node: stamped on each, as the pass's `explain` writes it, and
        returned, so the Job controller creates them with it (ADR 0096). "" when they may fit, are gang
        members, or warm holds are kept (what a pass reads then is more than the fleet's rooms): the pass
        decides them as before. Reads only; the pass still decides each, and writes nothing on the same answer."""
        if not attempts or any((a.get("spec") or {}).get("gang") for a in attempts):
            return ""
        fleet = self.registry.fleet
        book: PriceBook | None = fleet.book()
        now = self.clock.now()
        if book is not None and fleet.warm(now):
            return ""
        request = _request(AttemptView.from_object(attempts[0]), job, now)
        p: Placement = fleet.rooms()[1].place(request, book=book)
        if p.node is not None:
            return ""
        stamp = explain(p)
        if len(self._born_parked) > BORN_PARKED_MAX:  # creates that never committed leave theirs
            self._born_parked.clear()
        for attempt in attempts:
            stamp(attempt)
            meta = attempt.get("metadata") or {}
            self._born_parked[attempt_key(str(meta.get("namespace")), str(meta.get("name")))] = request
        return p.explain

    # -- events: each wakes only what it can change --------------------------------------------------
    def _on_attempt(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if _waiting(new):
            born = self._born_parked.pop(key, None) if old is None else None
            if born is not None and key not in self.queue:
                # Its first decision found it fitting nowhere, on the fleet as it still is: what a pass would
                # decide now (ADR 0128). Parked with that request, as a pass parks it.
                project, job = owner_of(new)
                self.queue.park(key, project, job, born, time.monotonic())
                return
            if self.queue.add(key):
                self._dirty.set()
                if (new.get("spec") or {}).get("gang"):
                    project, job = owner_of(new)  # a gang is placed whole: its parked members try again with it
                    self.queue.wake_job(project, job, self._keys_of(project, job))
        else:
            self.queue.forget(key)
            if _holding(old) and not _holding(new):
                assert old is not None
                self._capacity_on(str(old["spec"]["node"]))  # capacity came free

    def _on_node(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None:
            self._capacity_on(key.removeprefix(NODES))

    def _on_lease(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        leases = self.registry.leases
        if leases.fresh(old) != leases.fresh(new) or (old or {}).get("gpuUnhealthy") != (new or {}).get("gpuUnhealthy"):
            self._capacity_on(key.removeprefix(LEASES))

    def _on_job(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if old is not None and new is not None and old.get("spec") != new.get("spec"):
            self._changed()
            project, name = key.removeprefix(JOBS).split("/", 1)
            if self.queue.wake_job(project, name, self._keys_of(project, name)):
                self._dirty.set()

    def _on_sweep(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if (old or {}).get("spec") != (new or {}).get("spec"):  # a shared cap moved
            self._changed()
            if self.queue.wake_project(key.removeprefix(SWEEPS).split("/", 1)[0]):
                self._dirty.set()

    def _on_book(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        self._changed()
        if self.queue.wake_all():
            self._dirty.set()

    def _capacity_on(self, node: str) -> None:
        self._changed()
        if self.queue.parked:
            self._nodes.add(node)
            self._dirty.set()

    def _changed(self) -> None:
        """Something that can change where an attempt fits happened: first decisions made before it are stale."""
        self._born_parked.clear()

    def _keys_of(self, project: str, job: str) -> list[str]:
        return [attempt_key(project, a["metadata"]["name"]) for a in self.cache.attempts_of(project, job)]

    # -- the loop -------------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.cache.synced.wait()
        for key, obj in self.cache.under(ATTEMPTS):
            self._on_attempt(key, None, obj)
        self._dirty.set()
        while True:
            waits = []
            if self._release is not None:
                waits.append(min(max(self._release - self.clock.now(), 0.0), RECHECK_SECONDS))
            if (due := self.queue.next_due()) is not None:  # those due within DUE_BATCH_SECONDS wake together
                waits.append(max(due - time.monotonic(), 0.0) + DUE_BATCH_SECONDS)
            try:
                async with asyncio.timeout(min(waits) if waits else None):
                    await self._dirty.wait()
            except TimeoutError:
                pass
            self._dirty.clear()
            mono = time.monotonic()
            if (due := self.queue.next_due()) is not None and due <= mono:
                self.queue.due(mono, Headroom.of(self.registry.views(), self.registry.fleet.held()))
            if self._release is not None and self.clock.now() >= self._release:
                self._release = None
                self._changed()
                self.queue.wake_all()  # a warm hold ended: what it kept from others may fit now
            try:
                await self.place()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the next change retries
                log.exception("placement pass failed")
                await asyncio.sleep(0.5)
                self._changed()
                self.queue.wake_all()
                self._dirty.set()

    async def place(self) -> None:
        """One pass over the active attempts (new ones, and parked ones an event woke), oldest first; a
        gang's members as one unit (all or nothing). What fits nowhere is parked again."""
        cache: Cache = self.cache
        if not self.queue.active and not self._nodes:
            return
        nodes = self.registry.views()
        book: PriceBook | None = self.registry.fleet.book()
        now = self.clock.now()
        warm: list[Reservation] = []
        if book is not None:
            warm = self.registry.fleet.warm(now)
            self._release = min((h.until for h in warm), default=None)
        if self._nodes:
            fleet = self.registry.fleet
            for node in nodes:
                if node.name in self._nodes:
                    kept = [w for w in warm if w.node == node.name]
                    if kept:  # a hold began: what waits for other projects is told the node is kept (rare)
                        self.queue.wake_all()
                    self.queue.wake_fitting(node, fleet.reservations_on(node.name) + kept, book)
            self._nodes.clear()
        waiting = [(key, a) for key in self.queue.take() if (a := cache.attempt_view(key)) is not None
                   and not a.placed and not a.stop_requested and not a.phase.terminal]
        if not waiting:
            return
        self.tried += len(waiting)
        waiting.sort(key=lambda kv: (kv[1].created or 0.0, kv[1].project, kv[1].job, kv[1].index, kv[1].number,
                                     kv[1].rank))
        decisions: dict[str, Placement] = {}
        requests: dict[str, Request] = {}
        singles: list[tuple[str, Request]] = []
        gangs: dict[tuple[str, str, int], list[tuple[str, AttemptView]]] = {}
        for key, a in waiting:
            if a.in_gang:
                gangs.setdefault((a.project, a.job_uid, a.epoch), []).append((key, a))
            else:
                requests[key] = _request(a, cache.job(a.project, a.job), now)
                singles.append((key, requests[key]))
        # What every node holds, one Reservation per node: only gangs and warm holds read it, since the fleet's
        # kept classes already reflect it (O(nodes) to make, once per pass otherwise: ADR 0116).
        held = self.registry.fleet.held() + warm if gangs or warm else []
        # Gangs first, in the order their oldest member waits: a gang needs several nodes at once and
        # would starve behind a stream of single attempts otherwise.
        mono = time.monotonic()
        for gang, members in gangs.items():
            size = members[0][1].gang_size or len(members)
            job = cache.job_view(gang[0], members[0][1].job)
            network = job.network if job is not None else "Regional"
            for key, a in members:
                requests[key] = _request(a, cache.job(a.project, a.job), now)
            if len(members) < size:
                for key, a in members:  # the rest of the epoch is being created: placed whole when it is
                    self.queue.park(key, a.project, a.job, requests[key], mono, gang)
                continue
            placed = place_gang([(key, requests[key]) for key, _ in members], nodes, held, network, book=book)
            decisions.update(placed)
            for key, _ in members:
                p = placed[key]
                if p.node is not None:
                    if p.warm_reuse:  # taken: from now on the member's own attempt holds it
                        held = [r for r in held if not (r.warm_for and r.node == p.node)]
                    held.append(Reservation(p.node, requests[key].amount, p.gpu_indexes))
        # Singles in order, each decided once per class of interchangeable nodes (ADR 0074), each taking
        # from its node's Room as it is placed.
        fleet = self.registry.fleet
        # Without warm holds or gangs placed just now, `held` is what the fleet's kept classes reflect.
        classes = fleet.rooms()[1].copy() if not warm and not gangs else NodeClasses.of(nodes, held, fleet.shapes)
        for key, request in singles:
            p = decisions[key] = classes.place(request, book=book)
            if p.node is not None:
                classes.take(p.node, request.amount, p.gpu_indexes, p.warm_reuse)
        unfunded: set[str] = set()
        if book is not None:
            priced = await self._hold(decisions, dict(waiting), now)
            unfunded = {k for k, p in priced.items() if p.node is None and decisions[k].node is not None}
            decisions = priced
        views = dict(waiting)
        for key, p in decisions.items():
            if p.node is None:
                a = views[key]
                self.queue.park(key, a.project, a.job, requests[key], mono,
                                (a.project, a.job_uid, a.epoch) if a.in_gang else None,
                                UNFUNDED_RECHECK_S if key in unfunded else None)
        by_name = classes.views  # the nodes this pass decided on, by name
        version = book.version if book is not None else ""
        writes = {key: self.objects.mutate(key, bind(p, now, by_name.get(p.node), version) if p.node else explain(p))
                  for key, p in decisions.items() if p.node or _explained(cache.get(key)) != p.explain}
        bound = dict(zip(writes, await asyncio.gather(*writes.values())))
        for key, p in decisions.items():
            if p.node and bound.get(key) is None and _waiting(cache.get(key)):
                a = views[key]  # lost its binding to a concurrent write: decided again shortly
                self.queue.park(key, a.project, a.job, requests[key], mono, None, BIND_RETRY_SECONDS)
        jobs = {job_key(views[key].project, views[key].job): (p, by_name.get(p.node or ""))
                for key, p in decisions.items() if bound.get(key) is not None and p.node and book is not None}
        await asyncio.gather(*(self.objects.mutate(k, placed_on(p, n)) for k, (p, n) in jobs.items()))

    async def _budget_guard(self, a: AttemptView) -> tuple[dict[str, str], BudgetGuard]:
        """The Job's labels and the Budgets its first hold must fit, checked inside the ledger's CAS
        (Ledger.post), so a hold another coordinator takes at once cannot overfill one."""
        labels = ((self.cache.job(a.project, a.job) or {}).get("metadata") or {}).get("labels") or {}
        guard = await self.budgets.guard(a.project, self.registry.fleet.labels_of(a.project), labels,
                                         f"the first hold of Job {a.job}")
        return dict(labels), guard

    async def _hold(self, decisions: dict[str, Placement], views: dict[str, AttemptView],
                    now: float) -> dict[str, Placement]:
        """Takes the first hold (billing.first_hold) of each binding on priced capacity before it is
        written, so nothing is spent that no hold covers. A binding its project cannot pay, or whose
        Job's cap leaves nothing, waits instead with the refusal as its explain (and the pass comes
        back, since a grant is no event it hears); a gang whose member cannot pay waits whole."""
        out = dict(decisions)
        refused: set[tuple[str, str, int]] = set()
        # The Budget check runs inside the ledger's CAS (money/budget_store.BudgetGuard); the holds of
        # one project are serialized here too, so a pass's holds do not retry each other's CAS.
        locks: dict[str, asyncio.Lock] = {}

        async def take(key: str, p: Placement) -> None:
            a = views[key]
            assert p.offering is not None
            cost = (((self.cache.job(a.project, a.job) or {}).get("status") or {}).get("cost") or {})
            amount = first_hold(Tariff.of(p.offering), Decimal(cost.get("totalUSD") or 0),
                                self.registry.fleet.cap_of(a.project, a.job))
            why = ""
            if amount <= 0:
                why = (f"{AttemptReason.MAX_COST_REACHED}: the Job's spec.maxCostUSD (or its Sweep's shared cap) leaves "
                       "nothing for a new start on this offering; raise it to resume")
            else:
                labels, guard = await self._budget_guard(a)
                request = LedgerRequest(f"{a.job_uid}/hold/{a.id or a.name}", Kind.HOLD, a.job_uid, amount,
                                        labels=labels)
                try:
                    async with locks.setdefault(a.project, asyncio.Lock()):
                        await self.ledger.post(a.project, request, rfc3339(now), guard)
                except NodusError as e:
                    if e.reason != "InsufficientCredits":
                        raise
                    why = f"{e.reason}: {e.message}; {e.effective_fix}"
            if why:
                out[key] = Placement(None, explain=why)
                if a.in_gang:
                    refused.add((a.project, a.job_uid, a.epoch))

        await asyncio.gather(*(take(k, p) for k, p in decisions.items() if p.node is not None and p.offering is not None))
        for key, p in list(out.items()):
            a = views[key]
            if a.in_gang and (a.project, a.job_uid, a.epoch) in refused and p.node is not None:
                out[key] = Placement(None, explain="another member of the gang waits for its hold")
        return out

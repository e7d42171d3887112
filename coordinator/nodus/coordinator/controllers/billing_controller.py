"""The money controller's executor: runs `billing.decide_billing` for a Job, posts what it says to the
ledger, and writes the Job's display copy of it (status.cost, the Funded condition, stopByTime).

Driven like the Job controller: a Job or one of its Attempts changed (the Job's key is queued), the
wake-up each decision returns (the next increment, an unfunded Job's recheck) and a periodic resync.
A Job with no attempt on priced capacity and no cost shown is never queued (the listeners keep the set
of Jobs with priced attempts), so a coordinator without a price book does no money work at all. Everything is in the store: the
attempts' frozen tariffs and times, and the ledger, whose keys make every posting happen once.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from decimal import Decimal
from typing import Any

import orjson

from ..clock import Clock, parse, rfc3339, seconds
from ..errors import NodusError
from ..money.budget_store import BudgetGuard, Budgets
from ..money.ledger import Kind, Request
from ..money.ledger_cost import Cost
from ..money.ledger_store import Ledger
from ..money.storage import Accrual, decide_storage
from .billing import Bill, BillingDecision, Stop, Verdict, decide_billing
from .billing import allocations as billing_allocations
from .cache import ATTEMPTS, JOBS, SWEEPS, job_key, owner_of
from .fleet import Fleet
from .job_controller import JobWriter
from .job_status import set_condition
from .sweep import cells_in
from .views import FUNDED, AttemptView, JobView
from .workqueue import WorkQueue, run_workers

log = logging.getLogger("nodus.controllers.billing")

RESYNC_SECONDS = 30.0
MAX_WAIT_S = 2.0
"""A wake-up waits at most this long: the injected clock can jump (tests), and an increment that
ended must be charged soon after."""


class BillingController:
    def __init__(self, fleet: Fleet, ledger: Ledger, jobs: JobWriter, clock: Clock, workers: int = 2) -> None:
        self.fleet, self.cache, self.ledger, self.writer, self.clock = fleet, fleet.cache, ledger, jobs, clock
        self.budgets = Budgets(ledger.store, ledger)
        self.queue: WorkQueue[str] = WorkQueue()
        self.workers = workers
        self._priced: set[str] = set()
        """Job keys with an attempt on priced capacity: only these (and Jobs showing a cost) have money work."""
        self._final: dict[str, tuple[int | None, dict[str, int]]] = {}
        """Job key → the revisions of the Job and its attempts at which its bill was final and the pass changed
        nothing: the resync skips it while they hold (ADR 0086)."""
        self.cache.listen(JOBS, self._on_job)
        self.cache.listen(ATTEMPTS, self._on_attempt)
        self.cache.listen(SWEEPS, self._on_sweep)  # its shared cap is each cell's: a raise lifts them

    def _on_sweep(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if (old or {}).get("spec") == (new or {}).get("spec") and \
                ((old or {}).get("status") or {}).get("cost") == ((new or {}).get("status") or {}).get("cost"):
            return  # neither the cap nor the cells' spend moved: what each cell may spend is as it was
        project, _, name = key[len(SWEEPS):].partition("/")
        for cell, _ in cells_in(self.cache.under(f"{JOBS}{project}/"), name):
            self.queue.add(cell)

    def _on_job(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if key in self._priced or "cost" in ((new or old or {}).get("status") or {}):
            self.queue.add(key)
        if new is None:
            self._priced.discard(key)
            self._final.pop(key, None)

    def _on_attempt(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new or old
        assert obj is not None
        if (obj.get("spec") or {}).get("rateUSDPerHour"):
            owner = job_key(*owner_of(obj))
            self._priced.add(owner)
            self.queue.add(owner)

    async def run(self) -> None:
        await self.cache.synced.wait()
        await run_workers(self.queue, self.reconcile, workers=self.workers, resync=self.resync,
                          resync_seconds=RESYNC_SECONDS, log=log, name="billing")

    def resync(self) -> None:
        for key, job in self.cache.under(JOBS):
            if (key in self._priced or "cost" in (job.get("status") or {})) and not self._still_final(key):
                self.queue.add(key)

    def _still_final(self, key: str) -> bool:
        return self._final.get(key) == self.cache.job_revisions(key)

    async def reconcile(self, key: str) -> None:
        project, _, name = key[len(JOBS):].partition("/")
        self._final.pop(key, None)
        revisions = self.cache.job_revisions(key)
        view = self.cache.job_view(project, name)
        attempts = self.cache.attempt_views_of(project, name)
        # Attempts of a Job deleted (or recreated under its name) are charged to the uid they ran for.
        uids = {a.job_uid for a in attempts if a.tariff is not None and a.placed}
        if view is not None and not view.deleting and (uids or "cost" in (self.cache.job(project, name) or {})
                                                       .get("status", {})):
            uids.add(view.uid)
        wake: list[float] = []
        settled = True
        for uid in sorted(uids):
            mine = [a for a in attempts if a.job_uid == uid]
            job = view if view is not None and view.uid == uid and not view.deleting else None
            decision, quiet = await self._settle(project, uid, job, mine)
            settled = settled and quiet
            if decision.wake_at is not None:
                wake.append(decision.wake_at)
        if wake:
            self.queue.add_after(key, min(min(wake) - self.clock.now(), MAX_WAIT_S))
        elif settled and uids:
            self._final[key] = revisions

    async def _settle(self, project: str, uid: str, job: JobView | None,
                      mine: list[AttemptView]) -> tuple[BillingDecision, bool]:
        """The uid's bill decided, posted and shown; and whether it is final and this pass changed nothing
        where only its Job's and attempts' revisions could change it again (no posting, no storage
        accruing, no stop for money, nothing written): then the resync may skip it (ADR 0086)."""
        now = self.clock.now()
        allocations = billing_allocations(mine, self._warm_until)
        stopped = Stop(job.money_stop[0]) if job is not None and job.money_stop is not None \
            and job.money_stop[0] in {s.value for s in Stop} else Stop.NONE
        cap = self.fleet.cap_of(project, job.name) if job is not None else None  # a Sweep's cells share one
        stored = self.cache.job(project, job.name) if job is not None else None
        labels = ((stored or {}).get("metadata") or {}).get("labels") or {} if stored is not None else None
        rooms = await self.budgets.rooms(project, self.fleet.labels_of(project), rfc3339(now)[:7], labels)
        bill = Bill(uid, project, cap, allocations,
                    any(not a.phase.terminal for a in mine), stopped, tuple(rooms))
        accounts = await self.ledger.accounts(project)
        postings = await self.ledger.postings(project, owner=uid)
        decision = decide_billing(bill, accounts, postings, now)
        verdict = decision.verdict
        quiet = decision.final and not decision.posts and stopped is Stop.NONE and verdict.stop is Stop.NONE
        if decision.posts:
            guard = await self.budgets.guard(project, self.fleet.labels_of(project), labels or {},
                                             f"the renewal of Job {job.name if job is not None else uid}'s hold") \
                if any(p.kind is Kind.RENEW for p in decision.posts) else None
            verdict = await self._post(project, decision.posts, verdict, now, guard, labels)
            accounts = await self.ledger.accounts(project)
            postings = await self.ledger.postings(project, owner=uid)
        if job is not None and stored is not None:
            storing, wake = await self._storage(project, uid, stored, postings, now)
            billed = ((stored.get("status") or {}).get("storage") or {}).get("billedBytes")
            quiet = quiet and not storing and wake is None and not billed  # a price book change could bill it
            if storing or wake is not None:
                accounts = await self.ledger.accounts(project)
                postings = await self.ledger.postings(project, owner=uid)
                wakes = [w for w in (decision.wake_at, wake) if w is not None]
                # storage still accrues: more charges will post, so the cost is not final
                decision = replace(decision, wake_at=min(wakes) if wakes else None,
                                   final=decision.final and wake is None)
        if job is not None:
            cost = Cost.of(accounts, uid, postings, limit=cap, rate=decision.rate, final=decision.final)
            quiet = await self._write(job, cost, verdict, decision, now) and quiet
        return decision, quiet

    async def _storage(self, project: str, uid: str, job: dict[str, Any], postings: list[Any],
                       now: float) -> tuple[bool, float | None]:
        """Accrues and charges the Job's storage above the free inclusion (money/storage.py): the
        accrual record first, then the charge. (whether it posted, when to look again)"""
        book = self.fleet.book()
        rate = book.storage_usd_per_gib_month if book is not None else Decimal(0)
        billed = int(((job.get("status") or {}).get("storage") or {}).get("billedBytes") or 0)
        key = f"_storage/{project}/{uid}"
        rec = await self.ledger.store.get(key)
        if rec is None and (billed <= 0 or rate <= 0):
            return False, None
        accrual = Accrual.from_json(orjson.loads(rec.value)) if rec is not None else None
        decision = decide_storage(uid, accrual, billed, rate, postings, now)
        if decision.write is not None:
            value = orjson.dumps(decision.write.to_json())
            try:
                if rec is None:
                    await self.ledger.store.create(key, value)
                else:
                    await self.ledger.store.update(key, value, rec.revision)
            except NodusError as e:
                if e.reason in ("Conflict", "AlreadyExists"):  # another pass moved it: decide again
                    return False, now
                raise
        if decision.post is None:
            return False, decision.wake_at
        try:
            await self.ledger.post(project, decision.post, rfc3339(now))
        except NodusError as e:
            if e.reason != "InsufficientCredits":
                raise
            log.info("project %s cannot pay storage %s: %s", project, decision.post.key, e.message)
        return True, decision.wake_at

    def _warm_until(self, a: AttemptView) -> float | None:
        """Until when the node of a finished attempt stays held for its project (placement's warm hold):
        its Job's scaledownWindow after the end, or until the node is next used, if sooner."""
        window = seconds(((self.cache.job(a.project, a.job) or {}).get("spec") or {}).get("scaledownWindow"))
        if not window or a.finished is None or not a.node:
            return None
        until = a.finished + window
        for other in self.cache.attempts_on(a.node):
            provisioned = parse((other.get("status") or {}).get("provisioningTime"))
            if provisioned is not None and provisioned >= a.finished and other["metadata"]["name"] != a.name:
                until = min(until, provisioned)
        return until

    async def _post(self, project: str, posts: tuple[Request, ...], verdict: Verdict, now: float,
                    guard: BudgetGuard | None, labels: dict[str, str] | None) -> Verdict:
        """Posts in order; a charge or renewal the credits (or, for a renewal, a Budget: `guard`, checked
        inside the ledger's CAS) cannot cover stops there and turns the Job unfunded (what was not posted
        is decided again on the next pass). A renewal is booked with the Job's labels."""
        for request in posts:
            if request.kind is Kind.RENEW and labels is not None:
                request = replace(request, labels=labels)
            try:
                await self.ledger.post(project, request, rfc3339(now), guard)
            except NodusError as e:
                if e.reason != "InsufficientCredits":
                    raise
                log.info("project %s cannot pay %s: %s", project, request.key, e.message)
                return Verdict(Stop.CREDITS, e.message, verdict.funded_until)
        return verdict

    async def _write(self, job: JobView, cost: Cost, verdict: Verdict, decision: BillingDecision, now: float) -> bool:
        """Writes the Job's display of its bill; whether the status shown was already this one."""
        stored = self.cache.job(job.project, job.name)
        if stored is None:
            return False
        status = dict(stored.get("status") or {})
        status["cost"] = cost.to_status(now)
        status["cost"].pop("fundedUntilTime", None)  # the decision's, which moves only with a posting
        if decision.covered:
            status["cost"]["bySegment"]["coveredByNodus"] = sorted(s.value for s in decision.covered)
        if verdict.funded_until is not None:
            status["cost"]["fundedUntilTime"] = rfc3339(verdict.funded_until)
        if verdict.stop is Stop.CREDITS:
            if verdict.funded_until is not None:  # once nothing bills the edge stays where it was
                status["stopByTime"] = rfc3339(verdict.funded_until)
        else:
            status.pop("stopByTime", None)
        conditions = [dict(c) for c in status.get("conditions") or []]
        funded = "False" if verdict.stop is not Stop.NONE else "True"
        reason = verdict.stop.value or "Funded"
        message = verdict.message or ("holds cover the Job's capacity" if cost.rate else "")
        current = next((c for c in conditions if c.get("type") == FUNDED), None)
        if current is None or (current.get("status"), current.get("reason")) != (funded, reason):
            conditions = set_condition(conditions, FUNDED, funded, reason, message, now, job.generation)
            status["conditions"] = [{**c, "observedGeneration": c.get("observedGeneration", job.generation)}
                                    for c in conditions]
        if status == stored.get("status"):
            return True
        try:
            written = await self.writer.write_job_status(job.project, stored, status)
        except NodusError as e:
            if e.reason in ("Conflict", "NotFound"):
                self.queue.add_after(job_key(job.project, job.name), 0.05)
                return False
            raise
        self.cache.apply(job_key(job.project, job.name), written, int(written["metadata"]["resourceVersion"]))
        return False

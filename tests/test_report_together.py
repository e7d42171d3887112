"""An agent's report written with its Job's decision in one commit (ADR 0127, controllers/job_reports.py): the
attempt's new phase, the Job's status (Running; an index counted) and the next index's attempt at consecutive
revisions, the reconcile after it writing nothing more; where the Job's reconcile is queued or the group is
refused, the plain write, and the controller decides as before. Through the daemons: test_jobs_e2e and
test_agent_e2e run every report this way."""
from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from typing import Any, Awaitable, Callable

import orjson

from job_harness import PROJECT, JobHarness
from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.controllers.attempts import AttemptPhase, Report, fold_report
from nodus.coordinator.controllers.cache import attempt_key, job_key
from nodus.coordinator.controllers.job_reports import ReportWriter
from nodus.coordinator.controllers.placement import bind
from nodus.coordinator.scheduler import Placement
from nodus.coordinator.status_write import status_document


def _run(tmp_path: Path, body: Callable[[JobHarness, ReportWriter], Awaitable[None]]) -> None:
    async def main() -> None:
        h = await JobHarness.open(tmp_path)
        writer = ReportWriter(h.objects, h.store, partial(status_document, resolve("jobs")))
        writer.jobs = h.controller
        try:
            await body(h, writer)
        finally:
            await h.close()
    asyncio.run(main())


def _report(h: JobHarness, phase: AttemptPhase, **fields: Any) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    now = h.clock.now()

    def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
        status = fold_report(obj, Report(phase=phase, time=now, **fields), now)
        return None if status is None else {**obj, "status": status}
    return mutate


async def _placed(h: JobHarness, name: str) -> str:
    """The Job's (only) unplaced attempt, bound to n1, and the controller's reconcile of that done."""
    await h.drain()
    attempt = next(a for a in h.attempts(name) if not (h.cache.get(attempt_key(PROJECT, a)) or {})["spec"].get("node"))
    await h.mutate_attempt(attempt, bind(Placement("n1", explain="n1: the only fitting node"), h.clock.now()))
    await h.drain()
    return attempt


async def _history(h: JobHarness, since: int) -> list[tuple[int, str, dict[str, Any]]]:
    watch = h.store.watch("", since)
    out = []
    while h.store.revision > (out[-1][0] if out else since):
        event = await anext(watch)
        out.append((event.revision, event.key, orjson.loads(event.value)))
    await watch.aclose()
    return out


def test_a_report_its_jobs_status_and_the_next_attempt_are_one_commit(tmp_path: Path) -> None:
    async def body(h: JobHarness, writer: ReportWriter) -> None:
        await h.create_job("two", completions=2, command=["sleep", "1"])
        first = await _placed(h, "two")
        before = h.store.revision
        await writer.mutate(attempt_key(PROJECT, first), _report(h, AttemptPhase.RUNNING, start_time=h.clock.now()))
        running = await _history(h, before)
        assert [(rev - before, key) for rev, key, _ in running] == [
            (1, attempt_key(PROJECT, first)), (2, job_key(PROJECT, "two"))], "the report and the Job: one commit"
        assert running[1][2]["status"]["phase"] == "Running" and writer.together == 1
        assert h.job("two")["status"]["phase"] == "Running"  # the cache has both, as written
        written = h.store.revision
        assert job_key(PROJECT, "two") in await h.drain()  # the writes' own events decide it again ...
        assert h.store.revision == written, "... and that finds nothing more to write"

        h.clock.advance(1)
        await writer.mutate(attempt_key(PROJECT, first), _report(h, AttemptPhase.SUCCEEDED, exit_code=0,
                                                                  finish_time=h.clock.now()))
        ended = await _history(h, written)
        assert [(rev - written, key) for rev, key, _ in ended] == [
            (1, attempt_key(PROJECT, first)), (2, job_key(PROJECT, "two")), (3, attempt_key(PROJECT, "two-1-1"))]
        assert ended[1][2]["status"]["succeeded"] == 1 and ended[2][2]["spec"]["index"] == 1
        assert writer.together == 2
        written = h.store.revision
        await h.drain()
        assert h.store.revision == written
    _run(tmp_path, body)


def test_a_report_whose_job_is_queued_or_changed_is_written_alone(tmp_path: Path) -> None:
    async def body(h: JobHarness, writer: ReportWriter) -> None:
        await h.create_job("busy", command=["sleep", "1"])
        attempt = await _placed(h, "busy")
        h.controller.queue.add(job_key(PROJECT, "busy"))  # a reconcile of the Job is queued: the report waits for none
        before = h.store.revision
        await writer.mutate(attempt_key(PROJECT, attempt), _report(h, AttemptPhase.RUNNING, start_time=h.clock.now()))
        assert [key for _, key, _ in await _history(h, before)] == [attempt_key(PROJECT, attempt)]
        assert writer.together == 0
        await h.drain()
        assert h.job("busy")["status"]["phase"] == "Running"  # the controller's own decision, as before

        # Another writer changes the Job between the decision and its commit: the group is refused whole (a real
        # compare-and-swap conflict on the Job) and the report is written alone.
        await h.create_job("raced", command=["sleep", "1"])
        attempt = await _placed(h, "raced")
        write_together = h.store.write_together
        refused: list[str] = []

        async def raced(items: Any) -> Any:
            stored = await h.store.get(job_key(PROJECT, "raced"))
            assert stored is not None
            body = orjson.loads(stored.value)
            await h.store.update(job_key(PROJECT, "raced"), orjson.dumps({**body, "spec": {**body["spec"], "parallelism": 2}}),
                                 stored.revision)
            try:
                return await write_together(items)
            except Exception as e:
                refused.append(getattr(e, "reason", repr(e)))
                raise
        h.store.write_together = raced  # type: ignore[method-assign]
        before = h.store.revision
        await writer.mutate(attempt_key(PROJECT, attempt), _report(h, AttemptPhase.RUNNING, start_time=h.clock.now()))
        h.store.write_together = write_together  # type: ignore[method-assign]
        assert refused == ["Conflict"] and writer.together == 0
        assert [key for _, key, _ in await _history(h, before)] == [job_key(PROJECT, "raced"), attempt_key(PROJECT, attempt)]
        await h.caught_up()
        assert h.cache.get(attempt_key(PROJECT, attempt))["status"]["phase"] == "Running"
        await h.drain()
        assert h.job("raced")["status"]["phase"] == "Running"
    _run(tmp_path, body)

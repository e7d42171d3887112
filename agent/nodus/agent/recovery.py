"""The agent's half of recovery: restore before a replacement starts, checkpoint on request, suspend.

The coordinator decides when (periodic cadence, suspend, preemption) and numbers every checkpoint;
the agent takes it (`checkpointing.take`, on a thread), uploads the archive with BlobService.Put and
reports CheckpointCommit. The coordinator commits it, or refuses it when the attempt was superseded
(fencing is the coordinator's: the agent cannot know). A Suspend is a checkpoint, then a stop; when
the checkpoint fails after the first try and two retries, the attempt keeps running and the agent
reports `SuspendFailed` (an AttemptUpdate in phase Running), so the customer's work is never stopped
without its state.

Where archives go is the assignment's `checkpoint.store`: the embedded blob store (`blob://`, the
default) or a Job's S3 Connection (`s3://…/PROJECT/JOB/`, ADR 0014), under which each attempt writes
`INDEX/ATTEMPT/`. An S3 store's credentials are kept in memory only (stores.py), never in the attempt's files.

`Checkpoints` is this half for one agent: it owns the stores, the checkpoint in flight per attempt
and each attempt's latest commit, and receives what it uses of the agent (the runtime, the blob
client, the stream, the attempt table, a stop and a wake-up, the clock) in its constructor.
"""
from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any, Coroutine, Protocol

from google.protobuf import duration_pb2

from nodus.checkpoint.integration import TrainerCheckpoint, find_trainer_checkpoint
from nodus.handshake import OPT_IN_ENV, RESUME_FROM_ENV
from nodus.v1 import agent_pb2, common_pb2

from . import layout as L
from .attempts import LOST_CAPACITY_REASONS as PREEMPTION_REASONS
from .attempts import Attempt, Stage, timestamp
from .blobs import BlobClient
from .cgroups import Cgroup
from .checkpointing import (CONTRACT_ROOT, HANDSHAKE_TIMEOUT, HF_HANDSHAKE_TIMEOUT, S3_URI, CheckpointFailed, fetch_s3,
                            listening, physical, restore, s3_store, take, upload_s3)
from .clock import Clock
from .reasons import Reason
from .runtime import ProcessRuntime
from .statefile import read_json
from .stores import CheckpointStores

__all__ = ["CheckpointFailed", "Checkpoints", "restore_before_start"]

log = logging.getLogger("nodus.agent.recovery")

SUSPEND_TRIES = 3
"""The first try and two retries (spec/job.md, status.suspendFailures)."""
RETRY_DELAY = 1.0
_TRAINER_INTEGRATIONS = frozenset({agent_pb2.CHECKPOINT_INTEGRATION_UNSPECIFIED, agent_pb2.CHECKPOINT_INTEGRATION_AUTO,
                                   agent_pb2.CHECKPOINT_INTEGRATION_HF_TRAINER})
"""Integration HFTrainer/Auto: the restored `checkpoint-N` to pass to `trainer.train(resume_from_checkpoint=…)`."""


class Stream(Protocol):
    """The coordinator's stream as recovery uses it (link.Link)."""

    connected: asyncio.Event

    def send(self, **message: Any) -> int | None: ...


class Attempts(Protocol):
    """The agent's attempts and the two things recovery asks of it."""

    def get(self, attempt_id: str) -> Attempt | None: ...

    def __contains__(self, attempt_id: object) -> bool: ...


class Host(Protocol):
    def stop(self, attempt_id: str, reason: str, grace: float, phase: str = L.CANCELLED) -> None: ...

    def poke(self) -> None:
        """Wakes the watch loop: the attempt's phase changed (Checkpointing, or Running again)."""
        ...


async def restore_before_start(blobs: BlobClient, user: Any, a: agent_pb2.Assignment, layout: L.AttemptLayout) -> int:
    """Restores `a.restore_from` into the attempt's state paths (files owned by `user`, a WorkloadUser or
    None); returns its seq (0: nothing to restore)."""
    ref = a.restore_from
    if not a.HasField("restore_from") or not ref.sha256:
        return 0
    # A Dcp checkpoint is every rank's part, merged into the same paths: the highest rank first, so
    # that rank 0's copy of a file both wrote wins (torch.distributed.checkpoint's metadata is rank 0's).
    parts = list(reversed(ref.parts)) or [ref]
    chown = (lambda p: _lchown(p, user.uid, user.gid)) if user is not None else None
    max_size = a.checkpoint.max_size_bytes or None
    for i, part in enumerate(parts):
        dest = layout.run / f"restore-{ref.seq}-{i}.tar.zst"
        try:
            if part.manifest.uri.startswith(S3_URI):
                if max_size and part.size_bytes > max_size:
                    raise CheckpointFailed(f"checkpoint {ref.seq} is {part.size_bytes} bytes, larger than maxSize "
                                           f"({max_size} bytes); nothing was fetched")
                await asyncio.to_thread(fetch_s3, part.manifest.uri, dict(part.manifest.credentials), part.sha256,
                                        dest)
            else:
                await blobs.get(a.attempt_id, part.sha256, dest)
            await asyncio.to_thread(restore, layout, dest, part.sha256, part.size_bytes or None, max_size, chown)
        except CheckpointFailed:
            raise
        except Exception as e:  # noqa: BLE001 - a missing blob, a digest mismatch on the wire …
            raise CheckpointFailed(f"checkpoint {ref.seq} could not be fetched: {type(e).__name__}: {e}") from None
        finally:
            dest.unlink(missing_ok=True)
    log.info("attempt %s: restored checkpoint %d (%d bytes)", a.attempt_id, ref.seq, ref.size_bytes)
    if a.checkpoint.integration in _TRAINER_INTEGRATIONS:
        found = await asyncio.to_thread(trainer_checkpoint, layout, list(a.checkpoint.paths))
        if found is not None and RESUME_FROM_ENV not in a.env:  # the customer's own value wins
            # The daemon writes the supervisor's spec (with a.env) only after this returns.
            a.env[RESUME_FROM_ENV] = found.path
            log.info("attempt %s: Trainer resumes from %s (step %d)", a.attempt_id, found.path, found.step)
    return int(ref.seq)


def trainer_checkpoint(layout: L.AttemptLayout, paths: list[str]) -> TrainerCheckpoint | None:
    """The newest complete `checkpoint-N` of transformers' Trainer under the attempt's state paths, as
    the program sees it (the process runtime runs the program on the physical paths)."""
    found = [c for p in paths or [CONTRACT_ROOT + "/state"]
             if (c := find_trainer_checkpoint(physical(layout, p))) is not None]
    return max(found, key=lambda c: c.step, default=None)


def _lchown(path: Path, uid: int, gid: int) -> None:
    os.lchown(path, uid, gid)


class Checkpoints:
    def __init__(self, runtime: ProcessRuntime, blobs: BlobClient, stream: Stream, attempts: Attempts, host: Host,
                 clock: Clock, stop_grace: float) -> None:
        self.runtime = runtime
        self.blobs = blobs
        self.stream = stream
        self.attempts = attempts
        self.host = host
        self.clock = clock
        self.stop_grace = stop_grace
        self.stores = CheckpointStores()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        """At most one checkpoint (or suspend) in flight per attempt."""
        self.last_commits: dict[str, agent_pb2.CheckpointCommit] = {}
        """Each attempt's latest CheckpointCommit, resent in Hello (a commit lost with a stream)."""

    def in_flight(self, attempt_id: str) -> bool:
        task = self.tasks.get(attempt_id)
        return task is not None and not task.done()

    def forget(self, attempt_id: str) -> None:
        self.last_commits.pop(attempt_id, None)

    def remember_store(self, a: agent_pb2.Assignment, layout: L.AttemptLayout) -> None:
        """Keeps an S3 checkpoint store of an assignment for the attempt's checkpoints (a repeated
        assignment refreshes the credentials); forgets those of attempts the agent no longer has."""
        self.stores.keep_only(self.attempts)
        if a.HasField("checkpoint"):
            self.stores.remember(a.attempt_id, a.index, a.checkpoint.store, layout)

    def _refresh(self, attempt_id: str, store: agent_pb2.Location) -> None:
        """A request's store, read by the coordinator when it sent it: its credentials replace the
        assignment's (rotated keys, or an agent restarted since the assignment)."""
        att = self.attempts.get(attempt_id)
        if att is not None and store.uri:
            self.stores.remember(attempt_id, att.index, store, self.runtime.layout(attempt_id))

    async def restore_before_start(self, a: agent_pb2.Assignment, layout: L.AttemptLayout) -> int:
        """restore_before_start, after keeping the assignment's checkpoint store for the attempt's own
        checkpoints (remember_store)."""
        self.remember_store(a, layout)
        return await restore_before_start(self.blobs, self.runtime.user_of(layout), a, layout)

    async def checkpoint(self, attempt_id: str, seq: int, reason: agent_pb2.CheckpointReason) -> agent_pb2.CheckpointCommit:
        """Takes, uploads and reports one checkpoint of a running attempt. Raises CheckpointFailed."""
        att = self.attempts.get(attempt_id)
        if att is None or att.stage != Stage.SUPERVISED or att.stop is not None:
            raise CheckpointFailed(f"attempt {attempt_id} does not run here")
        runtime = self.runtime
        layout = runtime.layout(attempt_id)
        status = runtime.read_status(layout) or {}
        if status.get("phase") != L.RUNNING:
            raise CheckpointFailed(f"attempt {attempt_id} is {status.get('phase', 'starting')}, not running")
        spec = read_json(layout.spec) or {}
        policy = spec.get("checkpoint") or {}
        store = self.stores.of(attempt_id, layout)  # before the program is held: a store it cannot reach fails first
        integration = policy.get("integration")
        # The handshake for a program that opted in (the variable: SIGUSR1 and the request file) or whose
        # helper polls the request file (nodus.hf: no signal); never with None. HFTrainer allows for a
        # Trainer save before the answer.
        signalled = (spec.get("env") or {}).get(OPT_IN_ENV) == "1"
        opted_in = integration != agent_pb2.CHECKPOINT_INTEGRATION_NONE and (signalled or listening(layout))
        hf = integration == agent_pb2.CHECKPOINT_INTEGRATION_HF_TRAINER
        cgroup = Cgroup.locate(runtime.cgroup_root, runtime.cgroup_name(layout)) if runtime.cgroups else None
        snap = await asyncio.to_thread(take, layout, seq, list(policy.get("paths") or []), opted_in=opted_in,
                                       main_pid=status.get("main_pid"), cgroup=cgroup,
                                       max_size=int(policy.get("max_size_bytes") or 0) or None,
                                       handshake_timeout=HF_HANDSHAKE_TIMEOUT if hf else HANDSHAKE_TIMEOUT,
                                       send_signal=signalled, clock=self.clock)
        epoch = int((att.gang or {}).get("epoch") or 0)
        dcp = policy.get("format") == agent_pb2.CHECKPOINT_FORMAT_DCP
        sha256, size = snap.sha256, snap.size
        try:
            if store is not None:
                target = await asyncio.to_thread(s3_store, store.uri, dict(store.credentials))
                uri, manifest = await asyncio.to_thread(upload_s3, target, snap, attempt=attempt_id, epoch=epoch,
                                                        format="Dcp" if dcp else "Snapshot")
                sha256, size = manifest.sha256, manifest.size  # a seq committed before (a lost commit) is kept
            else:
                await self.stream.connected.wait()
                ref = await self.blobs.put(attempt_id, snap.archive, snap.sha256, snap.size, "application/zstd")
                uri = getattr(ref, "uri", "") or f"blob://sha256/{snap.sha256}"
        except CheckpointFailed as e:
            raise CheckpointFailed(f"upload of checkpoint {seq} to {store.uri if store else 'the blob store'} "
                                   f"failed: {e}") from None
        except Exception as e:  # noqa: BLE001
            raise CheckpointFailed(f"upload of checkpoint {seq} failed: {type(e).__name__}: {e}") from None
        finally:
            snap.archive.unlink(missing_ok=True)
        pause = duration_pb2.Duration()
        pause.FromNanoseconds(int(snap.pause * 1e9))
        job = att.job or {}
        commit = agent_pb2.CheckpointCommit(
            attempt_id=attempt_id, job=common_pb2.JobRef(project=job.get("project", ""), name=job.get("name", ""),
                                                         uid=job.get("uid", "")),
            seq=seq, time=timestamp(self.clock.now()), size_bytes=size, sha256=sha256, paths=list(snap.paths),
            epoch=epoch, rank=int((att.gang or {}).get("rank") or 0),
            format=agent_pb2.CHECKPOINT_FORMAT_DCP if dcp else agent_pb2.CHECKPOINT_FORMAT_SNAPSHOT,
            pause=pause, uri=uri, reason=reason)
        self.last_commits[attempt_id] = commit
        for _ in range(600):  # no stream open (a reconnect): the commit waits for the next one
            if self.stream.send(checkpoint_commit=commit) is not None:
                break
            await asyncio.sleep(0.1)
        else:
            raise CheckpointFailed(f"checkpoint {seq} was uploaded but no stream to the coordinator opened to "
                                   "commit it")
        log.info("attempt %s: checkpoint %d committed to %s (%d bytes, %s pause %.3fs)", attempt_id, seq, uri, size,
                 snap.method, snap.pause)
        return commit


    def on_checkpoint_request(self, r: agent_pb2.CheckpointRequest) -> None:
        self._refresh(r.attempt_id, r.store)
        self._spawn(r.attempt_id, self._requested(r))


    def on_suspend(self, s: agent_pb2.Suspend) -> None:
        self._refresh(s.attempt_id, s.store)
        self._spawn(s.attempt_id, self._suspend(s), after_running=True)


    def _spawn(self, attempt_id: str, coro: Coroutine[object, object, None], after_running: bool = False) -> None:
        """One checkpoint at a time per attempt: a Periodic request meanwhile is dropped (the next one
        comes); a Suspend waits for the running checkpoint, then takes its own."""
        running = self.tasks.get(attempt_id)
        if running is not None and not running.done():
            if not after_running:
                coro.close()
                log.info("attempt %s: a checkpoint is already being taken; this request is dropped", attempt_id)
                return
            coro = _after(running, coro)
        task = asyncio.get_running_loop().create_task(coro, name=f"checkpoint:{attempt_id}")
        self.tasks[attempt_id] = task

        def done(t: asyncio.Task[None]) -> None:
            if self.tasks.get(attempt_id) is t:
                self.tasks.pop(attempt_id, None)
            self.host.poke()  # the attempt is Running again (or ended): report it
        task.add_done_callback(done)
        self.host.poke()  # report Checkpointing now


    async def _requested(self, r: agent_pb2.CheckpointRequest) -> None:
        timeout = None
        if r.HasField("deadline"):
            timeout = max(0.0, r.deadline.ToNanoseconds() / 1e9 - self.clock.now())
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that lands as the
            # checkpoint ends, and the agent's stop would then wait on it (nodus.coordinator.stopping).
            async with asyncio.timeout(timeout):
                await self.checkpoint(r.attempt_id, r.seq, r.reason)
        except (CheckpointFailed, TimeoutError) as e:
            log.warning("attempt %s: checkpoint %d failed: %s", r.attempt_id, r.seq, e or "deadline passed")


    async def _suspend(self, s: agent_pb2.Suspend) -> None:
        att = self.attempts.get(s.attempt_id)
        if att is None or not att.live:
            return
        deadline = s.checkpoint_deadline.ToNanoseconds() / 1e9 if s.HasField("checkpoint_deadline") else None
        status = self.runtime.read_status(self.runtime.layout(s.attempt_id)) or {}
        errors: list[str] = []
        preempted = s.reason in PREEMPTION_REASONS
        why = agent_pb2.CHECKPOINT_REASON_PREEMPTION if preempted else agent_pb2.CHECKPOINT_REASON_SUSPEND
        if att.stage == Stage.SUPERVISED and status.get("phase") == L.RUNNING:
            for n in range(SUSPEND_TRIES):
                left = None if deadline is None else deadline - self.clock.now()
                if left is not None and left <= 0:
                    errors = []  # past the deadline the suspend stops without the checkpoint
                    break
                try:
                    async with asyncio.timeout(left):
                        await self.checkpoint(s.attempt_id, s.seq, why)
                    errors = []
                    break
                except (CheckpointFailed, TimeoutError) as e:
                    errors.append(str(e) or "the checkpoint deadline passed")
                    log.warning("attempt %s: suspend checkpoint try %d failed: %s", s.attempt_id, n + 1, errors[-1])
                    if n + 1 < SUSPEND_TRIES:
                        await asyncio.sleep(RETRY_DELAY)
        if errors and preempted:
            log.warning("attempt %s: no checkpoint before the capacity goes: %s", s.attempt_id, errors[-1])
        elif errors:
            u = att.update(self.clock.now())
            u.reason = Reason.SUSPEND_FAILED
            u.message = f"{len(errors)} checkpoint tries failed; the attempt keeps running: {errors[-1]}"[:2048]
            self.stream.send(attempt_update=u)
            return
        self.host.stop(s.attempt_id, s.reason or Reason.SUSPENDED, float(s.grace_seconds or self.stop_grace),
                       L.CANCELLED)


async def _after(running: "asyncio.Task[None]", coro: Coroutine[object, object, None]) -> None:
    try:
        await asyncio.wait({running})
    except asyncio.CancelledError:
        coro.close()
        raise
    await coro

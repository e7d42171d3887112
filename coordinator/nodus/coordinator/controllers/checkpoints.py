"""Recovery decisions: which checkpoint is the latest, which commit is fenced off, when to checkpoint.

Pure: stored Attempt objects (the checkpoint service decides on them inside its compare-and-swap),
the Job's view and `now` in, values out; the agent stream (`agent_session.py`), the checkpoint service
and the Job controller perform them. The Job decision's side (status.checkpoint, status.storage, the
suspend stops) is `recovery.py`'s, on views. Committed checkpoints live on the Attempt that took them
(`status.checkpoints`, newest last), so the latest checkpoint of an index is derived from the set of
its Attempts, like every count of the Job controller, and survives a coordinator restart.

Fencing: a commit counts only when it comes from the index's current attempt (the highest number;
not terminal), at that attempt's gang epoch, for the Job it names, and with a seq above every
committed seq of the index. A partitioned old attempt (its node lost its lease; a replacement runs
elsewhere) is never current again, so its late commit can never become the latest.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from ..clock import duration, parse, rfc3339, seconds
from .attempts import AttemptPhase, phase_of
from .reasons import AttemptReason
from .views import DEFAULT_RETAIN as DEFAULT_RETAIN  # re-exported: the retention default
from .views import JobView

S3_URI = "s3://"

RETAINED_PER_ATTEMPT = 8
"""Committed checkpoints remembered on one Attempt (older ones are superseded by newer seqs)."""
MIN_INTERVAL = 60.0
MAX_INTERVAL = 6 * 3600.0
DEFAULT_MTBI = 24 * 3600.0
"""Mean time between interruptions assumed for an offering nothing has run on yet; it also weighs
as one interruption's worth of exposure in the measured figure (`offering_mtbi`)."""
MTBI_WINDOW = 30 * 86400.0
"""How far back an offering's attempts count towards its measured MTBI."""
DEFAULT_COST = 30.0
"""Seconds a checkpoint is assumed to cost the program before one was measured."""
SUSPEND_TRIES = 3
"""The first try and two retries; after them the Job keeps running with SuspendFailed."""
DEFAULT_MIN_PROGRESS = 120.0
"""recovery.minProgressDuration's default (2m)."""
RELEASE_GRACE = 600.0
"""How long a Job past ttlSecondsAfterFinished waits for the retention sweep to delete its checkpoints
before it is deleted anyway (a sweep runs every minute; past this one is not running, and waiting
longer would keep the Job forever)."""
FREE_STORAGE_BYTES = 10 * 2**30
"""status.storage's free inclusion per Job (billedBytes is the share above it), by default. The spec
names a free inclusion without a number, so it is the operator's to set (`nodus-coordinator
--free-storage`, which reaches the Job controller's constructor)."""


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("spec") or {}


def _status(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("status") or {}


def index_attempts(attempts: Iterable[dict[str, Any]], job_uid: str, index: int) -> list[dict[str, Any]]:
    return [a for a in attempts if _spec(a).get("jobUID") == job_uid and int(_spec(a).get("index", 0)) == index]


def committed(attempts: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every committed checkpoint of these attempts, by seq."""
    return by_seq(c for a in attempts for c in _status(a).get("checkpoints") or [])


def by_seq(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(records, key=lambda c: int(c.get("seq", 0)))


def complete(attempts: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The committed checkpoints of these stored attempts a restore can use (`complete_records`)."""
    return complete_records(committed(attempts))


def complete_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The committed checkpoints a restore can use, by seq: every Snapshot, and a gang's Dcp checkpoint
    only once every rank stored its part — then as one record whose `parts` are the ranks' records in
    rank order (rank 0's digest and uri on top, the sizes summed)."""
    out: list[dict[str, Any]] = []
    parts: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    for c in by_seq(records):
        if c.get("format") == "Dcp" and int(c.get("ranks") or 1) > 1:
            parts.setdefault((int(c.get("epoch") or 0), int(c.get("seq", 0))), {})[int(c.get("rank") or 0)] = c
        else:
            out.append(c)
    for by_rank in parts.values():
        ranks = int(next(iter(by_rank.values())).get("ranks") or 1)
        if len(by_rank) < ranks:
            continue  # a part is still missing: not a checkpoint yet
        ordered = [by_rank[r] for r in sorted(by_rank)]
        out.append({**ordered[0], "size": sum(int(p.get("size") or 0) for p in ordered),
                    "time": max(str(p.get("time") or "") for p in ordered), "parts": ordered})
    return sorted(out, key=lambda c: int(c.get("seq", 0)))


def latest(attempts: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    found = complete(attempts)
    return found[-1] if found else None


def current_attempt(attempts: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    return max(attempts, key=lambda a: int(_spec(a).get("number", 0)), default=None)


def next_seq(attempts: Iterable[dict[str, Any]]) -> int:
    """The seq to ask for: above every committed or already requested seq of the index."""
    attempts = list(attempts)
    asked = (int((_spec(a).get("stop") or {}).get("checkpointSeq") or 0) for a in attempts)
    return seq_after(committed(attempts), asked)


def seq_after(records: Iterable[dict[str, Any]], asked: Iterable[int]) -> int:
    """The seq above every one of these committed records and every seq already asked for."""
    return max(max((int(c.get("seq", 0)) for c in records), default=0), max(asked, default=0)) + 1


@dataclass(frozen=True, slots=True)
class Commit:
    """A CheckpointCommit as the coordinator records it."""

    attempt_id: str
    job_uid: str
    seq: int
    sha256: str
    size: int
    uri: str
    time: float
    epoch: int = 0
    paths: tuple[str, ...] = ()
    pause: float = 0.0
    reason: str = ""
    format: str = "Snapshot"
    rank: int = 0
    ranks: int = 1
    """The gang's size for a Dcp part: the checkpoint is complete when that many ranks stored theirs."""
    connection: str = ""
    """The Job's Connection an s3:// checkpoint went to: retention deletes it with its credentials."""

    def record(self) -> dict[str, Any]:
        out = {"seq": self.seq, "sha256": self.sha256, "size": self.size, "uri": self.uri,
               "time": rfc3339(self.time, precise=True), "epoch": self.epoch, "paths": list(self.paths),
               "pause": duration(self.pause), "reason": self.reason, "format": self.format}
        if self.ranks > 1:
            out.update(rank=self.rank, ranks=self.ranks)
        if self.connection:
            out["connection"] = self.connection
        return out


def refusal(attempt: dict[str, Any] | None, siblings: Sequence[dict[str, Any]], commit: Commit) -> str | None:
    """Why a commit must not count (None: commit it). `siblings` are the Attempts of the same Job."""
    if attempt is None:
        return f"attempt {commit.attempt_id} is unknown"
    spec = _spec(attempt)
    if commit.job_uid and spec.get("jobUID") != commit.job_uid:
        return f"attempt {commit.attempt_id} does not belong to Job uid {commit.job_uid}"
    same = index_attempts(siblings, spec.get("jobUID", ""), int(spec.get("index", 0)))
    current = current_attempt(same)
    # Gang members share their number (the epoch): only a higher number supersedes.
    if current is not None and int(_spec(current).get("number", 0)) > int(spec.get("number", 0)):
        return (f"attempt {commit.attempt_id} (number {spec.get('number')}) was superseded by attempt "
                f"{_spec(current).get('number')} of index {spec.get('index')}")
    if phase_of(attempt).terminal:
        return f"attempt {commit.attempt_id} already ended ({phase_of(attempt).value})"
    if int(spec.get("epoch") or 0) != commit.epoch:
        return f"epoch {commit.epoch} is not the attempt's gang epoch {int(spec.get('epoch') or 0)}"
    own = {int(c.get("seq", 0)): c for c in _status(attempt).get("checkpoints") or []}
    if commit.seq in own and own[commit.seq].get("sha256") == commit.sha256:
        return "already committed"  # a resend after a reconnect: nothing to do
    # Every rank of a Dcp gang commits its own part of the same seq; the seq must be new for this
    # attempt and above every checkpoint a restore could already use.
    done = committed(same)
    top = latest(same) if commit.ranks > 1 else (done[-1] if done else None)
    if top is not None and commit.seq <= int(top.get("seq", 0)):
        if commit.seq == int(top.get("seq", 0)) and top.get("sha256") == commit.sha256:
            return "already committed"
        return f"seq {commit.seq} is not above the latest committed seq {top.get('seq')}"
    if commit.seq in own or (own and commit.seq < max(own)):
        return f"seq {commit.seq} is not above this attempt's latest committed seq {max(own)}"
    return None


SUPERSEDED = "supersededCheckpoints"
"""Attempt status field: checkpoints pushed out by newer ones, whose archives the retention sweep
deletes (then drops them from the list). Durable, so a coordinator restart forgets none."""
_ARCHIVE_FIELDS = ("seq", "sha256", "size", "uri", "connection")


def with_commit(status: dict[str, Any], commit: Commit) -> dict[str, Any]:
    """The attempt's status with the commit recorded; the newest RETAINED_PER_ATTEMPT are kept and the
    older ones move to SUPERSEDED, for the retention sweep to delete."""
    records = [c for c in status.get("checkpoints") or [] if int(c.get("seq", 0)) != commit.seq] + [commit.record()]
    out = {**status, "checkpoints": records[-RETAINED_PER_ATTEMPT:]}
    pushed = [{k: c[k] for k in _ARCHIVE_FIELDS if k in c} for c in records[:-RETAINED_PER_ATTEMPT]]
    if pushed:
        out[SUPERSEDED] = [*(status.get(SUPERSEDED) or []), *pushed]
    return out


# -- cadence --------------------------------------------------------------------------------------

def young_daly(cost: float, mtbi: float) -> float:
    """The Young–Daly optimum √(2 × cost × MTBI), clamped to the allowed 1m–6h."""
    return min(MAX_INTERVAL, max(MIN_INTERVAL, math.sqrt(2.0 * max(cost, 0.0) * max(mtbi, 0.0))))


def measured_cost(records: Iterable[dict[str, Any]]) -> float | None:
    """Mean pause of the newest committed checkpoints (what a checkpoint costs the program)."""
    pauses = [seconds(c.get("pause")) for c in by_seq(records)[-5:]]
    known = [p for p in pauses if p is not None]
    return sum(known) / len(known) if known else None


def offering_mtbi(attempts: Iterable[dict[str, Any]], offering: str, now: float) -> float:
    """Mean time between interruptions of `offering`, measured on its attempts of the last MTBI_WINDOW:
    (running time + DEFAULT_MTBI) / (interruptions + 1). An interruption is an attempt Lost to its
    capacity (node lost, preempted, reclaimed), not to an operator's drain. The default counts as one
    interruption per DEFAULT_MTBI of prior exposure: a few quiet hours barely move it, while an
    offering that loses its nodes every hour soon reads about an hour."""
    running, interruptions = 0.0, 0
    since = now - MTBI_WINDOW
    for a in attempts:
        if _spec(a).get("offering") != offering:
            continue
        start = parse(_status(a).get("startTime"))
        if start is None:
            continue
        end = parse(_status(a).get("finishTime")) or now
        if end <= since:
            continue
        running += max(0.0, end - max(start, since))
        if phase_of(a) is AttemptPhase.LOST and _status(a).get("reason") != AttemptReason.DRAINED:
            interruptions += 1
    return (running + DEFAULT_MTBI) / (interruptions + 1)


def interval(spec: dict[str, Any], attempts: Iterable[dict[str, Any]], mtbi: float | None = None) -> float:
    """The cadence in use for a stored spec and attempts (`cadence`)."""
    return cadence(((spec.get("recovery") or {}).get("checkpoint") or {}).get("interval") or "auto",
                   committed(attempts), mtbi)


def cadence(text: str, records: Iterable[dict[str, Any]], mtbi: float | None = None) -> float:
    """The cadence in use: the spec's duration `text`, or Young–Daly for `auto` from what these committed
    checkpoints cost and `mtbi`."""
    if text and text != "auto":
        fixed = seconds(text)
        if fixed is not None:
            return min(MAX_INTERVAL, max(MIN_INTERVAL, fixed))
    cost = measured_cost(records)
    return young_daly(DEFAULT_COST if cost is None else cost, mtbi or DEFAULT_MTBI)


def periodic_due(spec: dict[str, Any], attempt: dict[str, Any], siblings: Sequence[dict[str, Any]], now: float,
                 mtbi: float | None = None) -> tuple[bool, float]:
    """Whether a Periodic checkpoint of a running attempt is due now, and when the next one is."""
    if continuity(spec) != "Checkpointed" or phase_of(attempt) is not AttemptPhase.RUNNING:
        return False, math.inf
    started = parse(_status(attempt).get("startTime"))
    if started is None:
        return False, math.inf
    spec_a = _spec(attempt)
    same = index_attempts(siblings, spec_a.get("jobUID", ""), int(spec_a.get("index", 0)))
    every = interval(spec, same, mtbi)
    mine = [parse(c.get("time")) for c in _status(attempt).get("checkpoints") or []]
    last = max([t for t in mine if t is not None] + [started])
    due_at = last + every
    return now >= due_at, due_at


def continuity(spec: dict[str, Any]) -> str:
    return (spec.get("recovery") or {}).get("continuity") or "Checkpointed"


# -- storage and retention -----------------------------------------------------------------------

def in_s3(record: dict[str, Any]) -> bool:
    """Whether a checkpoint lives in the customer's bucket (a Job's S3 Connection), not with Nodus."""
    return str(record.get("uri") or "").startswith(S3_URI)


def release_time(job: JobView, finished: float | None = None) -> float | None:
    """When a finished Job's checkpoints go: its completion (`finished`, else status.completionTime) plus
    retainAfterFinish, or its ttlSecondsAfterFinished when that comes first (deleting the Job deletes its
    checkpoints). None while the Job has not finished."""
    finished = job.finished if finished is None else finished
    if finished is None:
        return None
    return finished + (job.retain_after_finish if job.ttl is None else min(job.retain_after_finish, float(job.ttl)))


def released(job: JobView | None, job_uid: str, now: float) -> bool:
    """Whether checkpoints taken for Job uid `job_uid` are to be deleted: the Job is gone (deleted,
    being deleted, or recreated under a new uid) or its release time has passed."""
    if job is None or job.uid != job_uid or job.deleting:
        return True
    at = release_time(job)
    return at is not None and now >= at


@dataclass(frozen=True, slots=True)
class S3Archive:
    """A checkpoint in a customer's bucket to delete: `seq` of the attempt's store at `prefix`
    (s3://bucket/…/attempt/), or everything under the prefix when `seq` is 0."""

    project: str
    connection: str
    prefix: str
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Release:
    """One retention sweep's work: delete these blobs and S3 checkpoints, then drop the records."""

    attempts: tuple[tuple[str, str], ...]
    """(project, attempt name) of every Attempt whose checkpoint records all go (its Job is released)."""
    trimmed: tuple[tuple[str, str, int], ...]
    """(project, attempt name, seq) of Attempts whose superseded checkpoints up to that seq go: those
    seen now; one pushed out while the sweep deletes has a higher seq and waits for the next sweep."""
    digests: tuple[str, ...]
    """Blobs to delete: released or superseded archives that nothing kept still names."""
    s3: tuple[S3Archive, ...]
    """Checkpoints in customers' buckets to delete: a released attempt's whole prefix, a superseded seq."""
    bytes: int


def s3_archive(project: str, record: dict[str, Any], whole: bool = False) -> S3Archive:
    prefix, _, name = str(record["uri"]).rpartition("/")
    seq = 0 if whole else int(record.get("seq") or 0)
    return S3Archive(project, str(record.get("connection") or ""), prefix + "/", seq)


def unlisted(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without its superseded list: being listed there does not keep an archive."""
    status = _status(obj)
    return {**obj, "status": {k: v for k, v in status.items() if k != SUPERSEDED}} if SUPERSEDED in status else obj


def release(jobs: Callable[[str, str], dict[str, Any] | None], attempts: Iterable[dict[str, Any]],
            others: Iterable[dict[str, Any]], now: float) -> Release:
    """What to delete now. `jobs(project, name)` looks a Job up; `attempts` are every Attempt;
    `others` are the objects (Jobs) whose mention of a digest keeps its blob. Blobs are content
    addressed, so a doomed archive is kept while any other record or object still names it (two
    checkpoints, of one Job or two, can be the same bytes: an idle program's state). S3 archives have
    a key per seq and attempt, so they go as named."""
    going: list[tuple[str, str]] = []
    trimmed: list[tuple[str, str, int]] = []
    doomed: dict[str, int] = {}
    s3: set[S3Archive] = set()
    kept: list[dict[str, Any]] = []
    views: dict[tuple[str, str], JobView | None] = {}  # each Job decoded once per sweep
    for a in attempts:
        records = _status(a).get("checkpoints") or []
        superseded = _status(a).get(SUPERSEDED) or []
        if not records and not superseded:
            continue
        meta, spec = a["metadata"], _spec(a)
        project = meta.get("namespace", "")
        key = (project, spec.get("job", ""))
        if key not in views:
            found = jobs(*key)
            views[key] = JobView.from_object(found) if found is not None else None
        if released(views[key], spec.get("jobUID", ""), now):
            going.append((project, meta["name"]))
            gone = [*records, *superseded]
            s3.update(s3_archive(project, c, whole=True) for c in gone if in_s3(c))
        else:
            kept.append(unlisted(a))
            if superseded:
                trimmed.append((project, meta["name"], max(int(c.get("seq") or 0) for c in superseded)))
            gone = superseded
            s3.update(s3_archive(project, c) for c in gone if in_s3(c))
        for c in gone:
            if c.get("sha256") and not in_s3(c):
                doomed[str(c["sha256"])] = int(c.get("size") or 0)
    free = unnamed(set(doomed), [*kept, *others])
    return Release(tuple(sorted(going)), tuple(sorted(trimmed)), tuple(sorted(free)),
                   tuple(sorted(s3, key=lambda x: (x.prefix, x.seq))), sum(doomed[d] for d in free))


def unnamed(digests: set[str], objs: Iterable[dict[str, Any]]) -> set[str]:
    """The digests no object mentions anywhere (a record, an output, a source blob)."""
    left = set(digests)
    for obj in objs:
        if not left:
            break
        text = json.dumps(obj)
        left = {d for d in left if d not in text}
    return left


def without_checkpoints(status: dict[str, Any], keep: Iterable[S3Archive] = ()) -> dict[str, Any] | None:
    """The Attempt's status once its checkpoints were deleted, less those in `keep` (S3 deletions that
    failed for now: retried by the next sweep). None: nothing to change."""
    return _without(status, ("checkpoints", SUPERSEDED), keep)


def without_superseded(status: dict[str, Any], keep: Iterable[S3Archive] = (), *, upto: int) -> dict[str, Any] | None:
    """The Attempt's status once its superseded checkpoints up to seq `upto` were deleted, less those in
    `keep`."""
    return _without(status, (SUPERSEDED,), keep, upto)


def _without(status: dict[str, Any], fields: tuple[str, ...], keep: Iterable[S3Archive],
             upto: float = math.inf) -> dict[str, Any] | None:
    left = {(k.prefix, k.seq) for k in keep}

    def pending(c: dict[str, Any]) -> bool:
        """A record not handled by this sweep, or an S3 one whose seq or whole prefix is still to go."""
        if int(c.get("seq") or 0) > upto:
            return True
        if not in_s3(c):
            return False
        prefix = s3_archive("", c).prefix
        return bool({(prefix, 0), (prefix, int(c.get("seq") or 0))} & left)

    out = dict(status)
    for field in fields:
        stay = [c for c in out.pop(field, None) or [] if pending(c)]
        if stay:
            out[field] = stay
    return None if out == status else out

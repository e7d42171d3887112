"""The kinds registry: names, scope and table columns of every kind the API serves.

Discovery (`/apis/nodus.dev/v1`), the gateway's Table rendering, `kubectl get` and the CLI all read
this one table. It knows nothing about validation (that is `admission`), so it is cheap to import.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import NodusError

GROUP = "nodus.dev"


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the Table `kubectl get` prints."""

    name: str
    type: str
    """string | integer | date | number (metav1.TableColumnDefinition types)."""
    description: str
    priority: int
    """0 shows by default, 1 only with `-o wide`."""
    cell: Callable[[dict[str, Any]], Any]
    """The cell value for an object; a "date" column returns the RFC 3339 string (the gateway renders ages)."""


@dataclass(frozen=True, slots=True)
class KindInfo:
    kind: str
    plural: str
    singular: str
    group: str
    version: str
    short_names: tuple[str, ...]
    categories: tuple[str, ...]
    namespaced: bool
    has_status: bool
    columns: tuple[Column, ...]
    read_only: bool = False
    """Only the coordinator writes it (Attempt); every other caller may get, list and watch."""

    fields: tuple[str, ...] = ()
    """Fields a fieldSelector may name beyond those every kind has (selectors.FIELDS)."""

    @property
    def resource(self) -> str:
        """plural.group as Kubernetes names the resource in messages ("jobs.nodus.dev"); the bare plural
        for the core group ("events")."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def api_version(self) -> str:
        """group/version, or the bare version for the core group (an Event's "v1")."""
        return f"{self.group}/{self.version}" if self.group else self.version


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _col(name: str, dotted: str, description: str, *, type: str = "string", priority: int = 0) -> Column:
    return Column(name, type, description, priority, lambda obj: _get(obj, dotted))


def _age() -> Column:
    return _col("Age", "metadata.creationTimestamp", "Age is the time since the object was created.", type="date")


def _cost() -> Column:
    return _col("Cost", "status.cost.totalUSD", "Cost is what has been charged so far, in USD.")


def _phase() -> Column:
    return _col("Phase", "status.phase", "Phase is the lifecycle phase.")


def _completions(obj: dict[str, Any]) -> str:
    done = _get(obj, "status.succeeded") or 0
    return f"{done}/{_get(obj, 'spec.completions') or 1}"


def _sweep_cells(obj: dict[str, Any]) -> str:
    counts = _get(obj, "status.cellCounts")  # the summary every Sweep stores (a large one has no stored rows)
    if isinstance(counts, dict) and counts:
        return f"{int(counts.get('Succeeded') or 0)}/{sum(int(n or 0) for n in counts.values())}"
    cells = _get(obj, "status.cells")
    if isinstance(cells, list) and cells:
        done = sum(1 for c in cells if isinstance(c, dict) and c.get("phase") == "Succeeded")
        return f"{done}/{len(cells)}"
    return f"0/{sweep_cell_count(obj.get('spec') or {})}"


def _sweep_best(obj: dict[str, Any]) -> str:
    best = _get(obj, "status.best")
    if not isinstance(best, dict) or not best:
        return ""
    return ",".join(f"{word}:{best[key]}" for word, key in (("cost", "byCost"), ("speed", "byThroughput"))
                    if key in best)


def sweep_cell_count(spec: dict[str, Any]) -> int:
    """Cells of a Sweep: the product of the non-empty dimensions, times repetitions."""
    matrix = spec.get("matrix") or {}
    total = 1
    for dim in ("gpu", "regions"):
        values = matrix.get(dim)
        if isinstance(values, list) and values:
            total *= len(values)
    params = matrix.get("params")
    if isinstance(params, dict):
        for values in params.values():
            if isinstance(values, list) and values:
                total *= len(values)
    reps = spec.get("repetitions")
    return total * (reps if isinstance(reps, int) and not isinstance(reps, bool) and reps > 0 else 1)


def _training_progress(obj: dict[str, Any]) -> str:
    stage = _get(obj, "status.progress.stage") or ""
    step, total = _get(obj, "status.metrics.step"), _get(obj, "status.metrics.totalSteps")
    if step is not None and total:
        return f"{stage} {step}/{total}".strip()
    return stage


def _job_progress(obj: dict[str, Any]) -> str:
    """`train 120/1000`: what the program last reported through $NODUS_PROGRESS."""
    stage = _get(obj, "status.progress.stage") or ""
    done, total = _get(obj, "status.progress.units.completed"), _get(obj, "status.progress.units.total")
    if done is not None:
        return f"{stage} {done}/{total}".strip() if total else f"{stage} {done}".strip()
    return stage


def _secret_keys(obj: dict[str, Any]) -> int:
    keys = _get(obj, "status.keys")
    if isinstance(keys, list):
        return len(keys)
    return len(obj.get("data") or {})


def _latest_revision(obj: dict[str, Any]) -> dict[str, Any]:
    latest = _get(obj, "status.latestRevision")
    for r in _get(obj, "status.revisions") or []:
        if isinstance(r, dict) and r.get("revision") == latest:
            return r
    return {}


def _volume_size(obj: dict[str, Any]) -> str | None:
    size = _latest_revision(obj).get("size")
    if not isinstance(size, int):
        return None
    if size < 1024:
        return f"{size}B"
    value = size / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}TiB"


KINDS: tuple[KindInfo, ...] = (
    KindInfo("Job", "jobs", "job", GROUP, "v1", ("nj",), ("nodus", "all"), True, True, (
        _phase(),
        Column("Completions", "string", "Completions is succeeded/completions.", 0, _completions),
        Column("Progress", "string", "Progress is the stage and units the program last reported.", 0,
               _job_progress),
        _cost(),
        _age(),
        _col("Reason", "status.reason", "Reason says why the Job failed, stopped or is suspended.", priority=1),
        _col("Active", "status.active", "Active is the number of indexes with a live attempt.", type="integer",
             priority=1),
        _col("Failed", "status.failed", "Failed is the number of customer failures.", type="integer", priority=1),
    )),
    KindInfo("Sweep", "sweeps", "sweep", GROUP, "v1", ("sw",), ("nodus", "all"), True, True, (
        _phase(),
        Column("Cells", "string", "Cells is succeeded/total cells.", 0, _sweep_cells),
        _cost(),
        Column("Best", "string", "Best names the cheapest and the fastest succeeded cells.", 0, _sweep_best),
        _age(),
    )),
    KindInfo("TrainingJob", "trainingjobs", "trainingjob", GROUP, "v1beta1", ("tj",), ("nodus", "all"), True, True, (
        _col("Runtime", "spec.runtime", "Runtime is the TrainingRuntime the run compiles against."),
        _phase(),
        Column("Progress", "string", "Progress is the stage and step/totalSteps.", 0, _training_progress),
        _cost(),
        _age(),
    )),
    KindInfo("TrainingRuntime", "trainingruntimes", "trainingruntime", GROUP, "v1beta1", ("tr",), ("nodus",), True,
             True, (
                 _col("Task", "spec.task", "Task is what the runtime trains."),
                 _col("Launcher", "spec.launcher", "Launcher is the gang launcher."),
                 _phase(),
                 _age(),
             )),
    # A Secret's status (versions and their keys) is bookkeeping the resource service owns, kept in step
    # with the encrypted values; no status subresource, so no one can rewrite it apart from them.
    KindInfo("Secret", "secrets", "secret", GROUP, "v1", (), ("nodus",), True, False, (
        _col("Version", "status.version", "Version is the latest version.", type="integer"),
        Column("Keys", "integer", "Keys is the number of keys in the latest version.", 0, _secret_keys),
        _age(),
    )),
    KindInfo("Volume", "volumes", "volume", GROUP, "v1", ("vol",), ("nodus",), True, True, (
        _col("Revision", "status.latestRevision", "Revision is the latest Ready revision.", type="integer"),
        Column("Size", "string", "Size is the latest revision's archive size.", 0, _volume_size),
        Column("Files", "integer", "Files is the number of files in the latest revision.", 0,
               lambda obj: _latest_revision(obj).get("files")),
        _age(),
    )),
    # A Connection holds no credential (it names a Secret), so it is as readable as a Volume.
    KindInfo("Connection", "connections", "connection", GROUP, "v1", ("conn",), ("nodus",), True, False, (
        _col("Type", "spec.type", "Type is the kind of system (S3)."),
        _col("Bucket", "spec.s3.bucket", "Bucket is the S3 bucket."),
        _col("Endpoint", "spec.s3.endpoint", "Endpoint is the S3-compatible server; empty for AWS S3."),
        _age(),
        _col("Secret", "spec.s3.secret", "Secret holds the keys.", priority=1),
        _col("Prefix", "spec.s3.prefix", "Prefix is where under the bucket Nodus writes.", priority=1),
    )),
    # A ServiceAccount holds no credential: its tokens are minted per attempt and never stored in it.
    KindInfo("ServiceAccount", "serviceaccounts", "serviceaccount", GROUP, "v1", ("sa",), ("nodus",), True, False, (
        _col("Role", "spec.role", "Role is what the account's tokens may do in the project (viewer or editor)."),
        _age(),
        _col("Description", "spec.description", "Description says what the account is for.", priority=1),
    )),
    KindInfo("Attempt", "attempts", "attempt", GROUP, "v1", ("att",), ("nodus",), True, True, (
        _col("Job", "spec.job", "Job is the owning Job."),
        _col("Index", "spec.index", "Index is the Job index.", type="integer"),
        _col("Number", "spec.number", "Number is the attempt number within the index.", type="integer"),
        _col("Node", "spec.node", "Node is where the attempt runs."),
        _col("Phase", "status.phase", "Phase is the attempt's phase."),
        _col("Exit", "status.exitCode", "Exit is the main command's exit code.", type="integer"),
        _col("Reason", "status.reason", "Reason is why the attempt is in its phase."),
        _age(),
        _col("ID", "spec.id", "ID is the attempt id on the agent stream (NODUS_ATTEMPT).", priority=1),
    ), read_only=True),
)


def resolve(name: str) -> KindInfo:
    """A kind by plural, singular, Kind or short name (any case), or `plural.nodus.dev` / `plural.v1.nodus.dev`."""
    wanted = name.strip().lower()
    for suffix in (f".{GROUP}",):
        if wanted.endswith(suffix):
            wanted = wanted[: -len(suffix)]
            for info in KINDS:
                if wanted.endswith(f".{info.version}"):
                    base = wanted[: -len(info.version) - 1]
                    if base in (info.plural, info.singular, info.kind.lower()):
                        return info
            break
    for info in KINDS:
        if wanted in (info.plural, info.singular, info.kind.lower()) or wanted in info.short_names:
            return info
    known = ", ".join(info.plural for info in KINDS)
    raise NodusError("NotFound", f'the server doesn\'t have a resource type "{name}"',
                     fix=f"use one of: {known}")


def by_group_version(gv: str) -> tuple[KindInfo, ...]:
    return tuple(info for info in KINDS if info.api_version == gv)


def by_kind(kind: str) -> KindInfo:
    for info in KINDS:
        if info.kind == kind:
            return info
    raise NodusError("NotFound", f'no kind "{kind}" in {GROUP}', fix="use one of: "
                     + ", ".join(info.kind for info in KINDS))

"""Whether a Job's `output` inputs let it create attempts now (pure; docs/adr/0037).

A Job never starts without its inputs. An `output` input names another Job's committed output; until
that producer commits it the consumer creates no attempt and waits (Pending, reason WaitingForInput,
a message naming the producer and the output). A producer that cannot commit it any more (it does
not exist, it ended without it, it declares no such output or index) fails the consumer with
InputFailed. The producers' state comes in on the JobView (`JobView.producers`), read by the Job
controller from its cache, so `decide` stays a function of what it is given.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .views import AttemptView, JobView, OutputInput, Producer


@dataclass(frozen=True, slots=True)
class InputGate:
    """Why the Job may not create attempts now."""

    failed: bool
    """True: an input can never be provided (the Job fails with InputFailed); False: it waits."""
    message: str
    """Names the input, the producing Job and the output."""


def _output(ref: OutputInput) -> str:
    return f"output {ref.output}" + (f" (index {ref.index})" if ref.index else "")


def _never(ref: OutputInput, producer: Producer | None, job: str) -> str:
    """Why `ref` can never be provided, or "" while it still can be."""
    field = f"spec.inputs[{ref.position}].output"
    if ref.job == job:
        return f"input {ref.name}: {field}.job names this Job itself, which cannot consume its own output"
    if producer is None:
        return (f"input {ref.name}: Job {ref.job} ({field}.job) does not exist in this project: create the "
                f"producing Job first, then this one")
    if ref.output not in producer.declared:
        return (f"input {ref.name}: Job {ref.job} declares no output {ref.output} ({field}.name; its outputs: "
                f"{', '.join(sorted(producer.declared))})")
    if ref.index >= producer.completions:
        return (f"input {ref.name}: Job {ref.job} has no index {ref.index} ({field}.index; its completions: "
                f"{producer.completions})")
    if producer.phase.terminal:
        return f"input {ref.name}: Job {ref.job} ended {producer.phase.value} without committing its {_output(ref)}"
    return ""


def input_status(job: JobView, attempts: Sequence[AttemptView]) -> list[dict[str, Any]]:
    """status.inputs: admission's pins (volumeRevision, sha256) and, for every input an attempt has
    materialized, the sha256 its agent computed at the end of the stream (the newest attempt's, should
    a URL have served other bytes to another attempt)."""
    out = {str(p.get("name")): dict(p) for p in job.pinned_inputs}
    for a in sorted((a for a in attempts if a.inputs), key=lambda a: (a.created or 0, a.number)):  # ADR 0109
        for verified in a.inputs:
            name = str(verified.get("name"))
            out.setdefault(name, {"name": name})["sha256"] = verified.get("sha256")
    return list(out.values())


def input_gate(job: JobView) -> InputGate | None:
    """None when every `output` input is committed; else the first that can never be (failed), or
    every one still awaited (waiting)."""
    waiting: list[str] = []
    for ref in job.output_inputs:
        producer = job.producers.get(ref.job)
        if producer is not None and (ref.output, ref.index) in producer.committed:
            continue
        never = _never(ref, producer, job.name)
        if never:
            return InputGate(True, never)
        waiting.append(f"input {ref.name}: waiting for {_output(ref)} of Job {ref.job}")
    return InputGate(False, "; ".join(waiting)) if waiting else None

"""A Job's `output` inputs in its pure decision (controllers/job_inputs.py, job.decide) and in its
Assignment (controllers/assignment.py): nothing starts before the producer commits the output, a
producer that never will fails the consumer naming both, and no input kind is skipped (docs/adr/0037).
"""
from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from nodus.coordinator.controllers import assignment
from nodus.coordinator.controllers.attempts import AttemptPhase
from nodus.coordinator.controllers.gang import CreateMember, decide_gang
from nodus.coordinator.controllers.job import CreateAttempt, JobPhase, JobView, decide
from nodus.coordinator.controllers.job_controller import new_attempt
from nodus.coordinator.controllers.job_inputs import input_gate
from nodus.coordinator.controllers.views import AttemptView, Producer
from nodus.coordinator.errors import NodusError
from test_gang_decisions import T0, gang_job
from test_job_controller import World

SHA = "ab" * 32


def consumer(*inputs: dict[str, Any], completions: int = 1) -> World:
    """A Job "eval" with these inputs (one output input of Job train's model by default)."""
    w = World(inputs=list(inputs) or [{"name": "data", "output": {"job": "train", "name": "model"}}],
              completions=completions, parallelism=completions)
    assert w.job is not None
    w.job["metadata"]["name"] = "eval"
    return w


def producer(phase: JobPhase = JobPhase.RUNNING, committed: tuple[tuple[str, int], ...] = (),
             outputs: tuple[str, ...] = ("model",), completions: int = 1) -> Producer:
    return Producer(phase=phase, committed=frozenset(committed), declared=frozenset(outputs) | {"outputs"},
                    completions=completions)


def step(w: World, producers: dict[str, Producer]) -> Any:
    """One decision with the producers as the Job controller would read them; applies what it says."""
    assert w.job is not None
    now = w.clock.now()
    view = replace(JobView.from_object(w.job), producers=producers)
    d = decide(view, [AttemptView.from_object(a) for a in w.attempts.values()], now, prev=w.status)
    for action in d.actions:
        assert isinstance(action, CreateAttempt), action
        a = new_attempt(w.job, action.index, action.number, now)
        w.attempts[a["metadata"]["name"]] = a
    if d.status is not None:
        w.job["status"] = d.status
    return d


def test_the_view_reads_output_inputs_and_declared_outputs() -> None:
    w = World(inputs=[{"name": "u", "url": {"url": "https://x.dev/f"}},
                      {"name": "data", "output": {"job": "train", "name": "model", "index": 2}}],
              outputs=[{"name": "report", "path": "/nodus/outputs/r.txt"}])
    assert w.job is not None
    view = JobView.from_object(w.job)
    [ref] = view.output_inputs
    assert (ref.name, ref.position, ref.job, ref.output, ref.index) == ("data", 1, "train", "model", 2)
    assert view.declared_outputs == ("report",)
    assert Producer.of(view).declared == {"report", "outputs"}


def test_a_consumer_waits_pending_until_the_producer_commits_then_runs() -> None:
    w = consumer()
    d = step(w, {"train": producer()})
    assert d.actions == () and not w.attempts, "nothing is created before the output is committed"
    st = w.status
    assert st["phase"] == "Pending" and st["reason"] == "WaitingForInput"
    assert st["message"] == "input data: waiting for output model of Job train"
    assert "starts by itself" in st["fix"], "the user is told the wait ends by itself"
    ready = w.condition("InputsReady")
    assert ready is not None and (ready["status"], ready["reason"], ready["message"]) == \
        ("False", "WaitingForInput", st["message"])
    again = step(w, {"train": producer()})
    assert again.status is None and again.actions == (), "deciding again changes nothing"

    d = step(w, {"train": producer(committed=(("model", 0),))})
    assert d.actions == (CreateAttempt(0, 1),)
    assert w.status["phase"] == "Queued" and "reason" not in w.status
    assert w.condition("InputsReady")["status"] == "True"  # type: ignore[index]


@pytest.mark.parametrize("producers, fragment", [
    ({}, "input data: Job train (spec.inputs[0].output.job) does not exist in this project"),
    ({"train": producer(JobPhase.SUCCEEDED)}, "input data: Job train ended Succeeded without committing its output model"),
    ({"train": producer(JobPhase.FAILED)}, "input data: Job train ended Failed without committing its output model"),
    ({"train": producer(outputs=("weights",))}, "input data: Job train declares no output model"),
])
def test_a_producer_that_never_will_commit_fails_the_consumer(producers: dict[str, Producer], fragment: str) -> None:
    w = consumer()
    d = step(w, producers)
    assert d.actions == () and not w.attempts
    st = w.status
    assert st["phase"] == "Failed" and st["reason"] == "InputFailed", st
    assert fragment in st["message"]
    assert "spec.inputs[i]" in st["fix"], "the fix says which field to correct"
    assert w.condition("Failed")["reason"] == "InputFailed"  # type: ignore[index]


def test_an_index_the_producer_lacks_and_a_job_naming_itself_fail() -> None:
    w = consumer({"name": "d", "output": {"job": "train", "name": "model", "index": 3}})
    step(w, {"train": producer(completions=2)})
    assert w.status["reason"] == "InputFailed" and "has no index 3" in w.status["message"]
    me = consumer({"name": "d", "output": {"job": "train", "name": "model"}})
    assert me.job is not None
    me.job["metadata"]["name"] = "train"
    step(me, {"train": producer()})
    assert me.status["reason"] == "InputFailed" and "cannot consume its own output" in me.status["message"]


def test_a_committed_output_of_a_failed_producer_is_still_an_input() -> None:
    w = consumer()
    step(w, {"train": producer(JobPhase.FAILED, committed=(("model", 0),))})
    assert len(w.attempts) == 1 and w.status["phase"] == "Queued"


def test_running_attempts_are_not_failed_when_the_producer_goes_later() -> None:
    w = consumer()
    step(w, {"train": producer(committed=(("model", 0),))})
    [name] = w.attempts
    w.run(name)
    d = step(w, {})  # the producer was deleted (its TTL) while the consumer runs
    assert d.actions == () and w.status["phase"] == "Running", "what already has its data keeps running"


def test_every_waiting_input_is_named() -> None:
    w = consumer({"name": "a", "output": {"job": "train", "name": "model"}},
                 {"name": "b", "output": {"job": "prep", "name": "outputs", "index": 1}})
    step(w, {"train": producer(), "prep": producer(completions=2)})
    assert w.status["message"] == ("input a: waiting for output model of Job train; "
                                   "input b: waiting for output outputs (index 1) of Job prep")
    gate = input_gate(replace(JobView.from_object(w.job or {}), producers={"train": producer(), "prep": producer()}))
    assert gate is not None and gate.failed, "prep has one index only: index 1 can never come"


def test_a_gang_waits_for_its_input_before_any_rank_exists() -> None:
    job = gang_job()
    job["spec"]["inputs"] = [{"name": "data", "output": {"job": "train", "name": "model"}}]
    view = JobView.from_object(job)
    waiting = decide_gang(replace(view, producers={"train": producer()}), [], T0, prev={})
    assert waiting.actions == () and waiting.status is not None
    assert (waiting.status["phase"], waiting.status["reason"]) == ("Pending", "WaitingForInput")
    ready = decide_gang(replace(view, producers={"train": producer(committed=(("model", 0),))}), [], T0, prev={})
    assert sorted(a.rank for a in ready.actions if isinstance(a, CreateMember)) == [0, 1]
    gone = decide_gang(view, [], T0, prev={})
    assert gone.status is not None and gone.status["reason"] == "InputFailed" and gone.actions == ()


# -- status.inputs: the digests the agents verified ------------------------------------------------------

def test_status_inputs_keeps_the_pins_and_adds_what_the_newest_attempt_verified() -> None:
    w = consumer({"name": "v", "volume": {"name": "ds"}}, {"name": "u", "url": {"url": "https://x.dev/f"}})
    assert w.job is not None
    w.job["status"] = {"inputs": [{"name": "v", "volumeRevision": 3, "sha256": SHA}]}
    step(w, {})
    [first] = w.attempts
    w.run(first)
    w.report(first, AttemptPhase.RUNNING, inputs=(("u", "11" * 32), ("v", SHA)), inputs_ready_time=w.clock.now())
    w.report(first, AttemptPhase.RUNNING, inputs=(("u", "99" * 32), ("v", SHA)))  # a resent report changes nothing
    assert w.attempts[first]["status"]["inputs"] == [{"name": "u", "sha256": "11" * 32}, {"name": "v", "sha256": SHA}]
    step(w, {})
    assert w.status["inputs"] == [{"name": "v", "volumeRevision": 3, "sha256": SHA}, {"name": "u", "sha256": "11" * 32}]
    w.report(first, AttemptPhase.FAILED, exit_code=1)
    step(w, {})
    second = next(n for n in w.attempts if n != first)
    w.run(second)
    w.report(second, AttemptPhase.RUNNING, inputs=(("u", "22" * 32), ("v", SHA)))
    d = step(w, {})
    assert w.status["inputs"][1] == {"name": "u", "sha256": "22" * 32}, "the newest attempt's digest"
    assert step(w, {}).status is None and d.status is not None, "deciding again changes nothing"


# -- the assignment: every kind becomes an agent Input or a reason ---------------------------------------

def _build(spec: dict[str, Any], status: dict[str, Any] | None = None, outputs: dict[str, Any] | None = None) -> Any:
    job = {"metadata": {"name": "eval", "namespace": "default", "uid": "u-1"},
           "spec": {"command": ["true"], **spec}, "status": status or {}}
    attempt = new_attempt(job, 0, 1, 0.0)

    def outputs_of(producer: str, output: str, index: int) -> dict[str, Any] | None:
        return (outputs or {}).get(f"{producer}/{output}/{index}")
    return asyncio.run(assignment.build(attempt, job, None, outputs_of))  # type: ignore[arg-type]


def test_a_committed_output_becomes_an_input_and_an_uncommitted_one_a_reason() -> None:
    spec = {"inputs": [{"name": "data", "output": {"job": "train", "name": "model"}}]}
    built = _build(spec, outputs={"train/model/0": {"sha256": SHA, "size": 7}})
    [inp] = built.inputs
    assert (inp.name, inp.source.uri, inp.sha256, inp.size_bytes) == ("data", f"blob://sha256/{SHA}", SHA, 7)
    with pytest.raises(NodusError) as e:
        _build(spec)
    assert "input data: output model of Job train (spec.inputs[0].output) is not committed" in e.value.message


@pytest.mark.parametrize("item, fragment", [
    ({"name": "w", "fromWorkspace": {"name": "home"}}, "input w: fromWorkspace inputs (spec.inputs[0].fromWorkspace)"),
    ({"name": "s", "fromStage": {"stage": "a", "output": "b"}}, "input s: fromStage inputs"),
    ({"name": "v", "volume": {"name": "ds"}}, "input v: Volume ds (spec.inputs[0].volume) has no pinned revision"),
    ({"name": "b", "bucket": {"uri": "s3://x/y"}}, "input b: spec.inputs[0].bucket names no S3 Connection"),
])
def test_an_input_that_cannot_be_provided_fails_the_assignment(item: dict[str, Any], fragment: str) -> None:
    with pytest.raises(NodusError) as e:
        _build({"inputs": [item]})
    assert fragment in e.value.message

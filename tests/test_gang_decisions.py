"""The gang's pure parts: decide_gang (epochs, restarts, assembly timeouts, what counts against what),
plan (the step each member is told) and place_gang (all or nothing, one member per node, locality)."""
from __future__ import annotations

from typing import Any

import pytest

from nodus.coordinator.clock import rfc3339
from nodus.coordinator.controllers.attempts import fold_gang
from nodus.coordinator.controllers.gang import (ASSEMBLE, MESH, START, CreateMember, GangConfig, decide_gang, topology,
                                                weakest)
from nodus.coordinator.controllers.gang_plan import plan
from nodus.coordinator.controllers.job import AttemptView, Decision, JobView, StopAttempt
from nodus.coordinator.scheduler import Amount, NodeView, Request
from nodus.coordinator.scheduler_gang import place_gang

T0 = 1_767_225_600.0


def gang_job(**distributed: Any) -> dict[str, Any]:
    dist = {"nodes": 2, "startupTimeout": "5m", "maxAssemblyRetries": 1, **distributed}
    return {"metadata": {"name": "g", "namespace": "default", "uid": "u1", "generation": 1,
                         "creationTimestamp": rfc3339(T0)},
            "spec": {"command": ["train"], "distributed": dist, "backoffLimit": 0,
                     "recovery": {"maxAttempts": 1, "minProgressDuration": "1h"}},
            "status": {}}


def member(epoch: int, rank: int, phase: str = "Running", node: str | None = None, reason: str = "",
           started: float | None = T0 + 10, done: str = "Start", stop: str = "", finished: float | None = None,
           size: int = 2) -> AttemptView:
    return AttemptView.from_object(member_obj(epoch, rank, phase, node, reason, started, done, stop, finished, size))


def member_obj(epoch: int, rank: int, phase: str = "Running", node: str | None = None, reason: str = "",
               started: float | None = T0 + 10, done: str = "Start", stop: str = "", finished: float | None = None,
               size: int = 2) -> dict[str, Any]:
    """The stored Attempt of one gang member."""
    node = f"n{rank}" if node is None else node
    status: dict[str, Any] = {"phase": phase, "reason": reason}
    if node:
        status["provisioningTime"] = rfc3339(T0 + 1)
    if started is not None and phase in ("Running", "Succeeded", "Failed", "Lost", "Cancelled", "Stopping"):
        status["startTime"] = rfc3339(started)
    if phase in ("Succeeded", "Failed", "Lost", "Cancelled"):
        status["finishTime"] = rfc3339(finished or T0 + 20)
    if done:
        status["gang"] = {"epoch": epoch, "done": done, "address": f"10.0.0.{rank + 1}", "port": 29500 + rank,
                          "probePort": 30500 + rank}
    spec: dict[str, Any] = {"id": f"att-{epoch}-{rank}", "job": "g", "jobUID": "u1", "index": 0, "number": epoch,
                            "epoch": epoch, "gang": {"epoch": epoch, "rank": rank, "size": size}, "node": node}
    if stop:
        spec["stop"] = {"reason": stop}
    obj = {"metadata": {"name": f"g-{epoch}-r{rank}", "namespace": "default", "creationTimestamp": rfc3339(T0)},
           "spec": spec, "status": status}
    return obj


def decide(job: dict[str, Any], attempts: list[AttemptView], now: float) -> Decision:
    """decide_gang as the Job controller calls it: the Job's view and its stored status."""
    return decide_gang(JobView.from_object(job), attempts, now, prev=job.get("status") or {})


def creates(decision: Any) -> list[CreateMember]:
    return [a for a in decision.actions if isinstance(a, CreateMember)]


def stops(decision: Any) -> dict[str, str]:
    return {a.name: a.reason for a in decision.actions if isinstance(a, StopAttempt)}


def test_a_new_gang_creates_every_rank_of_epoch_1_and_resolves_its_topology() -> None:
    job = gang_job(nodes=None, totalGPUs=8, gpusPerNode=4)
    del job["spec"]["distributed"]["nodes"]
    d = decide(job, [], T0)
    assert [(c.epoch, c.rank, c.size) for c in creates(d)] == [(1, 0, 2), (1, 1, 2)]
    assert d.status["topology"] == {"nodes": 2, "gpusPerNode": 4, "totalGPUs": 8, "network": "Regional",
                                    "resolvedFrom": "TotalGPUs"}
    assert d.status["phase"] == "Queued" and d.status["gang"]["phase"] == "Queued"


def test_a_running_gang_reports_every_member_and_its_rendezvous() -> None:
    d = decide(gang_job(), [member(1, 0), member(1, 1)], T0 + 30)
    gang = d.status["gang"]
    assert d.status["phase"] == "Running" and gang["phase"] == "Running"
    assert (gang["epoch"], gang["size"], gang["ready"], gang["started"], gang["restarts"]) == (1, 2, 2, 2, 0)
    assert gang["rendezvous"] == "10.0.0.1:29500"
    assert [m["rank"] for m in gang["members"]] == [0, 1] and not creates(d) and not stops(d)


@pytest.mark.parametrize("done, phase", [("", "Assembling"), ("Assemble", "Meshing"), ("Mesh", "Starting")])
def test_the_gang_phase_follows_the_slowest_member(done: str, phase: str) -> None:
    members = [member(1, 0, "Initializing", started=None, done="Mesh"),
               member(1, 1, "Initializing", started=None, done=done)]
    d = decide(gang_job(), members, T0 + 30)
    assert d.status["gang"]["phase"] == phase and d.status["phase"] == "Provisioning"


def test_losing_one_member_stops_the_others_then_restarts_the_gang_on_the_same_topology() -> None:
    lost = member(1, 1, "Lost", reason="NodeLost")
    d = decide(gang_job(), [member(1, 0), lost], T0 + 30)
    assert stops(d) == {"g-1-r0": "GangRestart"} and not creates(d)
    assert d.status["gang"]["phase"] == "Recovering"
    # rank 0 stopped (it ends Cancelled): epoch 2, rank 0 keeps its node, rank 1 avoids the lost one
    d = decide(gang_job(), [member(1, 0, "Cancelled", reason="GangRestart", stop="GangRestart"), lost], T0 + 40)
    assert [(c.epoch, c.rank, c.prefer_node, c.avoid_nodes) for c in creates(d)] == [(2, 0, "n0", ()),
                                                                                      (2, 1, "", ("n1",))]
    assert d.status["phase"] != "Failed"
    later = decide(gang_job(), [member(1, 0, "Cancelled", reason="GangRestart"), lost,
                                     member(2, 0, "Pending", node="", started=None, done=""),
                                     member(2, 1, "Pending", node="", started=None, done="")], T0 + 41)
    assert later.status["gang"]["epoch"] == 2 and later.status["gang"]["restarts"] == 1


def test_a_peer_failing_after_a_lost_node_counts_as_the_loss_not_a_customer_failure() -> None:
    members = [member(1, 0, "Failed", reason="Error", finished=T0 + 21), member(1, 1, "Lost", reason="NodeLost",
                                                                               finished=T0 + 25)]
    d = decide(gang_job(), members, T0 + 30)  # backoffLimit 0, maxAttempts 1: one loss is allowed
    assert d.status["phase"] != "Failed" and creates(d)


def test_losses_beyond_max_attempts_fail_the_job() -> None:
    epochs = [member(e, r, "Lost" if r == 1 else "Cancelled", reason="NodeLost" if r == 1 else "GangRestart")
              for e in (1, 2) for r in (0, 1)]
    d = decide(gang_job(), epochs, T0 + 30)
    assert d.status["phase"] == "Failed" and d.status["reason"] == "MaxAttemptsExceeded"
    assert "on node n1, NodeLost" in d.status["message"] and not creates(d)


def test_a_rank_that_fails_fails_the_gang_attempt_against_backoff_limit() -> None:
    members = [member(1, 0, "Cancelled", reason="GangRestart"), member(1, 1, "Failed", reason="Error")]
    d = decide(gang_job(), members, T0 + 30)
    assert d.status["phase"] == "Failed" and d.status["reason"] == "BackoffLimitExceeded"


def test_an_assembly_past_startup_timeout_is_stopped_then_re_placed_then_fails() -> None:
    stuck = [member(1, 0, "Initializing", started=None, done="Assemble"),
             member(1, 1, "Initializing", started=None, done="")]
    before = decide(gang_job(), stuck, T0 + 100)
    assert not stops(before) and before.wake_at == pytest.approx(T0 + 1 + 300)
    after = decide(gang_job(), stuck, T0 + 302)
    assert stops(after) == {"g-1-r0": "AssemblyTimeout", "g-1-r1": "AssemblyTimeout"}
    ended = [member(1, 0, "Cancelled", reason="AssemblyTimeout", started=None, done="Assemble"),
             member(1, 1, "Cancelled", reason="AssemblyTimeout", started=None, done="")]
    again = decide(gang_job(), ended, T0 + 303)
    assert [(c.epoch, c.rank, c.prefer_node, c.avoid_nodes) for c in creates(again)] == [(2, 0, "n0", ()),
                                                                                          (2, 1, "", ("n1",))]
    twice = ended + [member(2, 0, "Cancelled", reason="AssemblyTimeout", started=None, done="Assemble"),
                     member(2, 1, "Cancelled", reason="AssemblyTimeout", node="n2", started=None, done="")]
    d = decide(gang_job(), twice, T0 + 700)
    assert d.status["phase"] == "Failed" and d.status["reason"] == "GangAssemblyTimeout"
    assert "rank(s) 1 never became ready" in d.status["message"] and not creates(d)
    assert d.status["gang"]["phase"] == "Done"


def test_ray_workers_are_stopped_when_the_head_succeeds_and_the_job_succeeds() -> None:
    job = gang_job(launcher="Ray")
    d = decide(job, [member(1, 0, "Succeeded", reason="Completed"), member(1, 1)], T0 + 30)
    assert stops(d) == {"g-1-r1": "GangCompleted"} and d.status["phase"] == "Running"
    d = decide(job, [member(1, 0, "Succeeded", reason="Completed"),
                          member(1, 1, "Cancelled", reason="GangCompleted", stop="GangCompleted")], T0 + 31)
    assert d.status["phase"] == "Succeeded" and d.status["gang"]["phase"] == "Done"


def test_cancel_stops_every_member() -> None:
    job = gang_job()
    job["spec"]["state"] = "Cancelled"
    d = decide(job, [member(1, 0), member(1, 1)], T0 + 30)
    assert stops(d) == {"g-1-r0": "Cancelled", "g-1-r1": "Cancelled"} and d.status["phase"] == "Cancelled"


def test_the_plan_moves_assemble_mesh_start_and_names_rank_0s_rendezvous() -> None:
    job = JobView.from_object(gang_job())
    views = [member(1, 0, done=""), member(1, 1, done="")]
    assert plan(views[0], views, job, GangConfig()).step == ASSEMBLE
    views = [member(1, 0, done="Assemble"), member(1, 1, done="Assemble")]
    told = plan(views[1], views, job, GangConfig())
    assert told.step == MESH and (told.rendezvous_address, told.rendezvous_port) == ("10.0.0.1", 29500)
    assert told.peers == ((0, "10.0.0.1", 29500, 30500), (1, "10.0.0.2", 29501, 30501))
    assert plan(views[1], views, job, GangConfig(probe=False)).step == START
    views = [member(1, 0, done="Mesh"), member(1, 1, done="Assemble")]
    assert plan(views[0], views, job, GangConfig()).step == MESH  # rank 1 still probes
    objs = [member_obj(1, 0, done="Mesh"), member_obj(1, 1, done="Mesh")]
    # The stored objects, decoded as the cache decodes them, say the same.
    assert plan(AttemptView.from_object(objs[0]), [AttemptView.from_object(o) for o in objs],
                JobView.from_object(gang_job()), GangConfig()).step == START
    assert plan(member(1, 0, done="Mesh"), [member(1, 0, done="Mesh"), member(1, 1, done="Mesh")], job,
                GangConfig()).step == START


def test_a_member_report_only_moves_forward_and_a_new_epoch_replaces_it() -> None:
    g = fold_gang({}, {"epoch": 1, "done": "Assemble", "address": "a", "port": 1, "probePort": 2})
    assert fold_gang(g, {"epoch": 1, "done": "Assemble", "address": "b", "port": 9})["address"] == "a"
    assert fold_gang(fold_gang(g, {"epoch": 1, "done": "Mesh"}), {"epoch": 1, "done": "Assemble"})["done"] == "Mesh"
    assert fold_gang(g, {"epoch": 0, "done": "Mesh"}) == g
    assert fold_gang(g, {"epoch": 2, "done": "Assemble", "address": "c", "port": 3})["address"] == "c"


def test_the_gang_probe_is_its_weakest_pair() -> None:
    probe = weakest([{"rttMs": "0.100", "busGbps": "9.5", "path": "Private", "measuredTime": "2026-01-01T00:00:01Z"},
                     {"rttMs": "0.400", "busGbps": "1.2", "path": "Public", "measuredTime": "2026-01-01T00:00:02Z"}])
    assert probe == {"rttMs": "0.400", "busGbps": "1.200", "path": "Public", "measuredTime": "2026-01-01T00:00:02Z"}


def test_the_gang_job_view_decodes_distributed_with_its_defaults() -> None:
    job = gang_job(gpusPerNode=4)
    del job["spec"]["distributed"]["startupTimeout"], job["spec"]["distributed"]["maxAssemblyRetries"]
    view = JobView.from_object(job)
    assert view.gang and (view.launcher, view.network) == ("Plain", "Regional")
    assert (view.startup_timeout, view.startup_timeout_text, view.max_assembly_retries) == (15 * 60.0, "15m", 2)
    assert view.topology["nodes"] == 2 and view.topology["totalGPUs"] == 8
    resolved = {"nodes": 3, "gpusPerNode": 0, "totalGPUs": 0, "network": "Global", "resolvedFrom": "Nodes"}
    assert JobView.from_object({**gang_job(), "status": {"topology": resolved}}).topology == resolved


def test_topology_never_changes_once_resolved() -> None:
    resolved = {"nodes": 2, "gpusPerNode": 0, "totalGPUs": 0, "network": "Global", "resolvedFrom": "Nodes"}
    assert topology({"distributed": {"nodes": 4}}, resolved) == resolved


# -- place_gang -------------------------------------------------------------------------------------------

def node(name: str, region: str = "us", provider: str = "a", cpu: int = 4000) -> NodeView:
    return NodeView(name, True, False, frozenset({"process"}), Amount(cpu, 8 << 30, 100 << 30),
                    labels={"nodus.dev/provider": provider}, region=region)


def reqs(n: int, **kw: Any) -> list[tuple[str, Request]]:
    return [(f"r{i}", Request(cpu_millis=1000, **kw)) for i in range(n)]


def test_a_gang_is_placed_all_at_once_one_member_per_node() -> None:
    out = place_gang(reqs(3), [node("a"), node("b"), node("c")], [])
    assert sorted(p.node for p in out.values()) == ["a", "b", "c"]
    none = place_gang(reqs(4), [node("a"), node("b"), node("c")], [])
    assert sorted(none) == ["r0", "r1", "r2", "r3"] and all(p.node is None for p in none.values())
    assert "a gang of 4 needs 4 nodes at once" in none["r0"].explain


def test_regional_and_colocated_gangs_stay_in_one_locality() -> None:
    nodes = [node("a", "us", "x"), node("b", "eu", "x"), node("c", "eu", "y"), node("d", "us", "x")]
    regional = place_gang(reqs(2), nodes, [], "Regional")
    assert {p.node for p in regional.values()} in ({"b", "c"}, {"a", "d"})
    colocated = place_gang(reqs(2), nodes, [], "Colocated")
    assert {p.node for p in colocated.values()} == {"a", "d"}
    unplaced = place_gang(reqs(3), nodes, [], "Colocated")
    assert sorted(unplaced) == ["r0", "r1", "r2"] and all(p.node is None for p in unplaced.values())
    everywhere = place_gang(reqs(4), nodes, [], "Global")
    assert sorted(p.node for p in everywhere.values()) == ["a", "b", "c", "d"]


def test_ranks_keep_their_node_and_avoiding_a_node_is_only_a_preference() -> None:
    nodes = [node("a"), node("b"), node("c")]
    kept = place_gang([("r0", Request(prefer_node="c")), ("r1", Request(prefer_node="a"))], nodes, [])
    assert (kept["r0"].node, kept["r1"].node) == ("c", "a")
    moved = place_gang([("r0", Request()), ("r1", Request(avoid_nodes=("a", "b")))], nodes, [])
    assert moved["r1"].node == "c"
    only = place_gang([("r0", Request()), ("r1", Request(avoid_nodes=("a", "b")))], nodes[:2], [])
    assert {only["r0"].node, only["r1"].node} == {"a", "b"}  # better there again than nowhere


# -- Dcp checkpoints of a gang --------------------------------------------------------------------------

def dcp_part(epoch: int, rank: int, seq: int, size: int = 10) -> dict[str, Any]:
    from nodus.coordinator.controllers.checkpoints import Commit
    return Commit(f"att-{epoch}-{rank}", "u1", seq, f"{rank}{seq}" * 8, size, f"blob://sha256/{rank}{seq}", T0 + seq,
                  epoch=epoch, format="Dcp", rank=rank, ranks=2).record()


def with_parts(obj: dict[str, Any], *parts: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "status": {**obj["status"], "checkpoints": list(parts)}}


def test_a_dcp_checkpoint_counts_only_once_every_rank_stored_its_part() -> None:
    from nodus.coordinator.controllers.checkpoints import complete, latest
    rank0 = with_parts(member_obj(1, 0), dcp_part(1, 0, 1), dcp_part(1, 0, 2))
    rank1 = with_parts(member_obj(1, 1), dcp_part(1, 1, 1, size=5))
    found = complete([rank0, rank1])
    assert [c["seq"] for c in found] == [1]  # seq 2 lacks rank 1's part
    top = latest([rank0, rank1])
    assert top["size"] == 15 and [p["rank"] for p in top["parts"]] == [0, 1]
    assert latest([rank0]) is None


def test_every_rank_commits_its_own_part_of_a_seq_and_fencing_still_holds() -> None:
    from nodus.coordinator.controllers.checkpoints import Commit, refusal
    rank0 = with_parts(member_obj(1, 0), dcp_part(1, 0, 1))
    rank1 = member_obj(1, 1)

    def part(rank: int, seq: int, epoch: int = 1) -> Commit:
        return Commit(f"att-{epoch}-{rank}", "u1", seq, f"{rank}{seq}" * 8, 10, "", T0, epoch=epoch, format="Dcp",
                      rank=rank, ranks=2)
    assert refusal(rank1, [rank0, rank1], part(1, 1)) is None  # the other part of seq 1
    assert refusal(rank0, [rank0, rank1], part(0, 1)) == "already committed"
    done1 = with_parts(member_obj(1, 1), dcp_part(1, 1, 1))
    other = Commit("att-1-1", "u1", 1, "ff" * 32, 10, "", T0, epoch=1, format="Dcp", rank=1, ranks=2)
    assert "not above" in refusal(done1, [rank0, done1], other)  # a different part for a seq it stored
    newer = member_obj(2, 0)
    assert "superseded" in refusal(rank1, [rank0, rank1, newer], part(1, 2))
    assert "epoch" in refusal(rank1, [rank0, rank1], part(1, 2, epoch=2))

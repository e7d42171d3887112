"""Gangs end to end on loopback: a real coordinator and four real agents (four "nodes" on one host).

What a user would notice: a 2-node Torchrun gang runs a real torch.distributed all-reduce over gloo
and succeeds; a 4-node Plain gang starts every rank with the same rendezvous and its own rank;
status.gang tells the epoch, the members, the rendezvous and the probe; a Dcp gang suspends with
every rank's part and resumes from all of them; GangService shows the same gang to operators over
grpcurl-able gRPC. (Losing a member: test_gang_recovery_e2e.py.)
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from conftest import BIN, Coordinator, job
from e2e import ENDED, JOBS, attempts_of, create, ended, fleet, get_job, patch_state, wait_job
from agent_double import AgentProcess, wait_for
from nodus.v1 import gang_pb2, gang_pb2_grpc

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    with Coordinator(tmp_path_factory.mktemp("gang-coordinator") / "data").start(extra_args=(
            "--lease-duration", "4s", "--heartbeat-interval", "1s", "--gang-probe-bytes", "1Mi",
            "--gang-probe-budget", "10s", "--gang-max-nodes", "12", "--free-storage", "64")) as coordinator:
        yield coordinator


@pytest.fixture(scope="module")
def agents(c: Coordinator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[AgentProcess]]:
    with fleet(c, tmp_path_factory.mktemp("gang-agents"), 4, "gang", "--region", "us-test",
               "--offering", "cpu-small") as started:
        yield started


ALL_REDUCE = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    print(f"rank {rank} of {world}: all_reduce gave {t.item()} (expected {expected})", flush=True)
    out = os.environ.get("NODUS_OUTPUTS_DIR")
    if out and rank == 0:
        with open(os.path.join(out, "sum.txt"), "w") as f:
            f.write(str(t.item()))
    dist.destroy_process_group()
    sys.exit(0 if t.item() == expected else 3)
""")


def test_a_two_node_torchrun_gang_all_reduces_over_gloo(c: Coordinator, agents: list[AgentProcess],
                                                        tmp_path: Path) -> None:
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    create(c, "torchrun-pair", command=["python3", str(script)], distributed={"nodes": 2, "launcher": "Torchrun"})
    done = ended(c, "torchrun-pair")
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    gang = status["gang"]
    assert gang["epoch"] == 1 and gang["size"] == 2 and gang["restarts"] == 0, gang
    assert gang["phase"] == "Done", gang
    assert gang["rendezvous"].startswith("127.0.0.1:"), gang
    assert sorted(m["rank"] for m in gang["members"]) == [0, 1]
    assert {m["phase"] for m in gang["members"]} == {"Succeeded"}
    assert {(m["offering"], m["regionClass"]) for m in gang["members"]} == {("cpu-small", "us-test")}
    assert status["topology"]["nodes"] == 2 and status["topology"]["resolvedFrom"] == "Nodes"
    assert gang["probe"].get("rttMs"), gang  # measured before the command started
    assert any(o["name"] == "outputs" for o in status.get("outputs") or []), status
    storage = status["storage"]  # --free-storage 64 on this coordinator: the rest is billed
    assert storage["bytes"] > 64 and storage["billedBytes"] == storage["bytes"] - 64, storage
    nodus = (str(BIN / "nodus"), "--kubeconfig", str(c.kubeconfig), "logs", "torchrun-pair")
    assert "rank 0 of 2: all_reduce gave 3.0" in c.run(*nodus).stdout  # the driver's log by default
    assert "rank 1 of 2: all_reduce gave 3.0" in c.run(*nodus, "--rank", "1").stdout


def test_a_four_node_plain_gang_starts_every_rank_with_one_rendezvous(c: Coordinator, agents: list[AgentProcess],
                                                                     tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    line = ('echo "$NODUS_RANK $NODUS_NODES $NODUS_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $NODUS_RENDEZVOUS '
            f'$NODUS_GANG_EPOCH" > {marks}/rank-$NODUS_RANK; echo "rank $NODUS_RANK" > $NODUS_OUTPUTS_DIR/report.txt')
    create(c, "plain-four", command=["sh", "-c", line], resources={"nodes": 4},
           outputs=[{"name": "report", "path": "/nodus/outputs/report.txt", "fromRanks": "All"}])
    status = ended(c, "plain-four")["status"]
    assert status["phase"] == "Succeeded", status
    outputs = sorted((o["name"], o["rank"]) for o in status["outputs"])  # rank 0's outputs name their rank too
    # fromRanks All: every rank's report (rank-N); the outputs directory is rank 0's (fromRanks Zero)
    assert outputs == [("outputs", 0), ("report", 0), ("report", 1), ("report", 2), ("report", 3)], outputs
    got = c.run(str(BIN / "nodus"), "--kubeconfig", str(c.kubeconfig), "outputs", "get", "plain-four", "report",
                "--rank", "2", "-o", str(tmp_path / "report-2"))
    assert (tmp_path / "report-2").read_bytes() == b"rank 2\n", got.stdout  # a file output comes back as the file
    rows = sorted((marks / f"rank-{r}").read_text().split() for r in range(4))
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    assert {tuple(r[1:]) for r in rows} == {(
        "4", "4", "127.0.0.1", status["gang"]["rendezvous"].split(":")[1], status["gang"]["rendezvous"], "1")}
    nodes = {a["spec"]["node"] for a in attempts_of(c, "plain-four")}
    assert len(nodes) == 4, nodes  # one member per node


def test_a_gang_larger_than_the_fleet_waits_whole_and_says_why(c: Coordinator, agents: list[AgentProcess]) -> None:
    create(c, "too-big", command=["true"], distributed={"nodes": 5})
    status = wait_job(c, "too-big", lambda o: "needs 5 nodes" in ((o.get("status") or {}).get("message") or ""),
                      what="the gang to wait for capacity")["status"]
    assert status["phase"] == "Queued" and status["gang"]["phase"] == "Queued", status
    members = attempts_of(c, "too-big")
    assert len(members) == 5 and not any(a["spec"].get("node") for a in members)  # all or nothing
    r = c.session().delete(c.url(f"{JOBS}/too-big"))
    assert r.status_code == 200, r.text


def test_operators_raise_the_gang_size_cap(c: Coordinator) -> None:
    body = job("ten-nodes", command=["true"], distributed={"nodes": 10})
    accepted = c.session().post(c.url(JOBS), params={"dryRun": "All"}, json=body)
    assert accepted.status_code == 201, accepted.text  # --gang-max-nodes 12 on this coordinator
    body = job("thirteen-nodes", command=["true"], distributed={"nodes": 13})
    refused = c.session().post(c.url(JOBS), params={"dryRun": "All"}, json=body)
    assert refused.status_code == 422 and "at most 12" in refused.text, refused.text


def test_gang_service_shows_the_gang_to_operators(c: Coordinator, agents: list[AgentProcess]) -> None:
    create(c, "svc-pair", command=["true"], distributed={"nodes": 2})
    ended(c, "svc-pair")
    with c.channel() as channel:
        stub = gang_pb2_grpc.GangServiceStub(channel)
        md = (("authorization", f"Bearer {c.token}"),)
        gang = stub.GetGang(gang_pb2.GetGangRequest(project="default", job="svc-pair"), metadata=md, timeout=10)
        assert gang.size == 2 and gang.epoch == 1 and gang.phase == gang_pb2.GANG_PHASE_DONE
        assert sorted(m.rank for m in gang.members) == [0, 1]
        assert len({m.node for m in gang.members}) == 2 and all(m.node for m in gang.members)
        listed = stub.ListGangs(gang_pb2.ListGangsRequest(project="default"), metadata=md, timeout=10)
        assert "svc-pair" in {g.job.name for g in listed.gangs}
        with pytest.raises(grpc.RpcError) as e:
            stub.GetGang(gang_pb2.GetGangRequest(project="default", job="nope"), metadata=md, timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def saved(c: Coordinator, name: str, marks: Path, timeout: float = 180) -> None:
    """Until both ranks of the DCP program saved; fails at once (with the status) if the Job ended."""
    def check() -> bool:
        if (marks / "saved-0").exists() and (marks / "saved-1").exists():
            return True
        status = get_job(c, name).get("status") or {}
        assert status.get("phase") not in ENDED, status
        return False
    try:
        wait_for(check, timeout, interval=0.2, what="both ranks to save")
    except AssertionError:
        print(get_job(c, name).get("status"))
        raise


DCP = textwrap.dedent("""
    import os, sys, time
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    rank, world = int(os.environ["NODUS_RANK"]), int(os.environ["NODUS_NODES"])
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world)
    ckpt = os.path.join(os.environ["NODUS_STATE_DIR"], "dcp")
    state = {"w": torch.zeros(4), "step": torch.tensor(0)}
    if os.path.exists(os.path.join(ckpt, ".metadata")):
        dcp.load(state, checkpoint_id=ckpt)
        with open(os.path.join(sys.argv[1], f"resumed-{rank}"), "w") as f:
            f.write(f"{int(state['step'])} {float(state['w'].sum())}")
        dist.barrier()
        dist.destroy_process_group()
        sys.exit(0)
    state["w"] += 1.5
    state["step"] = torch.tensor(7)
    dcp.save(state, checkpoint_id=ckpt)
    with open(os.path.join(sys.argv[1], f"saved-{rank}"), "w") as f:
        f.write("7")
    while True:
        time.sleep(0.5)  # until suspended
""")


LOAD_DCP = textwrap.dedent("""
    import sys, warnings
    import torch
    import torch.distributed.checkpoint as dcp
    warnings.simplefilter("ignore")  # loading without a process group is announced with a warning
    state = {"w": torch.zeros(4), "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=sys.argv[1])
    print(int(state["step"]), float(state["w"].sum()))
""")


def dcp_gang(c: Coordinator, name: str, tmp_path: Path) -> Path:
    """A 2-node gang of the DCP program (checkpoints only when asked), once both ranks saved; returns the
    directory of the ranks' marks."""
    script = tmp_path / "dcp_job.py"
    script.write_text(DCP)
    marks = tmp_path / "marks"
    marks.mkdir()
    create(c, name, command=[sys.executable, str(script), str(marks)], distributed={"nodes": 2},
           recovery={"checkpoint": {"interval": "6h"}})
    saved(c, name, marks)
    return marks


def test_a_dcp_gang_suspends_with_every_ranks_part_and_resumes_from_all_of_them(
        c: Coordinator, agents: list[AgentProcess], tmp_path: Path) -> None:
    marks = dcp_gang(c, "dcp-pair", tmp_path)
    assert get_job(c, "dcp-pair")["spec"]["recovery"]["checkpoint"]["format"] == "Dcp"  # the gang default
    patch_state(c, "dcp-pair", "Suspended")
    suspended = wait_job(c, "dcp-pair", lambda o: (o.get("status") or {}).get("phase") == "Suspended"
                         and ((o["status"].get("gang") or {}).get("phase") == "Done"), what="the suspend")
    assert suspended["status"]["checkpoint"]["seq"] >= 1, suspended["status"]  # both parts stored
    # Out of Nodus: `nodus checkpoint get --into` restores every rank's part, which together are the
    # whole torch.distributed.checkpoint, loadable by one process.
    into = tmp_path / "downloaded"
    out = c.run("nodus", "checkpoint", "get", "dcp-pair", "--into", str(into)).stdout
    assert "(2 ranks' parts)" in out, out
    loaded = subprocess.run([sys.executable, "-c", LOAD_DCP, str(into / "nodus" / "state" / "dcp")],
                            capture_output=True, text=True, timeout=120)
    assert loaded.stdout.split() == ["7", "6.0"], loaded.stdout + loaded.stderr
    patch_state(c, "dcp-pair", "Running")
    status = ended(c, "dcp-pair")["status"]
    assert status["phase"] == "Succeeded", status
    assert status["gang"]["epoch"] == 2 and status["gang"]["restarts"] == 0, status["gang"]
    # each rank loaded the whole torch.distributed.checkpoint: its own part and the other rank's
    assert (marks / "resumed-0").read_text() == "7 6.0" and (marks / "resumed-1").read_text() == "7 6.0"

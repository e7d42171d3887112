"""The Ray and Accelerate launchers end to end: a real coordinator and two real agents on loopback.

What a user would notice (issue 5, "Done when"): a 2-node Ray gang forms one Ray cluster whose driver
(the head's command) runs a remote function on each of the two nodes; the worker member is stopped
with GangCompleted once the driver is done, and no Ray process of the gang outlives it. A 2-node
Accelerate gang on CPU runs `accelerate launch` on both machines, and the script's
`accelerator.gather` sees both processes.

Both "nodes" are one host here, so each Ray node is told apart by its node id, not its address.
The agents run without cgroups: a cgroup's kill at the attempt's end would hide a Ray daemon that
the launcher's teardown missed.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from conftest import Coordinator
from e2e import JOBS, attempts_of, create, ended, fleet
from agent_double import AgentProcess, wait_for

pytestmark = pytest.mark.slow

RAY_DAEMONS = ("raylet", "gcs_server", "ray start", "ray::", "default_worker.py", "ray_process_reaper",
               "log_monitor.py", "monitor.py", "runtime_env", "dashboard")
"""Words in the command line of the processes a Ray node runs."""


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    with Coordinator(tmp_path_factory.mktemp("launchers-coordinator") / "data").start(extra_args=(
            "--lease-duration", "4s", "--heartbeat-interval", "1s", "--gang-probe", "off")) as coordinator:
        yield coordinator


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("launchers-agents")


@pytest.fixture(scope="module")
def agents(c: Coordinator, root: Path) -> Iterator[list[AgentProcess]]:
    # No cgroups: the agent's cgroup kill at an attempt's end would hide a Ray process the teardown missed.
    with fleet(c, root, 2, "launch", "--cgroups", "false") as started:
        yield started


def succeeded(c: Coordinator, name: str) -> dict[str, Any]:
    """The Job's status once it ended; its members' logs are printed when it did not succeed."""
    status = ended(c, name)["status"]
    if status["phase"] != "Succeeded":
        print(json.dumps(status, indent=1), logs(c, name), sep="\n")
    assert status["phase"] == "Succeeded", status.get("message")
    return status


def logs(c: Coordinator, name: str) -> str:
    """Every member's end and the latest attempt's log, for a failure message.

    The REST log serves one attempt per number, and a gang's members share theirs: rank 0's is
    the one it finds."""
    ends = "\n".join(f"{a['metadata']['name']} on {a['spec'].get('node')}: {a['status'].get('phase')} "
                     f"{a['status'].get('reason')} {a['status'].get('message')}" for a in attempts_of(c, name))
    return ends + "\n" + c.session().get(c.url(f"{JOBS}/{name}/log")).text[-6000:]


def ray_processes(root: Path) -> list[str]:
    """Ray daemons started inside the agents' work dirs (by their cwd or their environment)."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        try:
            line = " ".join(p.info["cmdline"] or ())
            if not any(word in line for word in RAY_DAEMONS):
                continue
            inside = str(root) in (p.info["cwd"] or "") or any(str(root) in v for v in p.environ().values())
        except psutil.Error:
            continue
        if inside:
            found.append(f"{p.pid}: {line[:200]}")
    return found


RAY_DRIVER = textwrap.dedent("""
    import json, os, sys, time
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address="auto")
    deadline = time.monotonic() + 60
    while len(alive := [n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    print(f"driver: {len(alive)} nodes alive", flush=True)

    @ray.remote(num_cpus=0)
    def where() -> str:
        return ray.get_runtime_context().get_node_id()

    ids = sorted(n["NodeID"] for n in alive)
    refs = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(i, soft=False)).remote() for i in ids]
    ran_on = ray.get(refs, timeout=90)
    print(f"driver: remote functions ran on {ran_on}", flush=True)
    result = {"nodes": ids, "ran_on": ran_on}
    for d in (sys.argv[1], os.environ["NODUS_OUTPUTS_DIR"]):
        with open(os.path.join(d, "ray.json"), "w") as f:
            json.dump(result, f)
    ray.shutdown()
    sys.exit(0 if len(ids) == 2 and sorted(ran_on) == ids else 3)
""")


def test_a_two_node_ray_gang_runs_a_remote_function_on_each_node(c: Coordinator, agents: list[AgentProcess],
                                                                 root: Path, tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(RAY_DRIVER)
    create(c, "ray-pair", command=["python3", str(script), str(tmp_path)],
           distributed={"nodes": 2, "launcher": "Ray"})
    status = succeeded(c, "ray-pair")
    result = json.loads((tmp_path / "ray.json").read_text())
    assert len(set(result["ran_on"])) == 2 and sorted(result["ran_on"]) == result["nodes"], result
    ends = sorted((a["status"].get("phase"), a["status"].get("reason")) for a in attempts_of(c, "ray-pair"))
    assert ends == [("Cancelled", "GangCompleted"), ("Succeeded", "Completed")], ends
    assert len({a["spec"]["node"] for a in attempts_of(c, "ray-pair")}) == 2
    assert any(o["name"] == "outputs" for o in status.get("outputs") or []), status  # the driver's ray.json
    wait_for(lambda: not ray_processes(root), 20, interval=0.5, what="the gang's Ray processes to end")


ACCELERATE = textwrap.dedent("""
    import os, sys
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    print(f"accelerate: process {rank} of {world}", flush=True)
    gathered = accelerator.gather(torch.tensor([float(rank)]))
    total = gathered.sum().item()
    print(f"accelerate: gathered {gathered.tolist()}", flush=True)
    with open(os.path.join(sys.argv[1], f"rank-{rank}"), "w") as f:
        f.write(f"{world} {total} {os.environ['NODUS_RANK']}")
    accelerator.wait_for_everyone()
    sys.exit(0 if world == 2 and total == 1.0 else 3)
""")


def test_a_two_machine_accelerate_launch_on_cpu_gathers_from_both(c: Coordinator, agents: list[AgentProcess],
                                                                 root: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(ACCELERATE)
    marks = tmp_path / "marks"
    marks.mkdir()
    create(c, "accelerate-pair", command=["python3", str(script), str(marks)],
           distributed={"nodes": 2, "launcher": "Accelerate"})
    status = succeeded(c, "accelerate-pair")
    rows = sorted((marks / f"rank-{r}").read_text().split() for r in range(2))
    assert rows == [["2", "1.0", "0"], ["2", "1.0", "1"]], rows
    assert {m["phase"] for m in status["gang"]["members"]} == {"Succeeded"}, status["gang"]

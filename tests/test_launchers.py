"""Launchers: every member's argv and environment, as tables; then the real torchrun, accelerate,
deepspeed and ray parse our argv, and small gangs run on loopback.

torch, accelerate, deepspeed and ray are in the test extra: their CLIs are taken from the bin
directory of the Python that runs the tests (whatever PATH says), and a missing one fails.
"""
from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_double import free_port
from nodus.launchers import (GANG_VARIABLES, LAUNCHERS, Launch, MemberPlan, PythonCommand,
                             Rendezvous, Role, Topology, check, gang_env, launch, launch_gang,
                             parse_python)

ROOT = Path(__file__).resolve().parent.parent
A, P = "10.0.0.1", 29500
RDZV = Rendezvous(A, P, 1)
C10D = Rendezvous(A, P, 3, "c10d")
T2x8, T4x0, T8x1 = Topology(2, 8), Topology(4, 0), Topology(8, 1)
TOPOLOGIES = (T2x8, T4x0, T8x1)
CMD = ("python", "train.py", "--lr", "0.1")
SCRIPT = ("--", "train.py", "--lr", "0.1")
ENV = {"PATH": "/usr/bin", "NODUS_JOB": "j"}
HOSTFILE = "/nodus/launcher/deepspeed-hostfile"


def member(launcher: str, topology: Topology, rank: int, rdzv: Rendezvous = RDZV,
           command: tuple[str, ...] = CMD, env: dict[str, str] | None = None,
           **fields: object) -> Launch:
    plan = MemberPlan(rank, topology, rdzv, command, env=ENV if env is None else env,
                      job="j", project="p", **fields)  # type: ignore[arg-type]
    return launch(launcher, plan)


def every_member(launchers: tuple[str, ...] = LAUNCHERS) -> list[object]:
    """Every launcher × topology × rank the launchers accept (Verl refuses CPU-only gangs)."""
    return [pytest.param(name, t, rank, id=f"{name}-{t.nodes}x{t.gpus_per_node}-r{rank}")
            for name in launchers for t in TOPOLOGIES
            if not (name == "Verl" and t.gpus_per_node == 0)
            for rank in range(t.nodes)]


# ---------------------------------------------------------------------------------------------
# argv, literally

ARGV = [
    ("Plain", T8x1, 4, RDZV, CMD),
    ("Torchrun", T2x8, 0, RDZV,
     ("torchrun", "--nnodes", "2", "--nproc_per_node", "8", "--node_rank", "0",
      "--master_addr", A, "--master_port", "29500", *SCRIPT)),
    ("Torchrun", T2x8, 1, RDZV,
     ("torchrun", "--nnodes", "2", "--nproc_per_node", "8", "--node_rank", "1",
      "--master_addr", A, "--master_port", "29500", *SCRIPT)),
    ("Torchrun", T4x0, 3, RDZV,
     ("torchrun", "--nnodes", "4", "--nproc_per_node", "1", "--node_rank", "3",
      "--master_addr", A, "--master_port", "29500", *SCRIPT)),
    ("Torchrun", T8x1, 5, C10D,
     ("torchrun", "--nnodes", "8", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
      "--rdzv_endpoint", "10.0.0.1:29500", "--rdzv_id", "p-j-e3", *SCRIPT)),
    ("Accelerate", T2x8, 1, RDZV,
     ("accelerate", "launch", "--multi_gpu", "--num_machines", "2", "--machine_rank", "1",
      "--main_process_ip", A, "--main_process_port", "29500", "--num_processes", "16", *SCRIPT)),
    ("Accelerate", T4x0, 2, RDZV,
     ("accelerate", "launch", "--cpu", "--num_machines", "4", "--machine_rank", "2",
      "--main_process_ip", A, "--main_process_port", "29500", "--num_processes", "4", *SCRIPT)),
    ("Accelerate", T8x1, 7, C10D,
     ("accelerate", "launch", "--multi_gpu", "--num_machines", "8", "--machine_rank", "7",
      "--main_process_ip", A, "--main_process_port", "29500", "--num_processes", "8",
      "--rdzv_backend", "c10d", *SCRIPT)),
    ("Deepspeed", T2x8, 1, RDZV,
     ("deepspeed", "--hostfile", HOSTFILE, "--no_ssh", "--node_rank", "1", "--master_addr", A,
      "--master_port", "29500", "--num_nodes", "2", "--num_gpus", "8", *SCRIPT)),
    ("Deepspeed", T4x0, 0, RDZV,
     ("deepspeed", "--hostfile", HOSTFILE, "--no_ssh", "--node_rank", "0", "--master_addr", A,
      "--master_port", "29500", "--num_nodes", "4", "--num_gpus", "1", *SCRIPT)),
    ("Ray", T2x8, 0, RDZV, CMD),
    ("Ray", T4x0, 2, RDZV,
     ("ray", "start", "--address", "10.0.0.1:29500", "--num-gpus", "0",
      "--temp-dir", "/tmp/nodus-ray-053e89d5d9d6bdb4", "--block")),
    ("Verl", T8x1, 0, RDZV, (*CMD, "trainer.nnodes=8", "trainer.n_gpus_per_node=1")),
    ("Verl", T8x1, 3, RDZV,
     ("ray", "start", "--address", "10.0.0.1:29500", "--num-gpus", "1",
      "--temp-dir", "/tmp/nodus-ray-e0b9f355a70b4f2f", "--block")),
]


@pytest.mark.parametrize("name,topology,rank,rdzv,argv", [
    pytest.param(*row, id=f"{row[0]}-{row[1].nodes}x{row[1].gpus_per_node}-r{row[2]}-{row[3].backend}")
    for row in ARGV])
def test_main_step(name: str, topology: Topology, rank: int, rdzv: Rendezvous,
                   argv: tuple[str, ...]) -> None:
    assert member(name, topology, rank, rdzv).argv == argv


@pytest.mark.parametrize("command,tail", [
    pytest.param(("python", "train.py", "--lr", "0.1"), SCRIPT, id="script"),
    pytest.param(("python3", "-u", "train.py"), ("--", "train.py"), id="unbuffered-script"),
    pytest.param(("python3.11", "-m", "pkg.train", "--k", "v"),
                 ("-m", "--", "pkg.train", "--k", "v"), id="module"),
    pytest.param(("python", "-mpkg.train"), ("-m", "--", "pkg.train"), id="module-attached"),
    pytest.param(("bash", "run.sh", "--m"), ("--no_python", "--", "bash", "run.sh", "--m"),
                 id="other-program"),
    pytest.param(("/opt/venv/bin/python", "train.py"),
                 ("--no_python", "--", "/opt/venv/bin/python", "train.py"), id="interpreter-path"),
    pytest.param(("python", "-c", "print(1)"), ("--no_python", "--", "python", "-c", "print(1)"),
                 id="inline-code"),
])
def test_torchrun_takes_the_script_apart(command: tuple[str, ...], tail: tuple[str, ...]) -> None:
    argv = member("Torchrun", T2x8, 0, command=command).argv
    assert argv[:argv.index("--master_port") + 2][-1] == "29500"
    assert argv[argv.index("--master_port") + 2:] == tail


@pytest.mark.parametrize("launcher,module_flag", [("Accelerate", "-m"), ("Deepspeed", "--module")])
def test_module_flag_per_launcher(launcher: str, module_flag: str) -> None:
    argv = member(launcher, T2x8, 0, command=("python", "-m", "pkg.train", "x")).argv
    assert argv[-4:] == (module_flag, "--", "pkg.train", "x")


def test_deepspeed_other_programs_get_no_local_rank() -> None:
    # DeepSpeed would put --local_rank=N right after the program (`env --local_rank=0 …`).
    argv = member("Deepspeed", T2x8, 0, command=("env", "python", "x.py")).argv
    assert argv[-6:] == ("--no_local_rank", "--no_python", "--", "env", "python", "x.py")
    assert "--no_local_rank" not in member("Deepspeed", T2x8, 0).argv


@pytest.mark.parametrize("argv,parsed", [
    (("python", "x.py", "a"), PythonCommand("python", "x.py", False, ("a",))),
    (("python3", "-u", "x.py"), PythonCommand("python3", "x.py", False, ())),
    (("python3.11", "-m", "m.n", "-k"), PythonCommand("python3.11", "m.n", True, ("-k",))),
    (("python", "-mm"), PythonCommand("python", "m", True, ())),
    (("python", "x.py", "-m", "y"), PythonCommand("python", "x.py", False, ("-m", "y"))),
    (("/usr/bin/python3", "x.py"), None),
    (("python", "-c", "pass"), None),
    (("python", "-O", "x.py"), None),
    (("python", "-"), None),
    (("python",), None),
    (("python", "-m"), None),
    (("pythonista", "x.py"), None),
    (("bash", "-c", "python x.py"), None),
    ((), None),
])
def test_parse_python(argv: tuple[str, ...], parsed: PythonCommand | None) -> None:
    assert parse_python(argv) == parsed


# ---------------------------------------------------------------------------------------------
# the environment contract, on every member of every launcher

@pytest.mark.parametrize("name,topology,rank", every_member())
def test_gang_variables_everywhere(name: str, topology: Topology, rank: int) -> None:
    env = member(name, topology, rank).env
    assert {k: env[k] for k in GANG_VARIABLES} == {
        "NODUS_RANK": str(rank),
        "NODUS_NODES": str(topology.nodes),
        "NODUS_GPUS_PER_NODE": str(topology.gpus_per_node),
        "NODUS_WORLD_SIZE": str(topology.nodes * max(topology.gpus_per_node, 1)),
        "NODUS_RENDEZVOUS": "10.0.0.1:29500",
        "NODUS_GANG_EPOCH": "1",
        "MASTER_ADDR": A,
        "MASTER_PORT": "29500",
    }
    assert env["PATH"] == "/usr/bin" and env["NODUS_JOB"] == "j"  # the attempt's own env stays


@pytest.mark.parametrize("name,topology,rank", every_member())
def test_launcher_variables(name: str, topology: Topology, rank: int) -> None:
    env = member(name, topology, rank).env
    extra = {k: v for k, v in env.items() if k not in GANG_VARIABLES and k not in ENV}
    if name in ("Ray", "Verl"):
        assert extra == {"RAY_ADDRESS": "10.0.0.1:29500", "RAY_USAGE_STATS_ENABLED": "0",
                         "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    elif name == "Accelerate" and topology.gpus_per_node == 0:
        assert extra == {"RANK": str(rank), "WORLD_SIZE": str(topology.nodes),
                         "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    else:
        assert extra == {}


@pytest.mark.parametrize("topology,world", [(T2x8, 16), (T4x0, 4), (T8x1, 8), (Topology(1, 0), 1)])
def test_world_size(topology: Topology, world: int) -> None:
    assert topology.world_size == world
    assert gang_env(MemberPlan(0, topology, RDZV, CMD))["NODUS_WORLD_SIZE"] == str(world)


def test_gang_variables_win_over_the_attempts_env() -> None:
    env = member("Plain", T2x8, 1, env={"NODUS_RANK": "7", "MASTER_PORT": "1", "X": "y"}).env
    assert (env["NODUS_RANK"], env["MASTER_PORT"], env["X"]) == ("1", "29500", "y")


def test_ipv6_rendezvous() -> None:
    rdzv = Rendezvous("fd00::1", 29500, 2)
    launch_ = member("Torchrun", T2x8, 1, rdzv)
    assert launch_.env["NODUS_RENDEZVOUS"] == "[fd00::1]:29500"
    assert launch_.env["MASTER_ADDR"] == "fd00::1"
    assert launch_.argv[launch_.argv.index("--master_addr") + 1] == "[fd00::1]"
    assert member("Ray", T2x8, 1, rdzv).argv[3] == "[fd00::1]:29500"


# ---------------------------------------------------------------------------------------------
# ranks: what differs between members

RANK_FLAG = {"Torchrun": "--node_rank", "Accelerate": "--machine_rank", "Deepspeed": "--node_rank"}


@pytest.mark.parametrize("name,topology,rank",
                         every_member(("Plain", "Torchrun", "Accelerate", "Deepspeed")))
def test_only_the_rank_differs_between_command_members(name: str, topology: Topology,
                                                       rank: int) -> None:
    mine, first = member(name, topology, rank), member(name, topology, 0)
    assert (mine.role, mine.runs_command, mine.waits_for_head) == (Role.MEMBER, True, False)
    assert mine.setup == mine.teardown == ()
    if name in RANK_FLAG:
        i = mine.argv.index(RANK_FLAG[name])
        assert mine.argv[i + 1] == str(rank)
        assert mine.argv[:i + 1] + mine.argv[i + 2:] == first.argv[:i + 1] + first.argv[i + 2:]
    else:
        assert mine.argv == first.argv == CMD
    assert mine.files == first.files


def test_c10d_has_no_node_rank() -> None:
    argvs = {member("Torchrun", T8x1, r, C10D).argv for r in range(8)}
    assert len(argvs) == 1 and "--node_rank" not in argvs.pop()


def test_deepspeed_hostfile() -> None:
    launch_ = member("Deepspeed", T2x8, 1, launcher_dir="/run/a1/")
    hostfile = "/run/a1/deepspeed-hostfile"
    assert launch_.argv[1:3] == ("--hostfile", hostfile)
    assert launch_.files == {hostfile: "node-0 slots=8\nnode-1 slots=8\n"}
    assert member("Deepspeed", T4x0, 3).files == {
        HOSTFILE: "".join(f"node-{r} slots=1\n" for r in range(4))}


@pytest.mark.parametrize("name,topology", [
    pytest.param(name, t, id=f"{name}-{t.nodes}x{t.gpus_per_node}")
    for name in ("Ray", "Verl") for t in TOPOLOGIES if t.gpus_per_node or name == "Ray"])
def test_ray_roles(name: str, topology: Topology) -> None:
    gpus = str(topology.gpus_per_node)
    head, *workers = launch_gang(name, topology, RDZV, CMD, env=ENV, startup_timeout_s=600)
    assert (head.role, head.runs_command, head.waits_for_head) == (Role.HEAD, True, False)
    start, wait = head.setup
    assert start[:-1] == ("ray", "start", "--head", "--port", "29500", "--node-ip-address", A,
                          "--num-gpus", gpus, "--temp-dir")
    assert wait[0] == "python" and wait[1] == "-c" and "ray.nodes()" in wait[2]
    assert wait[3:] == (str(topology.nodes), "600", "10.0.0.1:29500")
    compile(wait[2], "<wait-for-nodes>", "exec")
    assert head.argv[:len(CMD)] == CMD
    roots = [start[-1]]
    for worker in workers:
        assert (worker.role, worker.runs_command, worker.waits_for_head) == (Role.WORKER, False, True)
        assert worker.setup == ()
        assert worker.argv[:-2] == ("ray", "start", "--address", "10.0.0.1:29500", "--num-gpus", gpus,
                                    "--temp-dir")
        assert worker.argv[-1] == "--block"
        roots.append(worker.argv[-2])
        # the command runs once (its interpreter runs the worker's stop step)
        assert not set(CMD[1:]) & {w for step in worker.steps for w in step}
    for m, root in zip((head, *workers), roots):
        stop, = m.teardown  # not `ray stop`: that ends every Ray cluster of the host
        assert stop[:2] == ("python", "-c") and stop[3] == root
        compile(stop[2], "<stop-node>", "exec")
    assert len(set(roots)) == topology.nodes


# Ray's longest socket path under its root: /session_<date>_<time>_<usec>_<pid>/sockets/plasma_store.
RAY_SOCKET_TAIL = "/session_2026-11-29_13-53-22_925472_4194304/sockets/plasma_store"


def test_ray_nodes_get_short_temp_dirs_of_their_own() -> None:
    """Under the attempt's TMPDIR Ray's sockets outgrow an AF_UNIX path (107 bytes) and `ray start` fails."""
    def root(rank: int, launcher_dir: str) -> str:
        m = member("Ray", T2x8, rank, launcher_dir=launcher_dir)
        return m.argv[-2] if rank else m.setup[0][-1]
    roots = {root(r, d) for r in (0, 1) for d in ("/a/launcher", "/b/launcher")}
    assert len(roots) == 4
    assert all(r.startswith("/tmp/") and len(r + RAY_SOCKET_TAIL) <= 107 for r in roots), roots


def test_ray_worker_binds_its_own_address() -> None:
    argv = member("Ray", T2x8, 1, address="10.0.0.2").argv
    assert argv[-3:] == ("--node-ip-address", "10.0.0.2", "--block")


# A Ray daemon that names its node's temp dir and starts one that does not (as the dashboard agent
# hides its command line), both in one process group; argv: temp dir, whether to ignore SIGTERM.
RAY_DAEMON = """\
import signal, subprocess, sys, time
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print("up", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("manner,own_group", [("polite", True), ("stubborn", True), ("polite", False)])
def test_ray_teardown_ends_only_its_own_nodes_processes(manner: str, own_group: bool, tmp_path: Path) -> None:
    """own_group: the daemons have a process group of their own, as `ray start` under the agent's
    supervisor leaves them; else they share the stop step's, which must not end with them."""
    import psutil

    mine, other = tmp_path / "nodus-ray-mine", tmp_path / "nodus-ray-other"
    mine.mkdir()
    daemons = [subprocess.Popen([sys.executable, "-c", RAY_DAEMON, str(root), manner], stdout=subprocess.PIPE,
                                start_new_session=own_group or root == other) for root in (mine, other)]
    hidden: list[psutil.Process] = []
    try:
        for d in daemons:
            assert d.stdout is not None and d.stdout.readline() == b"up\n"
        hidden = psutil.Process(daemons[0].pid).children()
        others = [psutil.Process(daemons[1].pid), *psutil.Process(daemons[1].pid).children()]
        stop, = member("Ray", T2x8, 1, command=(sys.executable, "x.py")).teardown
        stop = (*stop[:3], str(mine), "1")  # this node's dir, a short grace
        assert subprocess.run(stop, timeout=30).returncode == 0
        assert not mine.exists()
        daemons[0].wait(5)  # this node's daemon ended (a TimeoutExpired fails the test)
        if own_group:
            assert not psutil.wait_procs(hidden, timeout=5)[1]  # ended with its group
        assert all(p.is_running() for p in others) and daemons[1].poll() is None  # another node's stay
    finally:
        for d in daemons:
            for p in psutil.Process(d.pid).children() if d.poll() is None else []:
                p.kill()
            d.kill()
            d.wait()
        for p in hidden:
            if p.is_running():
                p.kill()


def test_ray_waits_with_the_commands_interpreter() -> None:
    head = member("Ray", T2x8, 0, command=("/opt/venv/bin/python3", "-m", "app"))
    assert head.setup[1][0] == "/opt/venv/bin/python3"
    assert member("Ray", T2x8, 0, command=("./run.sh",)).setup[1][0] == "python3"


def test_verl_topology_overrides_replace_the_jobs() -> None:
    command = ("python3", "-m", "verl.trainer.main_ppo", "trainer.nnodes=1",
               "+trainer.n_gpus_per_node=2", "data.x=trainer.nnodes=9")
    assert member("Verl", T2x8, 0, command=command).argv == (
        "python3", "-m", "verl.trainer.main_ppo", "data.x=trainer.nnodes=9",
        "trainer.nnodes=2", "trainer.n_gpus_per_node=8")


def test_plain_without_a_command_keeps_the_entrypoint() -> None:
    assert member("Plain", T2x8, 0, command=()).argv == ()


# ---------------------------------------------------------------------------------------------
# purity

@pytest.mark.parametrize("name,topology,rank", every_member())
def test_deterministic_and_leaves_its_input_alone(name: str, topology: Topology, rank: int) -> None:
    env = dict(ENV)
    first = member(name, topology, rank, env=env)
    assert member(name, topology, rank, env=dict(ENV)) == first
    assert env == ENV
    first.env["MUTATED"] = "1"  # a caller's edit of one Launch reaches no other
    assert "MUTATED" not in member(name, topology, rank, env=env).env


@pytest.mark.parametrize("name", [n for n in LAUNCHERS])
def test_launch_gang_is_launch_per_rank(name: str) -> None:
    gang = launch_gang(name, T2x8, RDZV, CMD[:2], CMD[2:], ENV, job="j", project="p")
    assert gang == tuple(member(name, T2x8, r) for r in range(2))


def test_launchers_import_only_the_standard_library() -> None:
    bad = []
    for path in sorted((ROOT / "launchers" / "nodus" / "launchers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            bad += [f"{path.name}: {n}" for n in names
                    if n.split(".")[0] not in sys.stdlib_module_names]
    assert not bad, bad


# ---------------------------------------------------------------------------------------------
# errors

@pytest.mark.parametrize("make,message", [
    pytest.param(lambda: member("Slurm", T2x8, 0), "unknown launcher 'Slurm'", id="unknown-launcher"),
    pytest.param(lambda: member("torchrun", T2x8, 0), "unknown launcher", id="launcher-case"),
    pytest.param(lambda: member("Torchrun", T2x8, 2), r"rank must be in 0\.\.1", id="rank-high"),
    pytest.param(lambda: member("Torchrun", T2x8, -1), "rank must be in", id="rank-negative"),
    pytest.param(lambda: Topology(0, 8), "nodes must be an integer of at least 1", id="no-nodes"),
    pytest.param(lambda: Topology(2, -1), "gpus_per_node must be", id="negative-gpus"),
    pytest.param(lambda: Rendezvous(A, 0, 1), r"port must be in 1\.\.65535", id="port-0"),
    pytest.param(lambda: Rendezvous(A, 65536, 1), "port must be in", id="port-65536"),
    pytest.param(lambda: Rendezvous(A, "29500", 1),  # type: ignore[arg-type]
                 "port must be in", id="port-str"),
    pytest.param(lambda: Rendezvous(A, True, 1), "port must be in", id="port-bool"),
    pytest.param(lambda: Rendezvous(A, P, 0), "epoch must be", id="epoch-0"),
    pytest.param(lambda: Rendezvous(A, P, 1, "etcd"), "backend must be one of static, c10d",
                 id="backend"),
    pytest.param(lambda: Rendezvous("", P, 1), "address must be", id="no-address"),
    pytest.param(lambda: Rendezvous("a b", P, 1), "address must be", id="address-space"),
    pytest.param(lambda: member("Torchrun", T2x8, 0, command=()), "needs a command", id="no-command"),
    pytest.param(lambda: member("Verl", T4x0, 0), "Verl needs GPUs", id="verl-cpu"),
    pytest.param(lambda: member("Plain", T2x8, 0, launcher_dir="run"), "absolute path",
                 id="relative-dir"),
    pytest.param(lambda: member("Ray", T2x8, 0, startup_timeout_s=0), "startup_timeout_s",
                 id="no-startup-budget"),
])
def test_errors(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_check_for_admission() -> None:
    check("Verl", T2x8)
    with pytest.raises(ValueError, match="Plain, Torchrun, Ray, Verl, Accelerate, Deepspeed"):
        check("Horovod", T2x8)


# ---------------------------------------------------------------------------------------------
# the real CLIs, where installed

VENV_BIN = Path(sys.executable).parent


def _cli(*names: str) -> Path:
    """The test extra's console scripts, in the bin directory of the Python running the tests."""
    for name in names:
        assert (VENV_BIN / name).exists(), f"{name} is missing from {VENV_BIN}: install the test extra"
    return VENV_BIN / names[0]


def _interpreter(cli: Path) -> str:
    """The Python that runs a console script, from its shebang."""
    first = cli.read_bytes().split(b"\n", 1)[0].decode(errors="replace")
    interpreter = first[2:].strip().split()[0] if first.startswith("#!") else ""
    assert Path(interpreter).name.startswith("python"), f"cannot tell which Python runs {cli} ({first!r})"
    return interpreter


def _flags(argv: tuple[str, ...]) -> list[str]:
    """Our own flags: options before the `--` that hands over to the script."""
    head = argv[:argv.index("--")] if "--" in argv else argv
    return [w for w in head if w.startswith("-")]


HELP = [
    ("torchrun", ("torchrun", "--help"), lambda r: member("Torchrun", T2x8, r)),
    ("torchrun", ("torchrun", "--help"),
     lambda r: member("Torchrun", T8x1, r, C10D, command=("python", "-m", "m"))),
    ("torchrun", ("torchrun", "--help"), lambda r: member("Torchrun", T4x0, r, command=("sh",))),
    ("accelerate", ("accelerate", "launch", "--help"), lambda r: member("Accelerate", T2x8, r, C10D)),
    ("accelerate", ("accelerate", "launch", "--help"), lambda r: member("Accelerate", T4x0, r)),
    ("deepspeed", ("deepspeed", "--help"), lambda r: member("Deepspeed", T2x8, r)),
    ("deepspeed", ("deepspeed", "--help"), lambda r: member("Deepspeed", T4x0, r, command=("sh",))),
]


@pytest.mark.parametrize("cli,help_argv,make", [pytest.param(*h, id=f"{h[0]}-{i}")
                                                for i, h in enumerate(HELP)])
def test_real_cli_help_lists_our_flags(cli: str, help_argv: tuple[str, ...],
                                       make: Callable[[int], Launch]) -> None:
    text = subprocess.run((str(_cli(cli)), *help_argv[1:]), capture_output=True, text=True, timeout=180).stdout
    for rank in (0, 1):
        missing = [f for f in _flags(make(rank).argv[1:]) if f not in text]
        assert not missing, f"{cli} --help does not list {missing}"


def test_real_ray_help_lists_our_flags() -> None:
    ray = str(_cli("ray"))
    start = subprocess.run([ray, "start", "--help"], capture_output=True, text=True,
                           timeout=180).stdout
    head, worker = member("Ray", T2x8, 0), member("Ray", T2x8, 1, address="10.0.0.2")
    for argv in (head.setup[0], worker.argv):
        assert [f for f in _flags(argv) if f not in start] == []
    assert subprocess.run([ray, "stop", "--help"], capture_output=True,
                          timeout=180).returncode == 0


def _parse_with(cli: str, code: str, argv: tuple[str, ...]) -> dict[str, object]:
    out = subprocess.run([_interpreter(_cli(cli)), "-c", code, *argv], capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


TORCHRUN_PARSE = """\
import json, sys
from torch.distributed.run import parse_args
a = parse_args(sys.argv[1:])
print(json.dumps({k: getattr(a, k) for k in ("nnodes", "nproc_per_node", "node_rank", "master_addr",
    "master_port", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "module", "no_python",
    "training_script", "training_script_args")}))
"""


@pytest.mark.parametrize("rdzv,command,expect", [
    (RDZV, CMD, {"rdzv_backend": "static", "node_rank": 1, "master_addr": A, "master_port": P,
                 "module": False, "no_python": False, "training_script": "train.py",
                 "training_script_args": ["--lr", "0.1"]}),
    (C10D, ("python", "-m", "pkg.m", "--m", "--nnodes", "9"),
     {"rdzv_backend": "c10d", "rdzv_endpoint": "10.0.0.1:29500", "rdzv_id": "p-j-e3",
      "module": True, "training_script": "pkg.m", "training_script_args": ["--m", "--nnodes", "9"]}),
    (RDZV, ("sh", "-c", "exit 0"), {"no_python": True, "training_script": "sh",
                                    "training_script_args": ["-c", "exit 0"]}),
], ids=["static", "c10d-module", "no-python"])
def test_real_torchrun_parses_our_argv(rdzv: Rendezvous, command: tuple[str, ...],
                                       expect: dict[str, object]) -> None:
    parsed = _parse_with("torchrun", TORCHRUN_PARSE, member("Torchrun", T2x8, 1, rdzv, command).argv[1:])
    assert parsed["nnodes"] == "2" and parsed["nproc_per_node"] == "8"
    assert {k: parsed[k] for k in expect} == expect


ACCELERATE_PARSE = """\
import json, sys
from accelerate.commands.launch import launch_command_parser
a = launch_command_parser().parse_args(sys.argv[1:])
print(json.dumps({k: getattr(a, k) for k in ("cpu", "multi_gpu", "num_machines", "machine_rank",
    "main_process_ip", "main_process_port", "num_processes", "rdzv_backend", "module",
    "no_python", "training_script", "training_script_args")}))
"""


@pytest.mark.parametrize("topology,expect", [
    (T2x8, {"multi_gpu": True, "cpu": False, "num_processes": 16}),
    (T4x0, {"multi_gpu": False, "cpu": True, "num_processes": 4}),
], ids=["gpu", "cpu"])
def test_real_accelerate_parses_our_argv(topology: Topology, expect: dict[str, object]) -> None:
    parsed = _parse_with("accelerate", ACCELERATE_PARSE, member("Accelerate", topology, 1).argv[2:])
    assert {k: parsed[k] for k in expect} == expect
    assert (parsed["num_machines"], parsed["machine_rank"], parsed["main_process_ip"],
            parsed["main_process_port"]) == (topology.nodes, 1, A, P)
    assert (parsed["training_script"], parsed["training_script_args"]) == ("train.py", ["--lr", "0.1"])


DEEPSPEED_PARSE = """\
import json, sys
from deepspeed.launcher.runner import parse_args, _parse_hostfile
a = parse_args(sys.argv[2:])
doc = {k: getattr(a, k) for k in ("hostfile", "no_ssh", "node_rank", "master_addr", "master_port",
    "num_nodes", "num_gpus", "module", "no_python", "no_local_rank", "user_script", "user_args")}
doc["pool"] = dict(_parse_hostfile(sys.argv[1].splitlines()))
print(json.dumps(doc))
"""


def test_real_deepspeed_parses_our_argv_and_hostfile() -> None:
    launch_ = member("Deepspeed", T2x8, 1)
    (hostfile, text), = launch_.files.items()
    parsed = _parse_with("deepspeed", DEEPSPEED_PARSE, (text, *launch_.argv[1:]))
    assert parsed == {"hostfile": hostfile, "no_ssh": True, "node_rank": 1, "master_addr": A,
                      "master_port": P, "num_nodes": 2, "num_gpus": 8, "module": False,
                      "no_python": False, "no_local_rank": False, "user_script": "train.py",
                      "user_args": ["--lr", "0.1"], "pool": {"node-0": 8, "node-1": 8}}


RAY_PARSE = """\
import json, sys
from ray.scripts.scripts import start
ctx = start.make_context("start", sys.argv[1:])
print(json.dumps({k: ctx.params[k] for k in ("head", "port", "address", "node_ip_address",
    "num_gpus", "temp_dir", "block")}))
"""


def test_real_ray_parses_our_argv() -> None:
    head, worker = member("Ray", T2x8, 0), member("Ray", T2x8, 1)
    parsed = _parse_with("ray", RAY_PARSE, head.setup[0][2:])
    assert parsed == {"head": True, "port": P, "address": None, "node_ip_address": A,
                      "num_gpus": 8, "temp_dir": head.setup[0][-1], "block": False}
    parsed = _parse_with("ray", RAY_PARSE, worker.argv[2:])
    assert parsed == {"head": False, "port": None, "address": "10.0.0.1:29500",
                      "node_ip_address": None, "num_gpus": 8, "temp_dir": worker.argv[-2],
                      "block": True}


# ---------------------------------------------------------------------------------------------
# real gangs on loopback, run the way the agent runs a Launch (this harness is not the agent)

def _run_gang(launcher: str, topology: Topology, command: tuple[str, ...], tmp: Path,
              backend: str = "static", timeout: float = 240) -> dict[int, object]:
    port = free_port()
    rdzv = Rendezvous("127.0.0.1", port, 1, backend)
    # the launchers' argv names bare CLIs (deepspeed, python, ray): they are the test extra's
    env = {**os.environ, "OUT_DIR": str(tmp), "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    launches = [launch(launcher, MemberPlan(r, topology, rdzv, command, env=env, job="t",
                                            launcher_dir=str(tmp / f"m{r}"), startup_timeout_s=90))
                for r in range(topology.nodes)]
    results: dict[int, object] = {}
    command_done = threading.Event()

    def run(l: Launch) -> None:
        log = open(tmp / f"member-{l.rank}.log", "ab")
        for path, text in l.files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
        if l.waits_for_head:
            deadline = time.monotonic() + 90
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        results[l.rank] = "head never listened"
                        return
                    time.sleep(0.2)
        # Every step in a session of its own, as the agent's supervisor runs it: what `ray start`
        # leaves running stays in the setup step's process group, which the Ray teardown ends.
        for step in l.setup:
            rc = subprocess.run(step, env=l.env, stdout=log, stderr=log, timeout=timeout,
                                start_new_session=True).returncode
            if rc:
                results[l.rank] = f"setup {step[:3]} exited {rc}"
                return
        proc = subprocess.Popen(l.argv, env=l.env, stdout=log, stderr=log, start_new_session=True)
        try:
            if l.runs_command:
                results[l.rank] = proc.wait(timeout)
            else:
                command_done.wait(timeout)
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(60)
                results[l.rank] = "service"
        finally:
            if proc.poll() is None:
                proc.kill()
            for step in l.teardown:
                subprocess.run(step, env=l.env, stdout=log, stderr=log, timeout=120, start_new_session=True)

    threads = {l.rank: threading.Thread(target=run, args=(l,)) for l in launches}
    for t in threads.values():
        t.start()
    for l in launches:
        if l.runs_command:
            threads[l.rank].join()
    command_done.set()
    for t in threads.values():
        t.join()
    return results


def _logs(tmp: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(tmp.glob("member-*.log")))


ALLREDUCE = """\
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
n = dist.get_world_size()
assert t.item() == n * (n + 1) / 2, t
with open(os.path.join(os.environ["OUT_DIR"], f"rank-{dist.get_rank()}"), "w") as f:
    f.write(" ".join([os.environ["NODUS_RANK"], str(n), *sys.argv[1:]]))
dist.barrier()
dist.destroy_process_group()
"""

ACCELERATE_ALLREDUCE = """\
import os, sys, torch
from accelerate import Accelerator
a = Accelerator()
total = a.reduce(torch.tensor([float(a.process_index + 1)]), reduction="sum")
n = a.num_processes
assert total.item() == n * (n + 1) / 2, (total, a.distributed_type)
with open(os.path.join(os.environ["OUT_DIR"], f"rank-{a.process_index}"), "w") as f:
    f.write(" ".join([os.environ["NODUS_RANK"], str(n), *sys.argv[1:]]))
a.wait_for_everyone()
a.end_training()
"""


def _ranks(tmp: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(tmp.glob("rank-*"))}


# `--m` abbreviates torchrun's options: it reaches the script only thanks to our `--`. DeepSpeed's
# runner re-parses the script's arguments without one (see launchers/deepspeed.py), so it gets `--k`.
@pytest.mark.parametrize("launcher,backend,script,args", [
    ("Torchrun", "static", ALLREDUCE, ("--m", "x")),
    ("Torchrun", "c10d", ALLREDUCE, ("--m", "x")),
    ("Deepspeed", "static", ALLREDUCE, ("--k", "x")),
    ("Accelerate", "static", ACCELERATE_ALLREDUCE, ("--m", "x")),
])
def test_real_two_node_cpu_gang_all_reduces(launcher: str, backend: str, script: str,
                                            args: tuple[str, ...], tmp_path: Path) -> None:
    _cli(launcher.lower())
    (tmp_path / "job.py").write_text(script)
    results = _run_gang(launcher, Topology(2, 0), ("python", str(tmp_path / "job.py"), *args),
                        tmp_path, backend)
    assert results == {0: 0, 1: 0}, _logs(tmp_path)
    ranks = _ranks(tmp_path)
    assert set(ranks) == {"rank-0", "rank-1"}, _logs(tmp_path)
    assert sorted(v.split()[0] for v in ranks.values()) == ["0", "1"]  # one process per node
    # DeepSpeed adds its --local_rank=0 in front of the script's own arguments.
    assert all(v.split()[1] == "2" and v.endswith(" ".join(args)) for v in ranks.values())


RAY_JOB = """\
import os, sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init()
nodes = [n for n in ray.nodes() if n["Alive"]]
@ray.remote(num_cpus=0)
def where():
    return ray.get_runtime_context().get_node_id()
ran = set(ray.get([where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
    n["NodeID"], soft=False)).remote() for n in nodes]))
with open(os.path.join(os.environ["OUT_DIR"], "ray"), "w") as f:
    f.write(f"{len(nodes)} {len(ran)}")
"""


@pytest.mark.slow
def test_real_ray_cluster_runs_a_remote_function_on_every_node(tmp_path: Path) -> None:
    ray_cli = _cli("ray")
    (tmp_path / "job.py").write_text(RAY_JOB)
    results = _run_gang("Ray", Topology(2, 0), (_interpreter(ray_cli), str(tmp_path / "job.py")),
                        tmp_path)
    assert results == {0: 0, 1: "service"}, _logs(tmp_path)
    assert (tmp_path / "ray").read_text() == "2 2"
    assert _left_running(tmp_path) == [], _logs(tmp_path)  # each node's teardown ended its own


def _left_running(tmp: Path, within: float = 10) -> list[str]:
    """The processes started with this gang's environment (OUT_DIR=tmp) still running after `within` s."""
    import psutil

    deadline = time.monotonic() + within
    while True:
        left = []
        for p in psutil.process_iter(["cmdline", "status"]):
            try:
                if p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get("OUT_DIR") == str(tmp):
                    left.append(" ".join(p.info["cmdline"] or ())[:200])
            except psutil.Error:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)

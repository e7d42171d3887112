"""`nodus watch job NAME --progress`: the README demo's live bar, against a real coordinator and agent.

Off a terminal rich prints the bar's last state once; the test reads that and the exit status."""
from __future__ import annotations

from pathlib import Path

from conftest import Coordinator
from e2e import create, start_agent

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "job.yaml"


def test_the_progress_bar_follows_a_job_to_its_end_and_says_how_it_ended(coordinator: Coordinator,
                                                                         tmp_path: Path) -> None:
    with start_agent(coordinator, tmp_path / "agent"):
        coordinator.run("nodus", "apply", "-f", str(EXAMPLE))
        done = coordinator.run("nodus", "watch", "job", "hello", "--progress", timeout=120)
        assert "30/30" in done.stdout and "Succeeded" in done.stdout, done.stdout
        assert done.stdout.rstrip().endswith("job/hello Succeeded"), done.stdout
        create(coordinator, "broken", command=["python3", "-c", "raise SystemExit(3)"], backoffLimit=0)
        failed = coordinator.run("nodus", "watch", "job", "broken", "--progress", check=False, timeout=120)
        assert failed.returncode == 1 and "job/broken Failed" in failed.stdout, failed.stdout
    refused = coordinator.run("nodus", "watch", "jobs", "--progress", check=False)
    assert refused.returncode == 1 and "--progress follows one Job" in refused.stderr, refused.stderr


def test_logs_follow_prints_the_log_above_a_bar_of_the_jobs_progress(coordinator: Coordinator,
                                                                    tmp_path: Path) -> None:
    program = ("import json, os, time\n"
               "for step in range(1, 5):\n"
               "    print(f'step {step}', flush=True)\n"
               "    with open(os.environ['NODUS_PROGRESS'], 'a') as f:\n"
               "        f.write(json.dumps({'stage': 'steps', 'units': {'completed': step, 'total': 4}}) + '\\n')\n"
               "    time.sleep(0.4)\n")
    with start_agent(coordinator, tmp_path / "agent"):
        create(coordinator, "talker", command=["python3", "-c", program])
        shown = coordinator.run("nodus", "logs", "talker", "-f", "--progress", timeout=120)
        out = shown.stdout
        assert [line for line in out.splitlines() if line.startswith("step ")] == [f"step {i}" for i in range(1, 5)]
        assert "4/4" in out and "units" in out and "steps" in out, out
        assert out.rstrip().endswith("job/talker Succeeded"), out
        plain = coordinator.run("nodus", "logs", "talker", "-f", timeout=60)
        assert plain.stdout == "".join(f"step {i}\n" for i in range(1, 5)), "into a pipe, only the log's bytes"
    refused = coordinator.run("nodus", "logs", "talker", "--progress", check=False)
    assert refused.returncode == 1 and "add -f" in refused.stderr, refused.stderr

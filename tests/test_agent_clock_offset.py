"""`nodus-agent --clock-offset-file`: a real agent (against the protocol double of the coordinator)
reports every time shifted by the seconds in the file, as a coordinator run with the same flag sees
them: the attempt's start and end (stamped by its supervisor), its updates, its progress and the
heartbeats; and a change of the file moves what is stamped after it."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from agent_double import AgentProcess, FakeCoordinator, fake, wait_for
from nodus.agent.clock import POINTER, OffsetClock, SystemClock, agent_clock, supervisor_clock
from nodus.v1 import agent_pb2

DAY = 86_400.0

PROGRAM = """
import sys, time
from pathlib import Path
from nodus import progress
progress.report(stage='one', completed=1, total=2)
while not Path(sys.argv[1]).exists():
    time.sleep(0.05)
progress.report(stage='two', completed=2, total=2)
time.sleep(0.3)
"""



def seconds(ts: Timestamp) -> float:
    return ts.ToNanoseconds() / 1e9


def test_an_agent_with_an_offset_reports_its_times_shifted_by_it(fake: FakeCoordinator, tmp_path: Path) -> None:
    offset_file, go = tmp_path / "offset", tmp_path / "go"
    offset_file.write_text(str(DAY))
    agent = AgentProcess(tmp_path / "work", fake.address, fake.token,
                         extra_args=("--clock-offset-file", str(offset_file)))
    a = agent_pb2.Assignment(attempt_id="a-clock", index=0, attempt_number=1,
                             command=[sys.executable, "-c", PROGRAM, str(go)])
    a.job.project, a.job.name, a.job.uid = "default", "job-clock", "uid-clock"
    fake.assign(a, push=False)
    before = time.time()
    agent.start()
    try:
        wait_for(lambda: any(u.HasField("start_time") for u in fake.updates("a-clock")), 30, what="the start")
        wait_for(lambda: any(p.stage == "one" for p in fake.progress("a-clock")), 30, what="the first progress")
        wait_for(lambda: fake.messages("heartbeat"), 10, what="a heartbeat")
        middle = time.time()
        offset_file.write_text(str(2 * DAY))  # the clock moves on by another day while the program runs
        # what the agent stamps from now on is a day later again; once it heartbeats at the new time,
        # the supervisor (which reads the same file) has it too
        wait_for(lambda: seconds(fake.messages("heartbeat")[-1][1].heartbeat.time) >= middle + 2 * DAY, 10,
                 what="a heartbeat at the moved time")
        go.touch()
        end = fake.wait_final("a-clock")
        after = time.time()
    finally:
        agent.reap()
    assert end.reason == "Completed"
    started, finished = seconds(end.start_time), seconds(end.finish_time)
    assert before + DAY <= started <= middle + DAY, "the supervisor stamps the start on the agent's clock"
    assert middle + 2 * DAY <= finished <= after + 2 * DAY, "and the end after the move with the new offset"
    assert before + DAY <= seconds(end.inputs_ready_time) <= started
    assert middle + 2 * DAY <= seconds(end.time) <= after + 2 * DAY
    one = next(p for p in fake.progress("a-clock") if p.stage == "one")
    two = next(p for p in fake.progress("a-clock") if p.stage == "two")
    assert before + DAY <= seconds(one.time) <= middle + DAY
    assert middle + 2 * DAY <= seconds(two.time) <= after + 2 * DAY
    first_heartbeat = fake.messages("heartbeat")[0][1].heartbeat
    assert before + DAY <= seconds(first_heartbeat.time) <= middle + DAY


def test_the_pointer_follows_the_flag(tmp_path: Path) -> None:
    work, offset_file = tmp_path / "work", tmp_path / "offset"
    offset_file.write_text("30")
    attempt = work / "attempts" / "a-1"
    attempt.mkdir(parents=True)
    clock = agent_clock(work, str(offset_file))
    assert isinstance(clock, OffsetClock) and (work / POINTER).read_text() == str(offset_file.resolve())
    seen = supervisor_clock(attempt)
    assert isinstance(seen, OffsetClock) and seen.offset() == 30.0
    assert isinstance(agent_clock(work, ""), SystemClock) and not (work / POINTER).exists(), \
        "an agent restarted without the flag leaves its supervisors on the host's clock"
    assert isinstance(supervisor_clock(attempt), SystemClock)

"""Live progress of one Job in the terminal (rich): `nodus watch job NAME` and `nodus logs JOB -f` on a
terminal, or with `--progress`. A bar of status.progress (units of all indexes), the phase, the stage
and the cost, updated on each watch event until the Job ends; the exit status says whether it
succeeded. Under `logs -f` the log scrolls above the bar.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

TERMINAL = ("Succeeded", "Failed", "Cancelled")


def describe(job: dict[str, Any]) -> tuple[str, int, int | None, str]:
    """(phase, units completed, units total or None, the line beside the bar) of a Job object."""
    status = job.get("status") or {}
    progress = status.get("progress") or {}
    phase = str(status.get("phase") or "Pending")
    units = progress.get("units") or {}
    done = int(units.get("completed") or 0)
    total = int(units["total"]) if units.get("total") else None
    words = [phase]
    if progress.get("stage"):
        words.append(str(progress["stage"]))
    cost = (status.get("cost") or {}).get("totalUSD")
    if cost:
        words.append(f"${cost}")
    if status.get("reason") and phase in TERMINAL + ("Suspended",):
        words.append(f"({status['reason']})")
    return phase, done, total, "  ".join(words)


def follow(name: str, events: Iterable[dict[str, Any]], console: Console) -> int:
    """Shows the Job's progress from its watch `events` (Job objects) until it ends; 0 if it succeeded."""
    columns = (TextColumn("[bold]{task.fields[job]}"), BarColumn(), MofNCompleteColumn(), TextColumn("units"),
               TimeElapsedColumn(), TextColumn("{task.fields[line]}"))
    phase = ""
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(name, total=None, job=name, line="Pending")
        for event in events:
            if event.get("type") in ("BOOKMARK", "ERROR"):
                continue
            if event.get("type") == "DELETED":
                bar.update(task, line="deleted")
                phase = "Deleted"
                break
            phase, done, total, line = describe(event["object"])
            bar.update(task, completed=done, total=total, line=line)
            if phase in TERMINAL:
                break
    console.print(f"job/{name} {phase or 'not found'}")
    return 0 if phase == "Succeeded" else 1


LOG_END_WAIT = 5.0
"""After the log ends, how long the bar waits for the Job to end before it stops where it is."""


def follow_log(name: str, chunks: Iterable[bytes], events: Iterator[dict[str, Any]], console: Console) -> str:
    """Prints the log `chunks` line by line above a bar that follows the Job's watch `events` (read
    on a thread of their own); returns the phase the Job was last seen in."""
    columns = (TextColumn("[bold]{task.fields[job]}"), BarColumn(), MofNCompleteColumn(), TextColumn("units"),
               TimeElapsedColumn(), TextColumn("{task.fields[line]}"))
    seen = {"phase": ""}
    ended = threading.Event()
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(name, total=None, job=name, line="Pending")

        def watch() -> None:
            try:
                for event in events:
                    if event.get("type") not in ("ADDED", "MODIFIED"):
                        continue
                    phase, done, total, line = describe(event["object"])
                    bar.update(task, completed=done, total=total, line=line)
                    seen["phase"] = phase
                    if phase in TERMINAL:
                        break
            except Exception:  # noqa: BLE001 - the bar is a view: the log goes on without it
                pass
            finally:
                ended.set()

        threading.Thread(target=watch, name="job-progress", daemon=True).start()
        rest = b""
        for chunk in chunks:
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                console.print(line.decode(errors="replace"), markup=False, highlight=False, soft_wrap=True)
        if rest:
            console.print(rest.decode(errors="replace"), markup=False, highlight=False, soft_wrap=True)
        deadline = time.monotonic() + LOG_END_WAIT
        while not ended.is_set() and time.monotonic() < deadline:
            ended.wait(0.1)
    console.print(f"job/{name} {seen['phase'] or 'Pending'}")
    return seen["phase"]

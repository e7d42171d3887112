"""The mesh probe's process, from the agent's side: started ahead, handed its plan at Mesh.

A probe spends most of a gang's start importing torch (1-2 s on a quiet host, several on a busy one),
so the agent starts its process before the plan exists: at the latest when it accepts a member whose
plan says the Mesh step will come, and, after this host's first probed member, always one ahead
(`WarmProbes`), waiting with torch imported. The process's stdin is one end of a Unix socket pair: at
Mesh the agent sends the plan and, with SCM_RIGHTS, the member's reserved listening socket (reserved at
accept, before the process that will serve it is known), then closes its end. An agent that dies
closes it too, so a waiting probe reads end-of-file and exits.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
from typing import Any

log = logging.getLogger("nodus.agent.gang")


class ProbeProcess:
    """One probe process that has not yet been given its plan."""

    def __init__(self, proc: asyncio.subprocess.Process, channel: socket.socket) -> None:
        self.proc = proc
        self._channel: socket.socket | None = channel

    @property
    def waiting(self) -> bool:
        """Still running and still without a plan."""
        return self._channel is not None and self.proc.returncode is None

    async def run(self, request: dict[str, Any], listener: socket.socket | None, timeout: float) -> tuple[bytes, bytes]:
        """Hands the plan (and the listening socket) over and returns (stdout, stderr) once the probe ends;
        kills it past `timeout` and raises TimeoutError."""
        channel, self._channel = self._channel, None
        if channel is None:
            raise RuntimeError("this probe was given a plan already")
        try:
            # A plan is a few KB (a peer is ~100 B) and the pair's buffer far larger: this never blocks.
            socket.send_fds(channel, [json.dumps(request).encode()], [listener.fileno()] if listener else [])
        except OSError:
            pass  # the probe is gone: what it printed says why, and its exit status is read below
        finally:
            channel.close()
        try:
            async with asyncio.timeout(timeout):
                return await self.proc.communicate()
        except (TimeoutError, asyncio.CancelledError):
            self.kill()
            await self.proc.wait()
            raise

    def kill(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.proc.returncode is None:
            self.proc.kill()


async def start_probe(preload: bool) -> ProbeProcess:
    """A probe process waiting for its plan on a socket (`preload`: torch imported while it waits)."""
    ours, theirs = socket.socketpair()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "nodus.agent.probe", *(["--preload"] if preload else []), stdin=theirs.fileno(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return ProbeProcess(proc, ours)


def discard(task: "asyncio.Task[ProbeProcess] | None") -> None:
    """Ends a started (or starting) probe that will not be given a plan."""
    def end(t: "asyncio.Task[ProbeProcess]") -> None:
        if not t.cancelled() and t.exception() is None:
            probe = t.result()
            probe.kill()
            asyncio.get_running_loop().create_task(probe.proc.wait())  # reaped, its pipes closed
    if task is not None:
        if task.done():
            end(task)
        else:
            task.add_done_callback(end)


class WarmProbes:
    """At most one probe process kept ready on this host, from its first probed gang member on.

    Costs one idle Python process with torch imported (about 220 MB of RSS) on hosts that run probed
    gangs, and nothing on the others; `--warm-probe off` keeps none (each member's probe then starts
    at accept, and its import overlaps only the assembly)."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self._ready: asyncio.Task[ProbeProcess] | None = None

    def take(self) -> "asyncio.Task[ProbeProcess]":
        """The ready probe, else one started now."""
        task, self._ready = self._ready, None
        if task is not None and (not task.done() or (not task.cancelled() and task.exception() is None
                                                     and task.result().waiting)):
            return task
        discard(task)
        return asyncio.get_running_loop().create_task(start_probe(preload=True), name="probe-preload")

    def replenish(self) -> None:
        """Starts the next one ahead, unless one is ready or starting: called once a member's probe has
        measured, so that the import (1-2 CPU-seconds) never runs beside a measurement."""
        if self.keep and self._ready is None:
            self._ready = asyncio.get_running_loop().create_task(start_probe(preload=True), name="probe-warm")

    def close(self) -> None:
        discard(self._ready)
        self._ready = None

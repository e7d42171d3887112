"""Workload identity end to end (ADR 0055): a real coordinator and a real agent (process runtime).

A Job running as ServiceAccount `launcher` (role editor) reads $NODUS_TOKEN_FILE and, with that token,
the coordinator's CA ($NODUS_CA_FILE) and $NODUS_API_SERVER, creates a second Job and watches it through
the REST API until it succeeds; the second Job runs. The token file is the attempt's alone (mode 0400,
in a 0500 directory), and the token is in no log, status or audit record. Once the attempt has ended the
same token is refused (401, revoked). A token of a viewer account gets 403 on create; deleting an account
revokes its live tokens at once.
"""
from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from agent_double import AgentProcess, restart_ports, wait_for
from conftest import Coordinator
from e2e import JOBS, NS, create, joined, settled
from secret_scan import scan

ACCOUNTS = f"{NS}/serviceaccounts"

CLIENT = r'''
import json, os, ssl, sys, time, urllib.error, urllib.request
token = open(os.environ["NODUS_TOKEN_FILE"]).read().strip()
ctx = ssl.create_default_context(cafile=os.environ.get("NODUS_CA_FILE"))
base = os.environ["NODUS_API_SERVER"] + "/apis/nodus.dev/v1/namespaces/" + os.environ["NODUS_PROJECT"]
def call(method, path, body=None):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(req, context=ctx, timeout=60)
    except urllib.error.HTTPError as e:
        return e
'''

PARENT = CLIENT + r'''
child = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": sys.argv[1]},
         "spec": {"command": [sys.executable, "-c", "print('child ran')"]}}
made = call("POST", "/jobs", child)
print("create", made.status, flush=True)
if made.status != 201:
    sys.exit(3)
watch = call("GET", "/jobs?watch=true&fieldSelector=metadata.name%3D" + sys.argv[1])
for line in watch:
    event = json.loads(line)
    phase = (event["object"].get("status") or {}).get("phase")
    print("watched", event["type"], phase, flush=True)
    if phase == "Succeeded":
        break
    if phase in ("Failed", "Cancelled"):
        sys.exit(4)
while not os.path.exists(sys.argv[2]):  # the test reads the token file meanwhile
    time.sleep(0.1)
'''

VIEWER = CLIENT + r'''
listed = call("GET", "/jobs")
made = call("POST", "/jobs", {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "never"},
                              "spec": {"command": ["true"]}})
print("list", listed.status, "create", made.status, flush=True)
sys.exit(0 if listed.status == 200 and made.status == 403 else 5)
'''

WAITER = r'''
import os, sys, time
assert open(os.environ["NODUS_TOKEN_FILE"]).read().startswith("nodus_")
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
'''


def post(c: Coordinator, path: str, body: dict[str, Any]) -> None:
    r = c.session().post(c.url(path), json=body)
    assert r.status_code == 201, r.text


def account(c: Coordinator, name: str, role: str) -> None:
    post(c, ACCOUNTS, {"apiVersion": "nodus.dev/v1", "kind": "ServiceAccount", "metadata": {"name": name},
                       "spec": {"role": role}})


def token_file(agent: AgentProcess, job: str) -> Path:
    """The token file of the Job's running attempt on the agent (its run/spec.json names the Job)."""
    def find() -> Path | None:
        for spec in (agent.work_dir / "attempts").glob("*/run/spec.json"):
            try:
                named = json.loads(spec.read_text())["env"].get("NODUS_JOB")
            except (OSError, ValueError, KeyError):
                continue
            if named == job:
                path = spec.parent / "secrets" / "nodus.serviceaccount" / "token"
                return path if path.exists() else None
        return None
    return wait_for(find, 60, what=f"the token file of Job {job}")


def with_token(c: Coordinator, token: str) -> Any:
    s = c.session()
    s.headers["Authorization"] = f"Bearer {token}"
    return s


@pytest.fixture
def agent(coordinator: Coordinator, tmp_path: Path) -> Iterator[AgentProcess]:
    with joined([AgentProcess(tmp_path / "work", coordinator.grpc, coordinator.join_token,
                              node="sa-node").start()], coordinator) as [a]:
        yield a


def test_a_job_creates_and_watches_a_job_with_its_account_token(coordinator: Coordinator, agent: AgentProcess,
                                                                 tmp_path: Path) -> None:
    c = coordinator
    account(c, "launcher", "editor")
    release = tmp_path / "release-parent"
    create(c, "parent", command=[sys.executable, "-c", PARENT, "child", str(release)],
           serviceAccountName="launcher")

    def child_done() -> dict[str, Any] | None:
        parent = c.session().get(c.url(f"{JOBS}/parent")).json()
        assert (parent.get("status") or {}).get("phase") not in ("Failed", "Cancelled"), parent.get("status")
        r = c.session().get(c.url(f"{JOBS}/child"))
        return r.json() if r.status_code == 200 and (r.json().get("status") or {}).get("phase") == "Succeeded" else None
    child = wait_for(child_done, 180, what="the Job the parent created to succeed")
    assert child["spec"]["command"][-1] == "print('child ran')"

    path = token_file(agent, "parent")
    mode = path.stat().st_mode
    assert stat.S_IMODE(mode) == 0o400 and stat.S_IMODE(path.parent.stat().st_mode) == 0o500, oct(mode)
    token = path.read_text().strip()
    assert token.startswith("nodus_")
    assert (path.parent / "ca.crt").read_bytes() == c.ca.read_bytes(), "the coordinator's CA travels with it"
    assert (path.parent / "namespace").read_text() == "default"
    me = with_token(c, token).get(c.url(f"{JOBS}/child"))
    assert me.status_code == 200, me.text
    listed = c.run("nodus", "token", "ls", "--project", "default").stdout
    assert "system:serviceaccount:default:launcher" in listed, listed

    release.touch()
    parent = settled(c, "parent", 120)
    assert parent["phase"] == "Succeeded", parent
    seen: list[Any] = []

    def refused_now() -> Any:
        seen[:] = [with_token(c, token).get(c.url(JOBS))]
        return seen[0].json() if seen[0].status_code == 401 else None  # (a 4xx Response is falsy)
    try:
        refused = wait_for(refused_now, 30, what="the ended attempt's token to be refused")
    except AssertionError as e:
        raise AssertionError(f"{e}: last answer {seen[0].status_code} {seen[0].text[:300]}") from None
    assert "was revoked at" in refused["message"], refused
    assert scan(c.data_dir.parent, token) == [], "the token is in no log, status, store or audit record"


def test_a_viewer_token_may_read_but_not_create(coordinator: Coordinator, agent: AgentProcess) -> None:
    c = coordinator
    account(c, "reader", "viewer")
    create(c, "peek", command=[sys.executable, "-c", VIEWER], serviceAccountName="reader")
    done = settled(c, "peek", 120)
    assert done["phase"] == "Succeeded", f"the program saw something other than list 200, create 403: {done}"
    assert c.session().get(c.url(f"{JOBS}/never")).status_code == 404


def test_deleting_the_account_revokes_its_live_tokens(coordinator: Coordinator, agent: AgentProcess,
                                                      tmp_path: Path) -> None:
    c = coordinator
    account(c, "temp", "editor")
    release = tmp_path / "release-waiter"
    create(c, "holder", command=[sys.executable, "-c", WAITER, str(release)], serviceAccountName="temp")
    token = token_file(agent, "holder").read_text().strip()
    assert with_token(c, token).get(c.url(JOBS)).status_code == 200
    assert c.session().delete(c.url(f"{ACCOUNTS}/temp")).status_code == 200
    refused = with_token(c, token).get(c.url(JOBS))
    assert refused.status_code == 401 and "was revoked at" in refused.json()["message"], refused.text
    release.touch()
    assert settled(c, "holder", 120)["phase"] == "Succeeded"
    # a later Job naming the deleted account is refused at admission
    r = c.session().post(c.url(JOBS), json={"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "late"},
                                            "spec": {"command": ["true"], "serviceAccountName": "temp"}})
    assert r.status_code == 422 and 'no ServiceAccount "temp"' in r.json()["message"], r.text


READER = r'''
import json, os, ssl, sys, urllib.request
server = os.environ.get("NODUS_API_SERVER")
print("server", server, flush=True)
if server != sys.argv[1]:
    sys.exit(6)
token = open(os.environ["NODUS_TOKEN_FILE"]).read().strip()
ctx = ssl.create_default_context(cafile=os.environ["NODUS_CA_FILE"])
url = f"{server}/apis/nodus.dev/v1/namespaces/{os.environ['NODUS_PROJECT']}/jobs/{os.environ['NODUS_JOB']}"
me = json.load(urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": "Bearer " + token}),
                                      context=ctx, timeout=60))
print("read", me["metadata"]["name"], flush=True)
sys.exit(0 if me["metadata"]["name"] == os.environ["NODUS_JOB"] else 7)
'''


def _host_address() -> str:
    """This host's own non-loopback address (what another host would dial), else its name."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))  # no packet is sent: this only picks the outgoing address
            address = str(s.getsockname()[0])
        except OSError:
            address = ""
    return address if address and not address.startswith("127.") else socket.gethostname()


def test_attempts_are_told_the_attempt_api_server_and_reach_it(tmp_path: Path) -> None:
    """--attempt-api-server (ADR 0065): the coordinator listens on every address, its kubeconfig says
    127.0.0.1 (which an attempt on another host or in a pod cannot reach), and the Job is told the
    host's own address instead, reaches the API there (the coordinator's certificate names it) and reads
    itself with its token."""
    from agent_double import free_port
    port = free_port()
    told = f"https://{_host_address()}:{port}"
    with Coordinator(tmp_path / "data").start(http_port=port, host="0.0.0.0",
                                              extra_args=("--attempt-api-server", told)) as c:
        assert c.http.startswith("https://127.0.0.1:"), "the kubeconfig's server stays loopback"
        account(c, "reader", "viewer")
        with joined([AgentProcess(tmp_path / "work", c.grpc, c.join_token, node="sa-far").start()], c):
            create(c, "reader", command=[sys.executable, "-c", READER, told], serviceAccountName="reader")
            status = settled(c, "reader", timeout=120)
            logs = c.run("nodus", "logs", "reader", check=False).stdout
        assert status["phase"] == "Succeeded", (status, logs)
        assert f"server {told}" in logs and "read reader" in logs, logs


def test_a_dead_workload_tokens_record_leaves_the_store(tmp_path: Path) -> None:
    """ADR 0067: the token of an attempt that ended is revoked (and still listed, so a request presenting
    it is told so); once its expiry is the grace past, on the coordinator's clock (moved forward here by
    --clock-offset-file, across a restart), its record is deleted from the store."""
    from nodus.coordinator.controllers.workload_tokens import GRACE_SECONDS, TTL_SECONDS
    offset = tmp_path / "clock-offset"
    offset.write_text("0")
    flags = ("--clock-offset-file", str(offset))
    subject = "system:serviceaccount:default:brief"
    c = Coordinator(tmp_path / "data").start(extra_args=flags)
    try:
        account(c, "brief", "viewer")
        with joined([AgentProcess(tmp_path / "work", c.grpc, c.join_token, node="sa-gc").start()], c):
            create(c, "brief", command=[sys.executable, "-c", WAITER, str(tmp_path)], serviceAccountName="brief")
            assert settled(c, "brief", timeout=120)["phase"] == "Succeeded"

        def listed(*flag: str) -> bool:
            return subject in c.run("nodus", "token", "ls", "--project", "default", *flag).stdout
        wait_for(lambda: listed("--all") and not listed(), 60, what="the ended attempt's token to be revoked")
        c.stop()
        offset.write_text(str(TTL_SECONDS + GRACE_SECONDS + 60))
        c.start(extra_args=flags)
        wait_for(lambda: not listed("--all"), 60, what="the dead token's record to leave the store")
    finally:
        c.stop()


def test_a_reconnecting_agent_mints_no_second_token_for_its_running_attempt(tmp_path: Path) -> None:
    """After a coordinator restart the agent reconnects and reports its running attempt; FullState's copy of
    that attempt's Assignment is a no-op on the agent, so no second token is minted for it (one was, per
    reconnect, each listed and valid until the attempt ended)."""
    subject = "system:serviceaccount:default:steady"
    port = restart_ports()
    c = Coordinator(tmp_path / "data").start(grpc_port=port)
    try:
        account(c, "steady", "viewer")
        agent = AgentProcess(tmp_path / "work", c.grpc, c.join_token, node="sa-steady").start()
        with joined([agent], c):
            release = tmp_path / "release"
            create(c, "steady", command=[sys.executable, "-c", WAITER, str(release)], serviceAccountName="steady")
            token = token_file(agent, "steady").read_text().strip()

            def tokens() -> int:
                return c.run("nodus", "token", "ls", "--project", "default", "--all").stdout.count(subject)
            assert tokens() == 1
            c.kill()
            c.start(grpc_port=port)
            wait_for(lambda: "node sa-steady connected" in c.log.read_text() and
                     "1 attempts reported" in c.log.read_text().split("node sa-steady connected")[-1].split("\n")[0],
                     60, what="the agent to reconnect and report its attempt")
            assert tokens() == 1, "no second token for the attempt the agent already runs"
            assert with_token(c, token).get(c.url(JOBS)).status_code == 200, "its token still works"
            release.touch()
            assert settled(c, "steady", 120)["phase"] == "Succeeded"
    finally:
        c.stop()

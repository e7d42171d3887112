"""`nodus.client`: submit, watch, read logs and download outputs from Python, without shelling out.

    from nodus.client import Nodus

    nodus = Nodus()                               # the kubeconfig `nodus` uses (NODUS_KUBECONFIG, KUBECONFIG)
    job = nodus.submit("examples/job.yaml")       # a path, a YAML/JSON string or a dict
    for job in nodus.watch(job.name):             # a JobState at every change, until the Job ends
        print(job.phase, job.units_completed, "/", job.units_total)
    print(nodus.logs(job.name, index=0))
    nodus.download(job.name, "outputs", "out.tar.zst")

It speaks the coordinator's REST API as the CLI does (the same kubeconfig, CA and token). Refusals
raise `NodusClientError` with the server's reason, message and fix, so a notebook shows what to change.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import orjson
import yaml

from nodus.cli.client import CliError, Client, default_kubeconfig
from nodus.cli.data import download as _download
from nodus.cli.data import send

TERMINAL = frozenset({"Succeeded", "Failed", "Cancelled"})
_JOB_API = "nodus.dev/v1"


class NodusClientError(Exception):
    """A request the coordinator refused (or could not be reached for): the message and the fix."""

    def __init__(self, message: str, fix: str = "", request_id: str = "") -> None:
        super().__init__(message + (f" (fix: {fix})" if fix else ""))
        self.message, self.fix, self.request_id = message, fix, request_id

    @classmethod
    def of(cls, e: CliError) -> NodusClientError:
        return cls(e.message, e.fix, e.request_id)


@dataclass(frozen=True, slots=True)
class JobState:
    """A Job as the coordinator last wrote it, with the fields a notebook reads most; `object` is all of it."""

    name: str
    project: str
    phase: str
    reason: str
    message: str
    units_completed: int
    units_total: int | None
    cost_usd: str
    resource_version: str
    object: Mapping[str, Any]

    @property
    def done(self) -> bool:
        return self.phase in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded"

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> JobState:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        units = (status.get("progress") or {}).get("units") or {}
        total = units.get("total")
        return cls(str(meta.get("name", "")), str(meta.get("namespace", "")), str(status.get("phase") or "Pending"),
                   str(status.get("reason", "")), str(status.get("message", "")), int(units.get("completed") or 0),
                   int(total) if total is not None else None, str((status.get("cost") or {}).get("totalUSD", "")),
                   str(meta.get("resourceVersion", "")), obj)


class Nodus:
    """One coordinator and project, as a kubeconfig names them."""

    def __init__(self, kubeconfig: str | Path | None = None, project: str | None = None) -> None:
        try:
            self._client = Client(Path(kubeconfig) if kubeconfig else default_kubeconfig(), project)
        except CliError as e:
            raise NodusClientError.of(e) from None
        self.project = self._client.namespace

    def _jobs(self, name: str = "") -> str:
        path = f"/apis/{_JOB_API}/namespaces/{self.project}/jobs"
        return f"{path}/{name}" if name else path

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            return self._client.request(method, path, **kw)
        except CliError as e:
            raise NodusClientError.of(e) from None

    # -- Jobs -------------------------------------------------------------------------------------
    def submit(self, job: Mapping[str, Any] | str | Path, *, dry_run: bool = False) -> JobState:
        """Creates the Job (a dict, a path to YAML/JSON, or YAML/JSON text) in this project; with
        `dry_run`, only admits and prices it (status.estimate) without creating anything."""
        obj = dict(_load(job))
        obj.setdefault("apiVersion", _JOB_API)
        obj.setdefault("kind", "Job")
        if obj["kind"] != "Job" or obj["apiVersion"] != _JOB_API:
            raise NodusClientError(f"submit takes a Job ({_JOB_API}), not {obj['apiVersion']} {obj['kind']}",
                                   "give a Job; `nodus apply -f` takes the other kinds")
        params = {"dryRun": "All"} if dry_run else None
        return JobState.of(self._request("POST", self._jobs(), body=obj, params=params).json())

    def get(self, name: str) -> JobState:
        return JobState.of(self._request("GET", self._jobs(name)).json())

    def list(self, label_selector: str = "") -> list[JobState]:
        params = {"labelSelector": label_selector} if label_selector else None
        return [JobState.of(o) for o in self._request("GET", self._jobs(), params=params).json().get("items", [])]

    def watch(self, name: str, *, until_done: bool = True) -> Iterator[JobState]:
        """The Job now, then again at every change, from one watch (no polling); ends once it has
        ended when `until_done` (the default). A watch the server ends is opened again where it left."""
        current = self.get(name)
        yield current
        rv = current.resource_version
        while not (until_done and current.done):
            try:
                events = self._client.watch(self._client.for_kind("Job", _JOB_API), self.project,
                                            {"fieldSelector": f"metadata.name={name}", "resourceVersion": rv,
                                             "allowWatchBookmarks": "true"})
                for event in events:
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        raise NodusClientError(str(obj.get("message", "the watch failed")), str(obj.get("fix", "")))
                    rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
                    if kind == "DELETED":
                        raise NodusClientError(f"job {name} was deleted while it was watched")
                    if kind in ("ADDED", "MODIFIED"):
                        current = JobState.of(obj)
                        yield current
                        if until_done and current.done:
                            return
            except CliError as e:
                raise NodusClientError.of(e) from None

    def wait(self, name: str) -> JobState:
        """Blocks until the Job has ended and returns it (check `.succeeded`)."""
        last = None
        for last in self.watch(name):
            pass
        assert last is not None
        return last

    def delete(self, name: str) -> None:
        self._request("DELETE", self._jobs(name), body={"propagationPolicy": "Background"})

    # -- logs and outputs -------------------------------------------------------------------------
    def logs(self, name: str, *, index: int = 0, attempt: int | None = None, rank: int | None = None) -> str:
        """The log of an index's newest attempt (or of `attempt`), as text."""
        params: dict[str, Any] = {"index": index}
        if attempt is not None:
            params["attempt"] = attempt
        if rank is not None:
            params["rank"] = rank
        return str(self._request("GET", self._jobs(name) + "/log", params=params).text)

    def download(self, name: str, output: str, dest: str | Path, *, index: int = 0,
                 rank: int | None = None) -> Path:
        """Writes a committed output to `dest` (it appears only whole, once its sha256 matched the
        committed one) and returns its path."""
        params: dict[str, Any] = {"index": index}
        if rank is not None:
            params["rank"] = rank
        try:
            resp = send(self._client, "GET", self._jobs(name) + f"/outputs/{output}", params=params)
            _download(resp, str(dest))
        except CliError as e:
            raise NodusClientError.of(e) from None
        return Path(dest)


def _load(job: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    if isinstance(job, Mapping):
        return job
    text = str(job)
    if isinstance(job, Path) or ("\n" not in text and not text.lstrip().startswith("{") and Path(text).exists()):
        text = Path(text).read_text()
    try:
        doc = orjson.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (orjson.JSONDecodeError, yaml.YAMLError) as e:
        raise NodusClientError(f"the Job is not valid YAML or JSON: {e}", "check the file or text given") from None
    if not isinstance(doc, dict):
        raise NodusClientError("the Job must be a mapping (apiVersion, kind, metadata, spec)",
                               "give one Job document")
    return doc

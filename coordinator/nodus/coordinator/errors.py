"""One root error type and one registry of reasons.

Every failure the API reports is a `NodusError` carrying a registered `reason`. The registry maps each
reason to its HTTP status, its gRPC status code, its docs page and its default fix, in exactly one
table, so REST (metav1.Status), gRPC (status code + details) and the CLI all say the same thing.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

DOCS_BASE = "https://docs.nodus.dev/errors/"


def new_request_id() -> str:
    """Time-ordered, so logs sort by it; every response carries one and the server logs it."""
    return f"req_{int(time.time() * 1000):011x}{os.urandom(5).hex()}"


@dataclass(frozen=True, slots=True)
class Code:
    """A registered error reason."""

    reason: str
    http: int
    grpc: str
    """Name of the `grpc.StatusCode` member (kept as a string so this module imports no transport)."""
    fix: str
    """The default fix, used when the raiser gives none."""

    @property
    def docs(self) -> str:
        return DOCS_BASE + self.reason


_CODES = (
    # Kubernetes reasons (metav1.StatusReason), so kubectl and client-go understand them.
    Code("BadRequest", 400, "INVALID_ARGUMENT", "correct the request as the message says and send it again"),
    Code("Unauthorized", 401, "UNAUTHENTICATED",
         "send a valid bearer token (the admin kubeconfig is DATA_DIR/kubeconfig; `nodus token create` makes more)"),
    Code("Forbidden", 403, "PERMISSION_DENIED", "ask a project admin for a role that allows this verb"),
    Code("NotFound", 404, "NOT_FOUND", "check the name and project (`nodus get KIND -n PROJECT`)"),
    Code("MethodNotAllowed", 405, "UNIMPLEMENTED", "use a verb this resource supports"),
    Code("NotAcceptable", 406, "INVALID_ARGUMENT", "ask for application/json"),
    Code("AlreadyExists", 409, "ALREADY_EXISTS", "choose another name, or update the existing object"),
    Code("Conflict", 409, "ABORTED",
         "the object changed since you read it: read it again and reapply your change"),
    Code("Expired", 410, "OUT_OF_RANGE",
         "the requested resourceVersion was compacted: list again and watch from the list's resourceVersion"),
    Code("RequestEntityTooLarge", 413, "RESOURCE_EXHAUSTED", "send a smaller object"),
    Code("UnsupportedMediaType", 415, "INVALID_ARGUMENT",
         "send application/json, application/merge-patch+json or application/json-patch+json"),
    Code("Invalid", 422, "INVALID_ARGUMENT", "correct the fields listed in the causes"),
    Code("TooManyRequests", 429, "RESOURCE_EXHAUSTED", "retry after the time in Retry-After"),
    Code("InternalError", 500, "INTERNAL", "retry; if it persists, report the requestId"),
    Code("ServiceUnavailable", 503, "UNAVAILABLE", "retry shortly; the coordinator is starting or stopping"),
    Code("Timeout", 504, "DEADLINE_EXCEEDED", "retry with a longer timeout"),
    # Nodus's own reasons.
    Code("InsufficientCredits", 402, "FAILED_PRECONDITION", "add credits to the project or lower maxCostUSD"),
    Code("CapacityUnavailable", 503, "UNAVAILABLE",
         "widen placement (regions, GPU types, interruptible) or raise placement.queueTimeout"),
    Code("MaxCostReached", 402, "FAILED_PRECONDITION", "raise spec.maxCostUSD to resume"),
    Code("DeadlineExceeded", 408, "DEADLINE_EXCEEDED", "raise spec.timeout, or checkpoint and resume"),
    Code("EstimateExpired", 412, "FAILED_PRECONDITION",
         "run the dry-run again (?dryRun=All) and create with the new ETag"),
    Code("RuntimeNotReady", 422, "FAILED_PRECONDITION",
         "wait for the TrainingRuntime to be Ready, or name a Ready one in spec.runtime"),
    Code("AgentUnavailable", 503, "UNAVAILABLE", "the node agent is unreachable; it is retried automatically"),
    Code("LeaderDeposed", 503, "UNAVAILABLE",
         "nothing to do: another coordinator replica holds the controllers' lease now and makes this decision "
         "(GET /readyz on each replica shows which leads)"),
    Code("OfferingMismatch", 422, "INVALID_ARGUMENT",
         "start the agent with an --offering its hardware fits (`nodus pricebook get` lists them), or correct that "
         "offering in the price book and apply it as a new version; the agent registers again by itself"),
    # Why a Job ended or stopped (status.reason; status.fix is the fix below). A Job's end is not an API
    # error, but the reason reads the same everywhere, so it lives in the same table.
    Code("BackoffLimitExceeded", 422, "FAILED_PRECONDITION",
         "read the failed attempt's log (`nodus logs JOB --index I`), fix the program, then create the Job again "
         "(or raise spec.backoffLimit for flaky work)"),
    Code("GangAssemblyTimeout", 504, "DEADLINE_EXCEEDED",
         "see why a member never became ready (its log: nodus logs JOB; an init command, input or sidecar that "
         "waits), then raise spec.distributed.startupTimeout or maxAssemblyRetries, or create the Job again"),
    Code("MaxAttemptsExceeded", 503, "UNAVAILABLE",
         "capacity was lost more often than spec.recovery.maxAttempts allows: create the Job again, raise "
         "recovery.maxAttempts, or widen placement"),
    Code("InputFailed", 422, "FAILED_PRECONDITION",
         "the message names the input (spec.inputs[i]) and why it cannot be provided: correct that input (its URL, "
         "bucket object, sha256 or Connection), or create the producing Job it names, then create this Job again"),
    Code("WaitingForInput", 409, "FAILED_PRECONDITION",
         "nothing to do: the Job starts by itself once the producing Job the message names commits that output "
         "(`nodus get job PRODUCER` shows its progress); delete this Job to stop waiting"),
    Code("SuspendFailed", 409, "FAILED_PRECONDITION",
         "the suspend checkpoint failed (`nodus describe job NAME` shows why): set spec.state to Suspended again to "
         "retry it, or to Running to keep the Job running"),
    Code("Cancelled", 409, "CANCELLED", "the Job was cancelled (spec.state Cancelled); create it again to run it"),
    Code("Suspended", 409, "FAILED_PRECONDITION", "set spec.state to Running to resume the Job"),
    Code("NodeEnrolled", 403, "PERMISSION_DENIED",
         "another key holds this node name: start this host under another --node, or have an operator re-admit the "
         "name (`nodus node readmit NAME`, NodeService.ReadmitNode) so the next enrolment takes it"),
    Code("NodeRevoked", 403, "PERMISSION_DENIED",
         "an operator revoked this node: it may join again only once re-admitted (`nodus node readmit NAME`, "
         "NodeService.ReadmitNode), then it enrols with the join token"),
    Code("NodeCertificateRequired", 401, "UNAUTHENTICATED",
         "enrol with the join token (AgentService.Enrol on the TLS port) and call the agent port with the node "
         "certificate (nodus-agent does both with --coordinator-ca DATA_DIR/tls/ca.crt)"),
    Code("NodeScope", 403, "PERMISSION_DENIED",
         "a node reads and writes only the blobs, logs and checkpoints of the attempts assigned to it while they "
         "run (docs/adr/0045): enrol the node and use its certificate, for an attempt placed on it"),
    Code("StaleSession", 409, "FAILED_PRECONDITION",
         "register again: a newer registration of this node superseded the session (the agent does this itself)"),
    Code("DigestMismatch", 422, "DATA_LOSS",
         "the bytes received do not match the declared sha256 or size: upload the content again"),
    Code("OffsetMismatch", 409, "FAILED_PRECONDITION",
         "resend the log from the size the server reports (trailer x-log-size)"),
)

REGISTRY: dict[str, Code] = {c.reason: c for c in _CODES}


@dataclass(frozen=True, slots=True)
class Cause:
    """One field-level problem, as a metav1.StatusCause."""

    field: str
    reason: str
    """FieldValueInvalid, FieldValueRequired, FieldValueNotSupported, FieldValueDuplicate,
    FieldValueForbidden, FieldValueTooMany, FieldValueTooLong or FieldValueUnknown."""
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}


@dataclass(slots=True)
class NodusError(Exception):
    """The root error. `reason` must be registered in REGISTRY."""

    reason: str
    message: str
    fix: str | None = None
    causes: tuple[Cause, ...] = ()
    name: str | None = None
    kind: str | None = None
    """The plural resource name, as Kubernetes puts it in details.kind."""
    group: str | None = None
    retry_after: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reason not in REGISTRY:
            raise ValueError(f"unregistered error reason {self.reason!r}")
        Exception.__init__(self, self.message)

    @property
    def code(self) -> Code:
        return REGISTRY[self.reason]

    @property
    def effective_fix(self) -> str:
        if self.fix:
            return self.fix
        if self.causes and self.reason == "Invalid":
            fields = list(dict.fromkeys(c.field for c in self.causes))
            return f"change {', '.join(fields)} as the causes say, then send the object again"
        return self.code.fix

    def to_status(self, request_id: str) -> dict[str, Any]:
        """The metav1.Status body with Nodus's three extensions."""
        details: dict[str, Any] = {}
        if self.name is not None:
            details["name"] = self.name
        if self.group is not None:
            details["group"] = self.group
        if self.kind is not None:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = [c.as_dict() for c in self.causes]
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code.http,
            "docs": self.code.docs,
            "fix": self.effective_fix,
            "requestId": request_id,
        }
        if details:
            body["details"] = details
        return body


# -- field errors, worded the way Kubernetes words them (kubectl prints `field: message`) --------------

def render_value(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return "{...}" if isinstance(value, dict) else "[...]"
    return str(value)


def invalid_value(path: str, value: Any, rule: str) -> Cause:
    return Cause(path, "FieldValueInvalid", f"Invalid value: {render_value(value)}: {rule}")


def required(path: str, detail: str = "") -> Cause:
    return Cause(path, "FieldValueRequired", "Required value" + (f": {detail}" if detail else ""))


def not_supported(path: str, value: Any, supported: list[str] | tuple[str, ...]) -> Cause:
    choices = ", ".join(render_value(s) for s in supported)
    return Cause(path, "FieldValueNotSupported",
                 f"Unsupported value: {render_value(value)}: supported values: {choices}")


def duplicate(path: str, value: Any) -> Cause:
    return Cause(path, "FieldValueDuplicate", f"Duplicate value: {render_value(value)}")


def not_found(path: str, value: Any, detail: str) -> Cause:
    return Cause(path, "FieldValueNotFound", f"Not found: {render_value(value)}: {detail}")


def forbidden(path: str, detail: str) -> Cause:
    return Cause(path, "FieldValueForbidden", f"Forbidden: {detail}")


def too_many(path: str, count: int, limit: int) -> Cause:
    return Cause(path, "FieldValueTooMany", f"Too many: {count}: must have at most {limit} items")


def too_long(path: str, limit: int) -> Cause:
    return Cause(path, "FieldValueTooLong", f"Too long: may not be more than {limit} bytes")


def unknown_field(path: str) -> Cause:
    return Cause(path, "FieldValueUnknown", "Unknown field: not declared in the schema; remove it or check its spelling")


def invalid(kind: str, name: str, causes: list[Cause] | tuple[Cause, ...], *,
            group: str = "nodus.dev", fix: str | None = None) -> NodusError:
    """The 422 for an object with field problems, worded as Kubernetes words it."""
    summary = ", ".join(f"{c.field}: {c.message}" for c in causes)
    return NodusError(
        "Invalid",
        f'{kind}.{group} "{name}" is invalid: {summary}',
        fix=fix,
        causes=tuple(causes),
        name=name,
        # kube-apiserver puts the Kind here for Invalid, so kubectl prints `The Job "x" is invalid`.
        kind=kind,
        group=group,
    )

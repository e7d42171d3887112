"""ServiceAccount (nodus.dev/v1): an identity a Job's workload runs as, and the role it holds (ADR 0055).

A Job names one in `spec.serviceAccountName`; each of its attempts then gets a short-lived token of the
account (subject `system:serviceaccount:<project>:<name>`, the account's role in the account's project)
in the file `$NODUS_TOKEN_FILE`, so its program can create and watch other Jobs through the API. Nodus
has no RoleBinding kind, so the role is a field of the account (ADR 0050): `viewer` (get, list, watch) or
`editor` (and create, replace, patch, delete). Never `admin` (status writes, tokens: an operator's) nor
`metrics` (a scraper's, of every project). A token's role is one of the nested roles of identity.Role,
so one role says everything a list of them could.
"""
from __future__ import annotations

from typing import Any

from .. import errors
from ..errors import Cause
from .limits import AdmissionLimits
from .schema import KindSchema, Obj, Str

ROLES = ("viewer", "editor")
"""The roles an account may hold, lowest first (identity.Role's names)."""
DEFAULT_ROLE = "viewer"
SUBJECT_PREFIX = "system:serviceaccount:"


def subject(project: str, name: str) -> str:
    """The subject of the account's tokens, as Kubernetes names a ServiceAccount's."""
    return f"{SUBJECT_PREFIX}{project}:{name}"


def _role(value: str, path: str) -> list[Cause]:
    if value in ROLES:
        return []
    if value.lower() in ROLES:
        return [errors.invalid_value(path, value, f'role names are lowercase: use "{value.lower()}"')]
    if value.lower() in ("admin", "metrics"):
        return [errors.forbidden(path, f'a ServiceAccount may not hold the {value.lower()} role (a workload never '
                                       'administers its project): use "editor" to create, change and delete '
                                       'objects, or "viewer" to read them')]
    return [errors.not_supported(path, value, ROLES)]


SERVICE_ACCOUNT_SPEC = Obj(description="ServiceAccountSpec says what the account's tokens may do.", fields={
    "role": Str(description="Role is what the account's tokens may do in its project: viewer (get, list and watch) "
                            "or editor (and create, replace, patch and delete). Default viewer.",
                default=DEFAULT_ROLE, checks=(_role,)),
    "description": Str(description="Description says what the account is for.", max_length=1024),
})

SERVICE_ACCOUNT_STATUS = Obj(description="ServiceAccountStatus is empty: an attempt's token is minted when the "
                                         "attempt is assigned and revoked when it ends.")


def _rules(body: dict[str, Any], limits: AdmissionLimits) -> list[Cause]:
    return []


def _complete(body: dict[str, Any]) -> None:
    body.setdefault("spec", {}).setdefault("role", DEFAULT_ROLE)


SERVICE_ACCOUNT = KindSchema(
    kind="ServiceAccount",
    description="ServiceAccount is an identity for workloads: a Job naming it in spec.serviceAccountName gets, per "
                "attempt, a short-lived token with the account's role in this project, in the file $NODUS_TOKEN_FILE "
                "(revoked when the attempt ends, or when the account is deleted).",
    body=Obj(fields={"spec": SERVICE_ACCOUNT_SPEC}),
    status=SERVICE_ACCOUNT_STATUS,
    rules=_rules,
    complete=_complete,
    mutable=("spec",),
)

__all__ = ["DEFAULT_ROLE", "ROLES", "SERVICE_ACCOUNT", "SUBJECT_PREFIX", "subject"]

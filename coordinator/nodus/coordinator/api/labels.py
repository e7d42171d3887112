"""Label keys and values as Kubernetes checks them (metadata.labels, a Sweep's template labels)."""
from __future__ import annotations

import re
from typing import Any

from .. import errors
from ..errors import Cause
from .schema import Map, Str

QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
NAME_PART = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
             "alphanumeric character (regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


def qualified_name_problem(key: str) -> str | None:
    """Kubernetes' IsQualifiedName: an optional DNS-subdomain prefix, '/', and a name of at most 63."""
    prefix, _, name = key.rpartition("/")
    if "/" in prefix:
        return "a qualified name must have at most one '/'"
    if _ == "/" and (not prefix or len(prefix) > 253 or DNS_SUBDOMAIN.match(prefix) is None):
        return "prefix part must be a lowercase RFC 1123 subdomain of at most 253 characters"
    if not name:
        return "name part must be non-empty"
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    if QUALIFIED_NAME.match(name) is None:
        return NAME_PART
    return None


def label_causes(labels: dict[str, Any], path: str) -> list[Cause]:
    causes = []
    for key, value in labels.items():
        if (problem := qualified_name_problem(key)) is not None:
            causes.append(errors.invalid_value(path, key, problem))
        if isinstance(value, str):
            if len(value) > 63:
                causes.append(errors.invalid_value(path, value, "must be no more than 63 characters"))
            elif LABEL_VALUE.match(value) is None:
                causes.append(errors.invalid_value(
                    path, value, "a valid label must be an empty string or consist of alphanumeric characters, '-', "
                                 "'_' or '.', and must start and end with an alphanumeric character"))
    return causes


def labels_map(description: str = "") -> Map:
    """A labels map whose keys and values are checked as metadata.labels' are."""
    return Map(description=description, values=Str(), checks=(label_causes,))

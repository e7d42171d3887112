"""The resource API's types: units, the declarative schemas of every kind, the kinds registry and admission.

The resource service calls `admission.admit_create` / `admit_update` / `admit_status`; the gateway
reads `kinds.KINDS` for discovery and tables and `openapi.openapi_v3` for `kubectl explain`.
"""
from __future__ import annotations

from .admission import Admitted, Lookup, admit_create, admit_status, admit_update
from .kinds import KINDS, Column, KindInfo, by_group_version, resolve
from .openapi import openapi_v3

__all__ = ["Admitted", "Lookup", "admit_create", "admit_update", "admit_status", "openapi_v3", "KINDS", "Column",
           "KindInfo", "resolve", "by_group_version"]

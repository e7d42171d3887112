"""The Job spec's cross-field rules (beyond what each field's schema checks), shared by the kinds that
embed a Job spec: a Sweep's template (at spec.template.spec) and a TrainingJob's distributed block."""
from __future__ import annotations

from typing import Any

from .. import errors
from ..errors import Cause
from .limits import AdmissionLimits
from .schema import get


def distributed_rules(spec: dict[str, Any], at: str, limits: AdmissionLimits) -> list[Cause]:
    dist = spec.get("distributed")
    if not isinstance(dist, dict):
        return []
    causes: list[Cause] = []
    for field in ("completions", "parallelism"):
        value = spec.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value != 1:
            causes.append(errors.invalid_value(f"{at}.{field}", value,
                                               "must be 1 for a distributed Job: one gang runs the command on "
                                               "every node (create one Job per gang, or a Sweep)"))
    policy = get(spec, "network.egress.policy") or "Deny"
    if (spec.get("image") or spec.get("imageRef")) and policy != "Open":
        # A gang member's pod shares the node's network (docs/adr/0033-gang-pods-on-the-host-network.md).
        causes.append(errors.invalid_value(f"{at}.network.egress.policy", policy,
                                           "must be Open for a distributed Job with an image: its pods share the "
                                           "node's network, where Deny and AllowList are not enforced yet"))
    per_node = dist.get("gpusPerNode")
    count = get(spec, "resources.gpu.count")
    if dist.get("launcher") == "Verl" and not (per_node or count):
        causes.append(errors.invalid_value(f"{at}.distributed.launcher", "Verl",
                                           "needs GPUs: set distributed.gpusPerNode or resources.gpu.count "
                                           "(verl places its workers on GPUs)"))
    if per_node is not None and count is not None and per_node != count:
        causes.append(errors.invalid_value(f"{at}.distributed.gpusPerNode", per_node,
                                           f"must equal {at}.resources.gpu.count ({count})"))
    total = dist.get("totalGPUs")
    per = per_node or count
    if isinstance(total, int) and isinstance(per, int) and 2 <= total <= 64:
        if total % per:
            causes.append(errors.invalid_value(f"{at}.distributed.totalGPUs", total,
                                               f"must be a multiple of the GPUs per node ({per})"))
        elif total // per > limits.gang_max_nodes:
            causes.append(errors.invalid_value(
                f"{at}.distributed.totalGPUs", total,
                f"resolves to {total // per} nodes of {per} GPUs; at most {limits.gang_max_nodes} nodes during "
                "the beta"))
    return causes


_NOT_IN_RELEASE = {"fromWorkspace": "no Workspace kind exists in this release",
                   "fromStage": "no Pipeline kind exists in this release"}
"""Input kinds the spec names whose owning kind is not built yet: refused, never admitted to be skipped."""


def input_rules(spec: dict[str, Any], at: str) -> list[Cause]:
    """What each input needs beyond its schema: a kind this release can provide (a Job never starts
    without an input), and the Connection a bucket input is read through (docs/adr/0037)."""
    causes: list[Cause] = []
    inputs = spec.get("inputs")
    for i, item in enumerate(inputs if isinstance(inputs, list) else []):
        if not isinstance(item, dict):
            continue
        for kind, missing in _NOT_IN_RELEASE.items():
            if kind in item:
                causes.append(errors.forbidden(
                    f"{at}.inputs[{i}].{kind}",
                    f"{missing}, so this input could never be provided: use a url, bucket, output or volume "
                    "input instead"))
        bucket = item.get("bucket")
        if isinstance(bucket, dict) and not bucket.get("connection"):
            causes.append(errors.required(f"{at}.inputs[{i}].bucket.connection",
                                          "name the S3 Connection whose keys can read the object "
                                          "(kubectl get connections)"))
    return causes


def spec_rules(spec: dict[str, Any], limits: AdmissionLimits, at: str = "spec") -> list[Cause]:
    """The Job spec's cross-field rules; `at` is where the spec sits (Sweep: spec.template.spec)."""
    causes: list[Cause] = []
    if not spec.get("command") and not spec.get("image") and not spec.get("imageRef"):
        causes.append(errors.required(f"{at}.command", "a Job needs a command or an image"))
    completions, parallelism = spec.get("completions"), spec.get("parallelism")
    if isinstance(completions, int) and isinstance(parallelism, int) and 1 <= completions < parallelism <= 256:
        causes.append(errors.invalid_value(f"{at}.parallelism", parallelism,
                                           f"must be at most min(completions, 256) = {completions}"))
    egress = get(spec, "network.egress") or {}
    if egress.get("allow") and egress.get("policy") != "AllowList":
        causes.append(errors.forbidden(f"{at}.network.egress.allow", "allowed only with policy AllowList"))
    causes += distributed_rules(spec, at, limits)
    causes += input_rules(spec, at)
    return causes

"""Sweep admission: the matrix rules, the template as a Job spec, defaults and the update rules."""
from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from nodus.coordinator.resources import merge_patch as merged  # the API's own RFC 7386
from nodus.coordinator.api import admission
from nodus.coordinator.api.kinds import KINDS, resolve, sweep_cell_count
from nodus.coordinator.api.sweep import MAX_CELLS
from nodus.coordinator.errors import NodusError

SWEEP = resolve("sweep")
BASE: dict[str, Any] = {
    "apiVersion": "nodus.dev/v1",
    "kind": "Sweep",
    "metadata": {"name": "lr-grid"},
    "spec": {
        "matrix": {"gpu": [{"type": ["H100"], "count": 1}, "A100:1"], "regions": ["us", "eu"],
                   "params": {"LR": ["1e-4", "3e-4"], "BATCH": [16, 32], "FAST": [True]}},
        "template": {"spec": {"image": "ghcr.io/acme/train:1", "command": ["python", "train.py"]}},
    },
}


class Store:
    def __init__(self, *objects: tuple[str, str, dict[str, Any]]) -> None:
        self.objects = {(plural, project, obj["metadata"]["name"]): obj for plural, project, obj in objects}

    async def get(self, plural: str, project: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((plural, project, name)))


SECRET = {"metadata": {"name": "wandb"}, "status": {"version": 1, "versionID": "v1", "keys": ["WANDB_API_KEY"]}}




def create(obj: dict[str, Any], **kw: Any) -> admission.Admitted:
    return asyncio.run(admission.admit_create(SWEEP, obj, Store(("secrets", "p", SECRET)), project="p", **kw))


def update(old: dict[str, Any], new: dict[str, Any]) -> admission.Admitted:
    return asyncio.run(admission.admit_update(SWEEP, old, new, Store(), project="p"))


def spec(**fields: Any) -> dict[str, Any]:
    return {"spec": fields}


def template(**fields: Any) -> dict[str, Any]:
    return {"spec": {"template": {"spec": fields}}}


CASES: list[tuple[str, dict[str, Any], list[tuple[str, str]]]] = [
    ("template-missing", spec(template=None), [("spec.template", "Required value")]),
    ("template-spec-missing", spec(template={"kind": "Job", "spec": None}), [("spec.template.spec", "Required value")]),
    ("template-kind-bad", spec(template={"kind": "TrainingJob"}),
     [("spec.template.kind", 'Unsupported value: "TrainingJob": supported values: "Job"')]),
    ("template-unknown", spec(template={"metadata": {"annotations": {}}}),
     [("spec.template.metadata.annotations", "Unknown field")]),
    ("template-label-bad", spec(template={"metadata": {"labels": {"team": "not ok"}}}),
     [("spec.template.metadata.labels", "a valid label must be an empty string")]),
    ("template-job-rule", template(completions=0), [("spec.template.spec.completions", "between 1 and 10000")]),
    ("template-job-cross-rule", template(image=None, command=None),
     [("spec.template.spec.command", "a Job needs a command or an image")]),
    ("template-job-unknown", template(foo=1), [("spec.template.spec.foo", "Unknown field")]),
    ("template-ads-conflict", template(activeDeadlineSeconds=60, timeout="1h"),
     [("spec.template.spec.activeDeadlineSeconds", "conflicts with spec.template.spec.timeout")]),
    ("template-nodes-conflict", template(resources={"nodes": 3}, distributed={"nodes": 2}),
     [("spec.template.spec.resources.nodes", "conflicts with spec.template.spec.distributed.nodes (2)")]),
    ("template-secret-missing", template(secrets=["nope"]), [("spec.template.spec.secrets[0].name", "Not found")]),
    ("gpu-too-many", spec(matrix={"gpu": [{"type": [f"g{i}"]} for i in range(17)]}),
     [("spec.matrix.gpu", "Too many: 17: must have at most 16 items")]),
    ("gpu-count-bad", spec(matrix={"gpu": [{"type": ["H100"], "count": 3}]}),
     [("spec.matrix.gpu[0].count", "Unsupported value: 3")]),
    ("gpu-shorthand-bad", spec(matrix={"gpu": ["H100:one"]}), [("spec.matrix.gpu[0]", '"TYPE:COUNT"')]),
    ("gpu-unknown", spec(matrix={"gpu": [{"typ": ["H100"]}]}), [("spec.matrix.gpu[0].typ", "Unknown field")]),
    ("params-key-lower", spec(matrix={"params": {"lr": [1]}}), [("spec.matrix.params", 'Invalid value: "lr"')]),
    ("params-key-digit", spec(matrix={"params": {"1LR": [1]}}), [("spec.matrix.params", "upper case")]),
    ("params-empty-list", spec(matrix={"params": {"LR": []}}), [("spec.matrix.params[LR]", "at least one value")]),
    ("params-not-list", spec(matrix={"params": {"LR": 0.1}}), [("spec.matrix.params[LR]", "must be of type array")]),
    ("params-object-value", spec(matrix={"params": {"LR": [{"a": 1}]}}),
     [("spec.matrix.params[LR][0]", "must be of type string, number or boolean")]),
    ("params-list-value", spec(matrix={"params": {"LR": [[1]]}}), [("spec.matrix.params[LR][0]", "string, number")]),
    ("regions-type", spec(matrix={"regions": "us"}), [("spec.matrix.regions", "must be of type array")]),
    ("regions-duplicate", spec(matrix={"regions": ["us", "us"]}), [("spec.matrix.regions[1]", "Duplicate value")]),
    ("regions-widen", {"spec": {"matrix": {"regions": ["us", "asia"]},
                                "template": {"spec": {"placement": {"regions": ["us", "eu"]}}}}},
     [("spec.matrix.regions[1]", "may narrow, never widen")]),
    ("max-parallel-zero", spec(maxParallel=0), [("spec.maxParallel", "must be between 1 and 256")]),
    ("max-parallel-high", spec(maxParallel=257), [("spec.maxParallel", "must be between 1 and 256")]),
    ("repetitions-zero", spec(repetitions=0), [("spec.repetitions", "must be between 1 and 64")]),
    ("repetitions-high", spec(repetitions=65), [("spec.repetitions", "must be between 1 and 64")]),
    ("state-bad", spec(state="Paused"), [("spec.state", "Unsupported value")]),
    ("max-cost-float", spec(maxCostUSD=100.0), [("spec.maxCostUSD", "a JSON number is not accepted")]),
    ("max-cost-zero", spec(maxCostUSD="0.00"), [("spec.maxCostUSD", "must be greater than 0")]),
    ("too-many-cells", spec(matrix={"params": {"A": list(range(100)), "B": list(range(100))}, "gpu": None,
                                    "regions": None}, repetitions=2),
     [("spec.matrix", f"Invalid value: 80000: must make at most {MAX_CELLS} cells")]),
    ("matrix-unknown", spec(matrix={"zones": ["a"]}), [("spec.matrix.zones", "Unknown field")]),
]


@pytest.mark.parametrize("patch, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_sweep_rule(patch: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    with pytest.raises(NodusError) as info:
        create(merged(BASE, patch))
    found = [(c.field, c.message) for c in info.value.causes]
    for field, fragment in expected:
        assert any(f == field and fragment in m for f, m in found), f"{field}: …{fragment}… not in {found}"


def test_valid_sweep_is_admitted_with_defaults() -> None:
    out = create(BASE).object
    s = out["spec"]
    assert s["maxParallel"] == 4 and s["repetitions"] == 1 and s["state"] == "Running"
    assert s["template"]["kind"] == "Job"
    assert s["matrix"]["gpu"][1] == {"type": ["A100"], "count": 1, "interconnect": "Any"}
    assert s["matrix"]["params"] == {"LR": ["1e-4", "3e-4"], "BATCH": [16, 32], "FAST": [True]}
    job = s["template"]["spec"]
    assert job["completions"] == 1 and job["backoffLimit"] == 6 and job["placement"]["queueTimeout"] == "24h0m0s"
    assert job["recovery"]["checkpoint"]["format"] == "Snapshot"


def test_template_aliases_are_folded() -> None:
    patch = template(activeDeadlineSeconds=7200, resources={"nodes": 2}, secrets=["wandb"],
                     network={"egress": {"policy": "Open"}})  # an image gang's egress must be Open (ADR 0033)
    job = create(merged(BASE, patch)).object["spec"]["template"]["spec"]
    assert job["timeout"] == "2h0m0s" and job["distributed"]["nodes"] == 2 and job["secrets"] == [{"name": "wandb"}]
    assert job["recovery"]["checkpoint"]["format"] == "Dcp"
    assert "status" not in create(merged(BASE, patch)).object  # cells pin their own secret versions


def test_cell_count() -> None:
    assert sweep_cell_count(create(BASE).object["spec"]) == 2 * 2 * 2 * 2 * 1
    assert sweep_cell_count({"matrix": {"gpu": [], "params": {"A": [1, 2, 3]}}, "repetitions": 3}) == 9
    assert sweep_cell_count({}) == 1
    sweep = next(k for k in KINDS if k.kind == "Sweep")
    cells = next(c for c in sweep.columns if c.name == "Cells")
    assert cells.cell(create(BASE).object) == "0/16"
    assert cells.cell({"status": {"cells": [{"phase": "Succeeded"}, {"phase": "Running"}]}}) == "1/2"


def test_sweep_unknown_field_warn() -> None:
    out = create(merged(BASE, template(foo=1)), field_validation="Warn")
    assert out.warnings == ('unknown field "spec.template.spec.foo"',)


STORED = create(merged(BASE, spec(maxCostUSD="100.00"))).object


@pytest.mark.parametrize("patch", [spec(maxParallel=16), spec(maxCostUSD="150"), spec(state="Suspended"),
                                   spec(state="Cancelled")])
def test_sweep_mutable_fields(patch: dict[str, Any]) -> None:
    assert update(STORED, merged(STORED, patch)).object["spec"]["matrix"] == STORED["spec"]["matrix"]


@pytest.mark.parametrize("patch, field", [
    (spec(repetitions=2), "spec.repetitions"),
    (spec(matrix={"regions": ["us"]}), "spec.matrix.regions"),
    (spec(matrix={"params": {"LR": ["1e-3"]}}), "spec.matrix.params"),
    (template(parallelism=1, completions=4), "spec.template.spec.completions"),
    (template(backoffLimit=1), "spec.template.spec.backoffLimit"),  # mutable on a Job, not in a Sweep's template
    (template(state="Suspended"), "spec.template.spec.state"),
])
def test_sweep_immutable_fields(patch: dict[str, Any], field: str) -> None:
    with pytest.raises(NodusError) as info:
        update(STORED, merged(STORED, patch))
    assert [c.field for c in info.value.causes] == [field]
    assert info.value.causes[0].message.endswith("field is immutable")


def test_sweep_max_cost_raise_only() -> None:
    with pytest.raises(NodusError) as info:
        update(STORED, merged(STORED, spec(maxCostUSD="99.99")))
    assert info.value.causes[0].message == 'Invalid value: "99.99": may only be raised (was "100.00")'

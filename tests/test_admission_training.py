"""TrainingRuntime and TrainingJob admission: the runtime contract and the runs compiled against it."""
from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from nodus.coordinator.resources import merge_patch as merged  # the API's own RFC 7386
from nodus.coordinator.api import admission
from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.errors import NodusError

RUNTIME_KIND = resolve("trainingruntimes")
JOB_KIND = resolve("tj")

PARAMETER_SCHEMA = {
    "type": "object",
    "properties": {
        "learningRate": {"type": "number", "exclusiveMinimum": 0},
        "epochs": {"type": "integer", "minimum": 1},
        "method": {"enum": ["Full", "LoRA", "QLoRA"]},
        "lora": {"type": "object", "properties": {"r": {"type": "integer"}}, "additionalProperties": False},
    },
    "required": ["learningRate", "epochs"],
    "additionalProperties": False,
}
RUNTIME: dict[str, Any] = {
    "apiVersion": "nodus.dev/v1beta1",
    "kind": "TrainingRuntime",
    "metadata": {"name": "sft"},
    "spec": {
        "image": "ghcr.io/nodus/sft@sha256:" + "a" * 64,
        "task": "SFT",
        "command": ["python", "-m", "trainer"],
        "parameters": PARAMETER_SCHEMA,
        "defaults": {"parameters": {"learningRate": 0.0002, "epochs": 1, "method": "LoRA"},
                     "resources": {"gpu": "H100:1", "nodes": 1}},
        "modes": ["Train", "Evaluate"],
        "requires": {"data": True},
    },
}




class Store:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}

    def put(self, plural: str, project: str, obj: dict[str, Any]) -> None:
        self.objects[(plural, project, obj["metadata"]["name"])] = obj

    async def get(self, plural: str, project: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((plural, project, name)))


def create_runtime(obj: dict[str, Any], project: str = "p", **kw: Any) -> admission.Admitted:
    return asyncio.run(admission.admit_create(RUNTIME_KIND, obj, Store(), project=project, **kw))


def _store() -> Store:
    """A project runtime `sft`, catalog runtimes `nodus/grpo` and `nodus/distill`, a failed one, a Secret."""
    store = Store()
    store.put("trainingruntimes", "p", create_runtime(RUNTIME).object)
    grpo = merged(RUNTIME, {"metadata": {"name": "grpo"},
                            "spec": {"task": "GRPO", "modes": ["Train"], "requires": {"environment": True, "data": False},
                                     "parameters": None, "defaults": None}})
    store.put("trainingruntimes", "nodus", create_runtime(grpo, project="nodus").object)
    distill = merged(RUNTIME, {"metadata": {"name": "distill"}, "spec": {"task": "Distill", "requires": {"teacher": True}}})
    store.put("trainingruntimes", "nodus", create_runtime(distill, project="nodus").object)
    broken = merged(create_runtime(merged(RUNTIME, {"metadata": {"name": "broken"}})).object,
                    {"status": {"phase": "Failed"}})
    store.put("trainingruntimes", "p", broken)
    store.put("secrets", "p", {"metadata": {"name": "hf"}, "status": {"version": 1, "keys": ["HF_TOKEN"]}})
    return store


STORE = _store()
JOB: dict[str, Any] = {
    "apiVersion": "nodus.dev/v1beta1",
    "kind": "TrainingJob",
    "metadata": {"name": "ft"},
    "spec": {"runtime": "sft", "model": {"uri": "hf://Qwen/Qwen3-0.6B", "secret": "hf"},
             "data": {"volume": "ds", "path": "train.jsonl"}, "parameters": {"learningRate": 0.0001}},
}


def create_job(obj: dict[str, Any], **kw: Any) -> admission.Admitted:
    return asyncio.run(admission.admit_create(JOB_KIND, obj, STORE, project="p", **kw))


def assert_causes(call: Any, obj: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    with pytest.raises(NodusError) as info:
        call(obj)
    assert info.value.reason == "Invalid"
    found = [(c.field, c.message) for c in info.value.causes]
    for field, fragment in expected:
        assert any(f == field and fragment in m for f, m in found), f"{field}: …{fragment}… not in {found}"


def spec(**fields: Any) -> dict[str, Any]:
    return {"spec": fields}


# -- TrainingRuntime ---------------------------------------------------------------------------------

RUNTIME_CASES: list[tuple[str, dict[str, Any], list[tuple[str, str]]]] = [
    ("kind-wrong-version", {"apiVersion": "nodus.dev/v1"}, [("apiVersion", 'must be "nodus.dev/v1beta1"')]),
    ("image-missing", spec(image=None), [("spec.image", "Required value")]),
    ("task-missing", spec(task=None), [("spec.task", "Required value")]),
    ("task-bad", spec(task="RLHF"), [("spec.task", 'Unsupported value: "RLHF": supported values: "SFT", "Pretrain"')]),
    ("launcher-bad", spec(launcher="Ray"),
     [("spec.launcher", 'supported values: "Plain", "Torchrun", "Accelerate", "Deepspeed"')]),
    ("modes-empty", spec(modes=[]), [("spec.modes", "at least 1 item")]),
    ("modes-bad", spec(modes=["Train", "Serve"]), [("spec.modes[1]", "Unsupported value")]),
    ("modes-duplicate", spec(modes=["Train", "Train"]), [("spec.modes[1]", "Duplicate value")]),
    ("parameters-not-a-schema", spec(parameters={"type": "nope"}), [("spec.parameters.type", "not a valid JSON Schema")]),
    ("parameters-not-object", spec(parameters=["type"]), [("spec.parameters", "must be of type object")]),
    ("parameters-too-big", spec(parameters={"description": "x" * 70000}), [("spec.parameters", "Too long")]),
    ("defaults-violate-schema", spec(defaults={"parameters": {"epochs": 0}}),
     [("spec.defaults.parameters.epochs", "0 is less than the minimum of 1")]),
    ("defaults-unknown-parameter", spec(defaults={"parameters": {"warmup": 10}}),
     [("spec.defaults.parameters.warmup", "Forbidden: not allowed by the runtime's parameter schema")]),
    ("defaults-missing-required", spec(defaults={"parameters": {"epochs": None}}),
     [("spec.defaults.parameters.epochs", "Required value")]),
    ("defaults-enum", spec(defaults={"parameters": {"method": "Adapter"}}),
     [("spec.defaults.parameters.method", 'Unsupported value: "Adapter"')]),
    ("defaults-init-timeout", spec(defaults={"initCommand": {"command": ["x"], "timeout": "1h"}}),
     [("spec.defaults.initCommand.timeout", "at most 30m")]),
    ("defaults-sidecar-name", spec(defaults={"sidecars": [{"image": "vllm"}]}),
     [("spec.defaults.sidecars[0].name", "Required value")]),
    ("defaults-gpu-count", spec(defaults={"resources": {"gpu": {"count": 3}}}),
     [("spec.defaults.resources.gpu.count", "Unsupported value: 3")]),
    ("checkpoint-path-relative", spec(checkpointing={"path": "state"}), [("spec.checkpointing.path", "absolute path")]),
    ("checkpoint-strategy-bad", spec(checkpointing={"strategy": "Lightning"}),
     [("spec.checkpointing.strategy", 'supported values: "HFTrainer", "Custom"')]),
    ("preset-method-bad", spec(presets=[{"model": "Qwen/Qwen3-0.6B", "method": "Adapter"}]),
     [("spec.presets[0].method", 'supported values: "Full", "LoRA", "QLoRA"')]),
    ("preset-model-missing", spec(presets=[{"method": "LoRA"}]), [("spec.presets[0].model", "Required value")]),
    ("preset-resources-bad", spec(presets=[{"model": "m", "method": "Full", "resources": {"memory": "lots"}}]),
     [("spec.presets[0].resources.memory", "must be a quantity")]),
    ("output-relative", spec(outputs=[{"name": "adapter", "path": "out"}]), [("spec.outputs[0].path", "absolute path")]),
    ("output-duplicate", spec(outputs=[{"name": "a", "path": "/a"}, {"name": "a", "path": "/b"}]),
     [("spec.outputs[1].name", "Duplicate value")]),
    ("environment-tasks-bad", spec(environmentTasks="Always"), [("spec.environmentTasks", "Unsupported value")]),
    ("estimate-negative", spec(estimate={"secondsPerStep": {"h100-80g": -1}}),
     [("spec.estimate.secondsPerStep[h100-80g]", "greater than or equal to 0")]),
    ("estimate-type", spec(estimate={"secondsPerTask": {"h100-80g": "slow"}}),
     [("spec.estimate.secondsPerTask[h100-80g]", "must be of type integer")]),
    ("requires-type", spec(requires={"data": "yes"}), [("spec.requires.data", "must be of type boolean")]),
    ("spec-unknown", spec(imagePullPolicy="Always"), [("spec.imagePullPolicy", "Unknown field")]),
]


@pytest.mark.parametrize("patch, expected", [c[1:] for c in RUNTIME_CASES], ids=[c[0] for c in RUNTIME_CASES])
def test_runtime_rule(patch: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    assert_causes(create_runtime, merged(RUNTIME, patch), expected)


def test_runtime_defaults_are_written() -> None:
    out = create_runtime({"apiVersion": "nodus.dev/v1beta1", "kind": "TrainingRuntime", "metadata": {"name": "r"},
                          "spec": {"image": "img", "task": "Custom"}}).object["spec"]
    assert out == {"image": "img", "task": "Custom", "checkpointing": {"path": "/nodus/state", "strategy": "HFTrainer"},
                   "launcher": "Plain", "modes": ["Train"], "requires": {"model": True}}


def test_runtime_folds_resources() -> None:
    out = create_runtime(RUNTIME).object["spec"]
    assert out["defaults"]["resources"] == {"gpu": {"type": ["H100"], "count": 1, "interconnect": "Any"}}
    assert out["parameters"] == PARAMETER_SCHEMA


def test_runtime_spec_is_mutable() -> None:
    old = create_runtime(RUNTIME).object
    new = merged(old, spec(image="ghcr.io/nodus/sft:2", task="DPO", modes=["Train"]))
    out = asyncio.run(admission.admit_update(RUNTIME_KIND, old, new, Store(), project="p")).object
    assert out["spec"]["task"] == "DPO"


# -- TrainingJob -------------------------------------------------------------------------------------

JOB_CASES: list[tuple[str, dict[str, Any], list[tuple[str, str]]]] = [
    ("runtime-missing", spec(runtime=None), [("spec.runtime", "Required value")]),
    ("runtime-pattern", spec(runtime="Acme/SFT"), [("spec.runtime", "must be a TrainingRuntime name")]),
    ("runtime-not-found", spec(runtime="dpo"), [("spec.runtime", 'Not found: "dpo"')]),
    ("runtime-catalog-not-found", spec(runtime="nodus/sft"), [("spec.runtime", 'Not found: "nodus/sft"')]),
    ("runtime-failed", spec(runtime="broken"), [("spec.runtime", "not Ready")]),
    ("mode-bad", spec(mode="Serve"), [("spec.mode", 'supported values: "Train", "Evaluate"')]),
    ("mode-not-in-runtime", spec(runtime="nodus/grpo", mode="Evaluate", environment={"name": "nodus/swe"}),
     [("spec.mode", 'Unsupported value: "Evaluate": supported values: "Train"')]),
    ("requires-data", spec(data=None), [("spec.data", 'Required value: the TrainingRuntime "sft" requires it')]),
    ("requires-model", spec(model=None), [("spec.model", "Required value")]),
    ("requires-environment", spec(runtime="nodus/grpo", parameters=None), [("spec.environment", "requires it")]),
    ("requires-teacher", spec(runtime="nodus/distill"), [("spec.teacher", 'the TrainingRuntime "nodus/distill"')]),
    ("model-both", spec(model={"volume": {"name": "weights"}}), [("spec.model", "exactly one of uri or volume may be set")]),
    ("model-neither", spec(model={"uri": None, "secret": "hf"}), [("spec.model", "exactly one of uri or volume must be")]),
    ("model-uri-bad", spec(model={"uri": "https://huggingface.co/x"}), [("spec.model.uri", "hf://")]),
    ("model-volume-name", spec(model={"uri": None, "volume": {"revision": 1}}), [("spec.model.volume.name", "Required")]),
    ("model-secret-missing", spec(model={"secret": "gone"}), [("spec.model.secret", 'Not found: "gone"')]),
    ("teacher-both", spec(teacher={"uri": "hf://a/b", "volume": {"name": "v"}}), [("spec.teacher", "exactly one of")]),
    ("tracking-secret-missing", spec(tracking={"mlflow": {"uri": "https://ml.acme.dev", "secret": "gone"}}),
     [("spec.tracking.mlflow.secret", "Not found")]),
    ("params-type", spec(parameters={"learningRate": "fast"}),
     [("spec.parameters.learningRate", "Invalid value: \"fast\": 'fast' is not of type 'number'")]),
    ("params-unknown", spec(parameters={"warmup": 3}), [("spec.parameters.warmup", "Forbidden")]),
    ("params-over-defaults", spec(parameters={"epochs": 0}), [("spec.parameters.epochs", "less than the minimum of 1")]),
    ("params-nested", spec(parameters={"lora": {"r": "8"}}), [("spec.parameters.lora.r", "is not of type 'integer'")]),
    ("params-nested-unknown", spec(parameters={"lora": {"alpha": 16}}), [("spec.parameters.lora.alpha", "Forbidden")]),
    ("params-enum", spec(parameters={"method": "Prefix"}), [("spec.parameters.method", 'Unsupported value: "Prefix"')]),
    ("params-exclusive-min", spec(parameters={"learningRate": 0}), [("spec.parameters.learningRate", "minimum")]),
    ("params-not-object", spec(parameters="lr=1"), [("spec.parameters", "must be of type object")]),
    ("params-too-big", spec(parameters={"x": "y" * 70000}), [("spec.parameters", "Too long: may not be more than 65536")]),
    ("data-volume-missing", spec(data={"volume": None}), [("spec.data.volume", "Required value")]),
    ("data-format-bad", spec(data={"format": "Parquet"}), [("spec.data.format", "Unsupported value")]),
    ("data-fraction-one", spec(data={"validationFraction": "1"}), [("spec.data.validationFraction", "less than 1")]),
    ("data-fraction-word", spec(data={"validationFraction": "some"}), [("spec.data.validationFraction", "decimal")]),
    ("data-fraction-number", spec(data={"validationFraction": 0.05}),
     [("spec.data.validationFraction", "must be of type string")]),
    ("data-columns-role", spec(data={"columns": {"question": "q"}}), [("spec.data.columns[question]", "Unsupported")]),
    ("data-revision-negative", spec(data={"revision": -1}), [("spec.data.revision", "greater than or equal to 0")]),
    ("environment-name-missing", spec(environment={"seed": 1}), [("spec.environment.name", "Required value")]),
    ("environment-seed-negative", spec(environment={"name": "nodus/x", "seed": -1}),
     [("spec.environment.seed", "greater than or equal to 0")]),
    ("min-comparison-low", spec(evaluation={"minComparisonTasks": 8}),
     [("spec.evaluation.minComparisonTasks", "greater than or equal to 16")]),
    ("grading-high", spec(grading={"maxParallel": 33}), [("spec.grading.maxParallel", "between 1 and 32")]),
    ("export-volume-missing", spec(exportTo={}), [("spec.exportTo.volume", "Required value")]),
    ("mlflow-http", spec(tracking={"mlflow": {"uri": "http://ml.acme.dev"}}), [("spec.tracking.mlflow.uri", "https://")]),
    ("wandb-connection-missing", spec(tracking={"wandb": {}}), [("spec.tracking.wandb.connection", "Required value")]),
    ("max-cost-float", spec(maxCostUSD=50.0), [("spec.maxCostUSD", "a JSON number is not accepted")]),
    ("state-bad", spec(state="Stopped"), [("spec.state", "Unsupported value")]),
    ("task-bad", spec(task="Finetune"), [("spec.task", "Unsupported value")]),
    ("expected-duration-zero", spec(expectedDuration="0s"), [("spec.expectedDuration", "greater than 0s")]),
    ("dist-beta", spec(distributed={"nodes": 9}), [("spec.distributed.nodes", "at most 8 during the beta")]),
    ("dist-per-node", spec(distributed={"nodes": 2, "gpusPerNode": 2}, resources={"gpu": {"count": 4}}),
     [("spec.distributed.gpusPerNode", "must equal spec.resources.gpu.count (4)")]),
    ("nodes-conflict", spec(resources={"nodes": 4}, distributed={"nodes": 2}), [("spec.resources.nodes", "conflicts")]),
    ("dedicated-false", spec(placement={"dedicated": False}), [("spec.placement.dedicated", "only true")]),
    ("spec-unknown", spec(epochs=3), [("spec.epochs", "Unknown field")]),
]


@pytest.mark.parametrize("patch, expected", [c[1:] for c in JOB_CASES], ids=[c[0] for c in JOB_CASES])
def test_training_job_rule(patch: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    assert_causes(create_job, merged(JOB, patch), expected)


def test_training_job_defaults() -> None:
    out = create_job(JOB).object["spec"]
    assert out["mode"] == "Train" and out["state"] == "Running"
    assert out["evaluation"] == {"baseline": True, "final": True, "minComparisonTasks": 16}
    assert out["grading"] == {"maxParallel": 4}
    assert out["data"] == {"volume": "ds", "path": "train.jsonl", "format": "Auto", "validationFraction": "0.05"}
    assert out["placement"] == {"interruptible": "Never", "profile": "Balanced", "queueTimeout": "24h0m0s"}
    assert out["parameters"] == {"learningRate": 0.0001}  # the runtime's defaults are merged at compile time


def test_parameters_are_validated_over_the_runtime_defaults() -> None:
    # epochs is required by the schema and supplied by the runtime's defaults, not the job
    assert create_job(merged(JOB, spec(parameters=None))).object["spec"].get("parameters") is None
    assert create_job(merged(JOB, spec(parameters={"lora": {"r": 8}, "method": "QLoRA"})))


def test_catalog_runtime_and_folding() -> None:
    obj = merged(JOB, spec(runtime="nodus/grpo", environment={"name": "nodus/swe-bench", "trainTasks": 64},
                           resources={"nodes": 2, "gpu": "H100:8"}, parameters={"anything": True}))
    out = create_job(obj).object["spec"]
    assert out["environment"]["seed"] == 0
    assert out["distributed"]["nodes"] == 2 and "nodes" not in out["resources"]
    assert out["resources"]["gpu"] == {"type": ["H100"], "count": 8, "interconnect": "Any"}


def test_all_training_violations_at_once() -> None:
    with pytest.raises(NodusError) as info:
        create_job(merged(JOB, spec(grading={"maxParallel": 0}, parameters={"epochs": 0}, data=None)))
    fields = [c.field for c in info.value.causes]
    assert fields == ["spec.grading.maxParallel", "spec.data", "spec.parameters.epochs"]
    assert info.value.message.startswith('TrainingJob.nodus.dev "ft" is invalid: ')
    assert info.value.to_status("r")["details"]["kind"] == "TrainingJob"


STORED = create_job(merged(JOB, spec(maxCostUSD="40.00"))).object


def update_job(new: dict[str, Any]) -> admission.Admitted:
    return asyncio.run(admission.admit_update(JOB_KIND, STORED, new, STORE, project="p"))


@pytest.mark.parametrize("patch", [spec(maxCostUSD="80.00"), spec(state="Suspended"), spec(state="Cancelled")])
def test_training_job_mutable(patch: dict[str, Any]) -> None:
    assert update_job(merged(STORED, patch)).object["spec"]["runtime"] == "sft"


@pytest.mark.parametrize("patch, field", [
    (spec(runtime="broken"), "spec.runtime"),
    (spec(parameters={"learningRate": 0.5}), "spec.parameters"),
    (spec(model={"uri": "hf://other/model"}), "spec.model.uri"),
    (spec(grading={"maxParallel": 8}), "spec.grading.maxParallel"),
    (spec(data={"validationFraction": "0.1"}), "spec.data.validationFraction"),
])
def test_training_job_immutable(patch: dict[str, Any], field: str) -> None:
    with pytest.raises(NodusError) as info:
        update_job(merged(STORED, patch))
    assert [(c.field, c.message.endswith("field is immutable")) for c in info.value.causes] == [(field, True)]


def test_training_job_max_cost_raise_only() -> None:
    with pytest.raises(NodusError) as info:
        update_job(merged(STORED, spec(maxCostUSD="39.99")))
    assert info.value.causes[0].message == 'Invalid value: "39.99": may only be raised (was "40.00")'


def test_training_status_shape() -> None:
    ok = admission.admit_status(JOB_KIND, merged(STORED, {"status": {
        "phase": "Running", "metrics": {"step": 10, "loss": "0.81"},
        "compiledJob": {"image": "x", "completions": 1}, "summary": {"comparison": {"comparable": True}}}}))
    assert ok.object["status"]["metrics"]["step"] == 10
    with pytest.raises(NodusError) as info:
        admission.admit_status(JOB_KIND, merged(STORED, {"status": {"metrics": {"step": "10"},
                                                                    "compiledJob": {"nope": 1}}}))
    assert [c.field for c in info.value.causes] == ["status.metrics.step", "status.compiledJob.nope"]

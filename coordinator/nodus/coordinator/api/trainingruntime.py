"""TrainingRuntime (nodus.dev/v1beta1): a trainer image plus the contract TrainingJobs compile against.

Its `spec.parameters` is a JSON Schema (Draft 2020-12, at most 64 KiB) and `spec.defaults.parameters`
must satisfy it; TrainingJob admission validates a job's parameters merged over those defaults with
the same `json_schema_causes`, so the two kinds word parameter problems alike.
"""
from __future__ import annotations

from typing import Any

import jsonschema
from jsonschema import Draft202012Validator

from .. import errors
from ..errors import Cause
from .job import INIT_COMMAND, RESOURCES, SIDECARS, fold_resources
from .job_status import CONDITIONS
from .limits import AdmissionLimits
from .schema import Bool, Free, Int, KindSchema, List, Map, Obj, Str, get, strings

PARAMETERS_MAX_BYTES = 64 * 1024
TASKS = ("SFT", "Pretrain", "DPO", "ORPO", "KTO", "Reward", "GRPO", "Distill", "Evaluate", "Custom")
MODES = ("Train", "Evaluate")


def _absolute(value: str, path: str) -> list[Cause]:
    return [] if value.startswith("/") else [errors.invalid_value(path, value, "must be an absolute path")]


def _json_path(base: str, parts: Any) -> str:
    path = base
    for part in parts:
        path = f"{path}[{part}]" if isinstance(part, int) else f"{path}.{part}"
    return path


def json_schema_causes(schema: dict[str, Any], instance: Any, base: str) -> list[Cause]:
    """Validate `instance` against a JSON Schema; one Kubernetes-worded cause per error, at its path."""
    try:
        validator = Draft202012Validator(schema)
        found = sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))
    except jsonschema.exceptions.SchemaError as exc:
        return [errors.invalid_value(base, instance, f"the runtime's parameter schema is invalid: {exc.message}")]
    except Exception as exc:  # an unresolvable $ref and the like: report, never crash admission
        return [errors.invalid_value(base, instance, f"cannot be checked against the runtime's schema: {exc}")]
    causes: list[Cause] = []
    for error in found:
        path = _json_path(base, error.absolute_path)
        value = error.instance
        if error.validator == "required" and isinstance(value, dict):
            causes += [errors.required(f"{path}.{name}") for name in error.validator_value if name not in value]
        elif error.validator == "additionalProperties" and isinstance(value, dict):
            declared = (error.schema.get("properties") or {}) if isinstance(error.schema, dict) else {}
            causes += [errors.forbidden(f"{path}.{name}", "not allowed by the runtime's parameter schema")
                       for name in value if name not in declared]
        elif error.validator == "enum" and isinstance(error.validator_value, list):
            causes.append(errors.not_supported(path, value, [str(v) for v in error.validator_value]))
        else:
            causes.append(errors.invalid_value(path, value, error.message))
    return causes


def _json_schema(schema: dict[str, Any], path: str) -> list[Cause]:
    try:
        Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        where = _json_path(path, exc.absolute_path)
        return [errors.invalid_value(where, exc.instance, f"not a valid JSON Schema (Draft 2020-12): {exc.message}")]
    return []


def _status() -> Obj:
    return Obj(description="TrainingRuntimeStatus is written by the TrainingRuntime controller.", fields={
        "conditions": List(description="Conditions include Verified (SignatureVerified for managed runtimes).",
                           items=CONDITIONS.items),
        "imageDigest": Str(description="ImageDigest is the verified image digest."),
        "imageUser": Str(description="ImageUser is the user the verified image’s config runs its process as (root "
                                     "when it names none)."),
        "managed": Bool(description="Managed is true for catalog runtimes in project nodus; it is derived, never set "
                                    "by a client."),
        "observedGeneration": Int(description="ObservedGeneration is the generation the status describes."),
        "phase": Str(description="Phase is Pending until the image digest is verified, then Ready, or Failed."),
    })


TRAINING_RUNTIME_SPEC = Obj(
    description="TrainingRuntimeSpec is the contract a TrainingJob compiles against.",
    required=("image", "task"),
    fields={
        "checkpointing": Obj(description="RuntimeCheckpointing configures recovery state.", materialize=True, fields={
            "path": Str(description="Path is the state directory (default /nodus/state).", default="/nodus/state",
                        checks=(_absolute,)),
            "strategy": Str(description="Strategy is HFTrainer (default) or Custom.", enum=("HFTrainer", "Custom"),
                            default="HFTrainer"),
        }),
        "command": strings("Command is the trainer entrypoint."),
        "defaults": Obj(description="RuntimeDefaults apply when a TrainingJob leaves the field unset.", fields={
            "initCommand": INIT_COMMAND,
            "parameters": Free(description="Parameters are merged under the TrainingJob’s parameters.",
                               max_bytes=PARAMETERS_MAX_BYTES),
            "resources": RESOURCES,
            "sidecars": List(description="Sidecars start before the trainer (for example a vLLM rollout server) and "
                                         "stop after it.", items=SIDECARS.items, unique_key="name"),
        }),
        "environmentTasks": Str(description="EnvironmentTasks is AttemptAPI when this exact image fetches public "
                                            "manifests through the live attempt. Empty means the runtime is "
                                            "incompatible with GPU-host environment execution.",
                                enum=("AttemptAPI", "")),
        "estimate": Obj(description="RuntimeEstimate is measured by the nightly runs. Keys are accelerator classes "
                                    "such as h100-80g or rtx-4090.", fields={
            "secondsPerStep": Map(description="SecondsPerStep is used by training runtimes: expected duration is "
                                              "steps × seconds per step, scaled by how much more batchSize, "
                                              "gradientAccumulation and maxCompletionLength a TrainingJob sets than "
                                              "the defaults.", values=Int(minimum=0)),
            "secondsPerTask": Map(description="SecondsPerTask is used by evaluation runtimes: expected duration is "
                                              "tasks × seconds per task.", values=Int(minimum=0)),
        }),
        "image": Str(description="Image is the digest-pinned trainer image; managed runtimes are cosign-verified at "
                                 "release and seed.", min_length=1),
        "launcher": Str(description="Launcher is Plain (default), Torchrun, Accelerate or Deepspeed. Multi-node runs "
                                    "use it as the gang launcher.",
                        enum=("Plain", "Torchrun", "Accelerate", "Deepspeed"), default="Plain"),
        "modes": List(description="Modes lists Train (default) and Evaluate.", items=Str(enum=MODES), min_items=1,
                      unique=True, default=["Train"]),
        "outputs": List(description="Outputs are the downloadable results the runtime writes.", unique_key="name",
                        items=Obj(description="RuntimeOutput is one downloadable result.", required=("name", "path"),
                                  fields={"name": Str(description="Name is the output name.",
                                                      pattern=r"^[a-z0-9._-]{1,64}$"),
                                          "path": Str(description="Path is where the trainer writes it.",
                                                      checks=(_absolute,))})),
        "parameters": Free(description="Parameters is the JSON Schema of spec.parameters on a TrainingJob (at most "
                                       "64 KiB).", max_bytes=PARAMETERS_MAX_BYTES, checks=(_json_schema,)),
        "presets": List(description="Presets choose resources for a model, method and quantization.", items=Obj(
            description="RuntimePreset is the resources measured for one model, method and quantization.",
            required=("model", "method"),
            fields={"method": Str(description="Method is Full, LoRA or QLoRA.", enum=("Full", "LoRA", "QLoRA")),
                    "model": Str(description="Model is a Hugging Face repository, for example Qwen/Qwen3-0.6B."),
                    "quantization": Str(description="Quantization is empty or a scheme such as nf4."),
                    "resources": RESOURCES})),
        "requires": Obj(description="RuntimeRequirements say which inputs a TrainingJob must set.", materialize=True,
                        fields={"data": Bool(description="Data requires spec.data."),
                                "environment": Bool(description="Environment requires spec.environment."),
                                "model": Bool(description="Model requires spec.model (default true).", default=True),
                                "teacher": Bool(description="Teacher requires spec.teacher.")}),
        "task": Str(description="Task is what the runtime trains: SFT, Pretrain, DPO, ORPO, KTO, Reward, GRPO, Distill, "
                                "Evaluate or Custom.", enum=TASKS),
    },
)


def fold_body(body: dict[str, Any]) -> list[Cause]:
    """resources.nodes = 1 is dropped and GPU shorthands expanded; a runtime has no distributed to fold into."""
    spec = body.get("spec")
    if not isinstance(spec, dict):
        return []
    causes: list[Cause] = []
    defaults = spec.get("defaults")
    if isinstance(defaults, dict):
        causes += fold_resources(defaults, "spec.defaults", has_distributed=False)
    presets = spec.get("presets")
    if isinstance(presets, list):
        for i, preset in enumerate(presets):
            if isinstance(preset, dict):
                causes += fold_resources(preset, f"spec.presets[{i}]", has_distributed=False)
    return causes


def body_rules(body: dict[str, Any], limits: AdmissionLimits) -> list[Cause]:
    spec = body.get("spec")
    if not isinstance(spec, dict):
        return []
    schema, defaults = spec.get("parameters"), get(spec, "defaults.parameters")
    if isinstance(schema, dict) and isinstance(defaults, dict) and not _json_schema(schema, "spec.parameters"):
        return json_schema_causes(schema, defaults, "spec.defaults.parameters")
    return []


TRAINING_RUNTIME = KindSchema(
    kind="TrainingRuntime",
    description="TrainingRuntime is a signed trainer image plus the contract TrainingJobs compile against: the "
                "launcher, the parameter JSON Schema, the defaults, the resource presets and the measured step "
                "times (Beta).",
    body=Obj(fields={"spec": TRAINING_RUNTIME_SPEC}, required=("spec",)),
    status=_status(),
    rules=body_rules,
    fold=fold_body,
    mutable=("spec",),
)

__all__ = ["TRAINING_RUNTIME", "TRAINING_RUNTIME_SPEC", "TASKS", "MODES", "json_schema_causes",
           "PARAMETERS_MAX_BYTES"]

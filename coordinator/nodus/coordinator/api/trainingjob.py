"""TrainingJob (nodus.dev/v1beta1): one training run on a TrainingRuntime, compiled to one Job.

Admission looks the runtime up (a bare name in the job's project, `nodus/NAME` in the catalog
project `nodus`), checks the mode and the runtime's requirements, and validates the parameters
merged over the runtime's defaults against its JSON Schema.
"""
from __future__ import annotations

import copy
from typing import Any

from .. import errors
from ..errors import Cause
from .job import DISTRIBUTED, JOB_SPEC, PLACEMENT, RESOURCES, STATES, distributed_rules, fold_resources, not_found
from .job_status import CONDITIONS, COST, ESTIMATE
from .limits import AdmissionLimits
from .schema import Bool, Free, Int, KindSchema, List, Map, Obj, Resolution, Str, duration, money
from .trainingruntime import MODES, PARAMETERS_MAX_BYTES, TASKS, json_schema_causes

CATALOG_PROJECT = "nodus"
_RUNTIME_REF = r"^(nodus/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_COLUMN_ROLES = ("prompt", "completion", "chosen", "rejected", "text")


def _model_source(description: str) -> Obj:
    return Obj(description=description, one_of=(("uri", "volume"),), fields={
        "secret": Str(description="Secret names a Secret with HF_TOKEN for gated models."),
        "uri": Str(description="URI is hf://<owner>/<repository>.", pattern=r"^hf://\S+$",
                   pattern_message="must be an hf:// URI"),
        "volume": Obj(description="ModelVolume names a Volume revision.", required=("name",), fields={
            "name": Str(description="Name is the Volume."),
            "revision": Int(description="Revision pins a revision (latest Ready at admission when unset).",
                            minimum=0)}),
    })


TRAINING_JOB_SPEC = Obj(
    description="TrainingJobSpec describes one training run.",
    required=("runtime",),
    fields={
        "data": Obj(description="TrainingData is a dataset in a Volume.", required=("volume",), fields={
            "columns": Map(description="Columns maps the runtime’s column roles (prompt, completion, chosen, rejected, "
                                       "text) to dataset columns.", values=Str(), key_enum=_COLUMN_ROLES),
            "format": Str(description="Format is Auto (default), JSONL, JSON or CSV.",
                          enum=("Auto", "JSONL", "JSON", "CSV"), default="Auto"),
            "path": Str(description="Path is a file or directory inside the Volume."),
            "revision": Int(description="Revision pins a revision.", minimum=0),
            "validationFraction": Str(description="ValidationFraction is the share held out for validation, as a "
                                                  "decimal string (default “0.05”).", format="decimal",
                                      minimum="0", maximum="1", exclusive_maximum=True, default="0.05"),
            "volume": Str(description="Volume is the Volume holding the data."),
        }),
        "distributed": DISTRIBUTED,
        "environment": Obj(description="EnvironmentBinding selects an Environment and its task counts.",
                           required=("name",), fields={
                               "heldOutTasks": Int(description="HeldOutTasks is the number of held-out tasks evaluated "
                                                               "before and after training.", minimum=0),
                               "name": Str(description="Name is nodus/<environment>, a catalog Environment."),
                               "seed": Int(description="Seed selects the tasks deterministically (default 0).",
                                           minimum=0, default=0),
                               "trainTasks": Int(description="TrainTasks is the number of training tasks.", minimum=0),
                           }),
        "evaluation": Obj(description="Evaluation controls the baseline and final evaluation.", materialize=True,
                          fields={
                              "baseline": Bool(description="Baseline evaluates the model before training (default "
                                                           "true).", default=True),
                              "final": Bool(description="Final evaluates the model after training (default true).",
                                            default=True),
                              "minComparisonTasks": Int(description="MinComparisonTasks is the smallest held-out set a "
                                                                    "comparison is reported on (default and minimum "
                                                                    "16).", minimum=16, default=16),
                          }),
        "expectedDuration": duration("ExpectedDuration overrides the runtime estimate of steps × seconds per step.",
                                     positive=True),
        "exportTo": Obj(description="ExportTarget is a Volume the outputs are also written to.", required=("volume",),
                        fields={"volume": Str(description="Volume is the Volume.")}),
        "grading": Obj(description="GradingPolicy bounds grading.", materialize=True, fields={
            "maxParallel": Int(description="MaxParallel is the most grading Sandboxes at once (default 4, at most 32).",
                               minimum=1, maximum=32, default=4)}),
        "maxCostUSD": money("MaxCostUSD caps the run, its compiled Job and its grading Sandboxes together; it can only "
                            "be raised."),
        "mode": Str(description="Mode is Train (default) or Evaluate, and must be one of the runtime’s modes.",
                    enum=MODES, default="Train"),
        "model": _model_source("ModelSource is exactly one of uri and volume."),
        "parameters": Free(description="Parameters are validated against the runtime’s JSON Schema (at most 64 KiB) "
                                       "over the runtime defaults.", max_bytes=PARAMETERS_MAX_BYTES),
        "placement": PLACEMENT,
        "resources": RESOURCES,
        "runtime": Str(description="Runtime is a Ready TrainingRuntime: nodus/<name> from the catalog, or the name of "
                                   "one in the project.", pattern=_RUNTIME_REF,
                       pattern_message="must be a TrainingRuntime name, or nodus/<name> for a catalog runtime"),
        "state": Str(description="State is the desired state: Running (default), Suspended, or Cancelled, the "
                                 "terminal stop state.", enum=STATES, default="Running"),
        "task": Str(description="Task overrides the runtime’s task; Pretrain on sft trains on raw text with packing.",
                    enum=TASKS),
        "teacher": _model_source("ModelSource is exactly one of uri and volume."),
        "tracking": Obj(description="Tracking names customer-owned trackers; they are never the source of truth for "
                                    "comparisons.", fields={
            "mlflow": Obj(description="MLflowTracking is an MLflow server.", required=("uri",), fields={
                "experiment": Str(description="Experiment is the experiment name."),
                "secret": Str(description="Secret holds MLFLOW_TRACKING_TOKEN or username and password."),
                "uri": Str(description="URI is the tracking server (https://).", pattern=r"^https://\S+$",
                           pattern_message="must be an https:// URL"),
            }),
            "wandb": Obj(description="WandBTracking is a Weights & Biases project.", required=("connection",),
                         fields={"connection": Str(description="Connection is a WandB Connection.")}),
        }),
    },
)


def _phase_summary() -> Obj:
    return Obj(description="PhaseSummary counts one phase’s latest report per task attempt.", fields={
        "errors": Int(description="Errors counts attempts that ended in an infrastructure or grading error; they never "
                                  "count as failed."),
        "inProgress": Int(description="InProgress counts started attempts with no completion yet."),
        "meanReward": Str(description="MeanReward is the mean finite reward, as a decimal string."),
        "passRate": Str(description="PassRate is passed divided by tasks, as a decimal string."),
        "passed": Int(description="Passed is how many passed."),
        "tasks": Int(description="Tasks is the number of completed, scored task attempts."),
    })


def _status() -> Obj:
    s = lambda d="": Str(description=d)  # noqa: E731 - a local shorthand for the long status tree
    i = lambda d="": Int(description=d)  # noqa: E731
    b = lambda d="": Bool(description=d)  # noqa: E731
    return Obj(description="TrainingJobStatus is written by the TrainingJob controller.", fields={
        "compiledJob": JOB_SPEC,
        "conditions": CONDITIONS,
        "cost": COST,
        "diagnostics": Obj(description="TrainingDiagnostics interpret training.", fields={
            "rewardSignal": s("RewardSignal is ContrastObserved, NoRewardContrast or InsufficientEvidence."),
            "weightsChanged": b("WeightsChanged reports whether the trainer reported changed weights.")}),
        "estimate": ESTIMATE,
        "job": s("Job is the compiled Job’s name (label nodus.dev/trainingjob)."),
        "message": s("Message explains Reason."),
        "metrics": Obj(description="TrainingMetrics are the latest metrics the trainer reported.", fields={
            "gpuMemoryBytes": i("GPUMemoryBytes is the peak GPU memory."),
            "loss": s("Loss is the latest training loss, as a decimal string."),
            "step": i("Step is the current optimizer step."),
            "tokensPerSecond": s("TokensPerSecond is the latest throughput, as a decimal string."),
            "totalSteps": i("TotalSteps is the planned number of steps.")}),
        "observedGeneration": i("ObservedGeneration is the generation the status describes."),
        "outputs": List(description="Outputs are the committed results, such as results.json and the adapter.",
                        items=Obj(description="TrainingOutput is one committed result of the compiled Job.", fields={
                            "name": s("Name is the output name."),
                            "sizeBytes": i("SizeBytes is the committed size.")})),
        "phase": s("Phase mirrors the compiled Job in the run-to-completion vocabulary."),
        "progress": Obj(description="TrainingProgress is the current stage.", fields={
            "stage": s("Stage is Baseline, Training, Evaluating or Exporting.")}),
        "provenance": Obj(description="Provenance identifies exactly what ran.", fields={
            "environmentDigest": s("EnvironmentDigest is the environment image digest."),
            "managed": b("Managed is true when a catalog runtime ran without image or command overrides."),
            "modelRevision": s("ModelRevision is the pinned model revision."),
            "parametersSHA256": s("ParametersSHA256 hashes the canonical merged parameters."),
            "runtimeDigest": s("RuntimeDigest is the runtime image digest.")}),
        "reason": s("Reason says why the run failed, stopped or is suspended."),
        "summary": Obj(description="TrainingSummary is folded incrementally from task events.", fields={
            "baseline": _phase_summary(),
            "comparison": Obj(description="Comparison is the comparability gate: like-for-like tasks, at least "
                                          "minComparisonTasks, not all 0 % or all 100 %, and no missing events.", fields={
                "changePP": s("ChangePP is the pass-rate change in percentage points, as a decimal string."),
                "comparable": b("Comparable is true when baseline and evaluation scored the same tasks and no events "
                                "are missing."),
                "measurable": b("Measurable is true when the tasks can show a change (comparable and not all failed or "
                                "all passed)."),
                "note": s("Note explains Reason in one sentence."),
                "reason": s("Reason is Comparable, SmallestStep, TooFewTasks, DifferentTasks, NonePassed, AllPassed or "
                            "IncompleteEvents."),
                "resolutionPP": s("ResolutionPP is the smallest change the task set can show (100 / tasks), as a "
                                  "decimal string.")}),
            "evaluation": _phase_summary()}),
    })


def fold_body(body: dict[str, Any]) -> list[Cause]:
    spec = body.get("spec")
    return fold_resources(spec, "spec") if isinstance(spec, dict) else []


def body_rules(body: dict[str, Any], limits: AdmissionLimits) -> list[Cause]:
    spec = body.get("spec")
    return distributed_rules(spec, "spec", limits) if isinstance(spec, dict) else []


def runtime_location(ref: str, project: str) -> tuple[str, str]:
    """(project, name) of a runtime reference: `nodus/NAME` is the catalog, a bare name the job's project."""
    if ref.startswith(CATALOG_PROJECT + "/"):
        return CATALOG_PROJECT, ref[len(CATALOG_PROJECT) + 1:]
    return project, ref


def merge_parameters(defaults: Any, overrides: Any) -> Any:
    """The job's parameters over the runtime's defaults, objects merged key by key (as a JSON merge patch)."""
    if isinstance(defaults, dict) and isinstance(overrides, dict):
        out = copy.deepcopy(defaults)
        for key, value in overrides.items():
            out[key] = merge_parameters(defaults.get(key), value)
        return out
    return copy.deepcopy(overrides)


async def _resolve(body: dict[str, Any], lookup: Any, project: str) -> Resolution:
    out = Resolution()
    spec = body.get("spec")
    if not isinstance(spec, dict):
        return out
    for path in ("model.secret", "teacher.secret", "tracking.mlflow.secret"):
        holder, key = path.rsplit(".", 1)
        node: Any = spec
        for part in holder.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        name = node.get(key) if isinstance(node, dict) else None
        if isinstance(name, str) and await lookup.get("secrets", project, name) is None:
            out.causes.append(not_found(f"spec.{path}", name))
    ref = spec.get("runtime")
    if not isinstance(ref, str):
        return out
    where, name = runtime_location(ref, project)
    runtime = await lookup.get("trainingruntimes", where, name)
    if runtime is None:
        out.causes.append(not_found("spec.runtime", ref))
        return out
    # Until the runtime controller exists, a runtime that exists was admitted and counts as Ready;
    # only one its controller marked Failed is refused.
    phase = (runtime.get("status") or {}).get("phase")
    if phase == "Failed":
        out.causes.append(errors.invalid_value("spec.runtime", ref, "the TrainingRuntime is not Ready (phase Failed)"))
    rspec = runtime.get("spec") or {}
    modes = rspec.get("modes") or ["Train"]
    mode = spec.get("mode", "Train")
    if mode not in modes:
        out.causes.append(errors.not_supported("spec.mode", mode, modes))
    requires = rspec.get("requires") or {}
    for field, default in (("model", True), ("data", False), ("environment", False), ("teacher", False)):
        if requires.get(field, default) and field not in spec:
            out.causes.append(errors.required(f"spec.{field}", f'the TrainingRuntime "{ref}" requires it'))
    schema = rspec.get("parameters")
    if isinstance(schema, dict):
        merged = merge_parameters((rspec.get("defaults") or {}).get("parameters") or {}, spec.get("parameters") or {})
        out.causes += json_schema_causes(schema, merged, "spec.parameters")
    return out


TRAINING_JOB = KindSchema(
    kind="TrainingJob",
    description="TrainingJob is pre-training, fine-tuning, post-training or an RL run on a TrainingRuntime (Beta). It "
                "compiles to one Job, a multi-node gang when it asks for more than one node, and mirrors that Job’s "
                "phase.",
    body=Obj(fields={"spec": TRAINING_JOB_SPEC}, required=("spec",)),
    status=_status(),
    rules=body_rules,
    fold=fold_body,
    resolve=_resolve,
    # The seed names only maxCostUSD (raise only) and, as for every kind, the desired state as changeable.
    mutable=("spec.maxCostUSD", "spec.state"),
    raise_only=("spec.maxCostUSD",),
)

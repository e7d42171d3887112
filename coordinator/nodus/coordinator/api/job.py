"""Job (nodus.dev/v1): the spec tree, the sub-schemas other kinds share, and the Job's own rules.

Sweep's template.spec is JOB_SPEC itself, and TrainingJob/TrainingRuntime reuse RESOURCES,
PLACEMENT, DISTRIBUTED, INIT_COMMAND and SIDECARS, so a rule written here holds everywhere.
Descriptions are the spec pages' text (spec/job.md, rebuilt from the seed documents). The aliases
folded before decoding are in job_folding.py, the checks of referenced Secrets and Volumes in
references.py; the names other kinds use are re-exported here.
"""
from __future__ import annotations

from typing import Any

from .. import errors
from ..errors import Cause
from .schema import (Bool, Int, KindSchema, List, Obj, Str, duration, money,
                     quantity, strings)
from .job_folding import complete_spec, fold_gpu, fold_resources, fold_spec
from .job_status import JOB_STATUS
from .limits import GANG_NODES, AdmissionLimits
from .job_rules import distributed_rules, input_rules, spec_rules
from .references import not_found, resolve_references, resolve_secrets, resolve_volumes, secret_version

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_LABEL_MESSAGE = ("must be a lowercase RFC 1123 label: lowercase letters, digits and '-', starting "
                     "and ending with a letter or digit (at most 63 characters)")
SHA256_HEX = r"^[0-9a-fA-F]{64}$"
SYSTEM_PATHS = ("/", "/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/usr", "/lib", "/lib64", "/boot",
                "/run", "/var/run", "/nodus")
"""Mount points a Volume may not cover: the root, the OS, and Nodus's own /nodus tree."""
GPU_COUNTS = (1, 2, 4, 8)
STATES = ("Running", "Suspended", "Cancelled")
"""`Cancelled` is the "cancel state" of the spec pages: it stops the object for good."""


def _absolute(value: str, path: str) -> list[Cause]:
    return [] if value.startswith("/") else [errors.invalid_value(path, value, "must be an absolute path")]


def _absolute_each(values: list[str], path: str) -> list[Cause]:
    return [c for i, v in enumerate(values) for c in _absolute(v, f"{path}[{i}]")]


def _beta_nodes(value: int, path: str, limits: AdmissionLimits) -> list[Cause]:
    # Above the API's range the field's own range reports it; between the cap and there, the operator's cap.
    if limits.gang_max_nodes < value <= GANG_NODES[1]:
        return [errors.invalid_value(path, value, f"must be at most {limits.gang_max_nodes} during the beta")]
    return []


def _not_system_path(value: str, path: str) -> list[Cause]:
    if not value.startswith("/"):
        return [errors.invalid_value(path, value, "must be an absolute path")]
    norm = "/" + "/".join(p for p in value.split("/") if p and p != ".")
    for sys_path in SYSTEM_PATHS:
        if norm == sys_path or (sys_path != "/" and norm.startswith(sys_path + "/")):
            return [errors.invalid_value(path, value, f"must not be a system path ({sys_path})")]
    if ".." in value.split("/"):
        return [errors.invalid_value(path, value, "must not contain '..'")]
    return []


def _volume_mount(mount: dict[str, Any], path: str) -> list[Cause]:
    if "revision" in mount and not mount.get("readOnly"):
        return [errors.forbidden(f"{path}.revision", "a revision may be pinned only with readOnly: true")]
    return []


def _sidecar(sidecar: dict[str, Any], path: str) -> list[Cause]:
    if not sidecar.get("command") and not sidecar.get("image"):
        return [errors.required(f"{path}.command", "a sidecar without its own image needs a command")]
    return []


def _output_name(name: str, path: str) -> list[Cause]:
    if name.startswith("nodus."):
        return [errors.invalid_value(path, name, 'the "nodus." prefix is reserved')]
    if name == "outputs":
        return [errors.invalid_value(path, name, 'the name "outputs" is reserved for /nodus/outputs')]
    return []


# -- shared sub-schemas ------------------------------------------------------------------------------

GPU = Obj(
    description="GPURequest asks for accelerators. A family (H100) matches any of its variants and never another family.",
    fields={
        "count": Int(description="Count is the GPUs per node: 1, 2, 4 or 8.", enum=GPU_COUNTS),
        "exact": Bool(description="Exact pins the exact variant instead of matching the family."),
        "interconnect": Str(description="Interconnect is Any or NVLink.", enum=("Any", "NVLink"), default="Any"),
        "minMemory": quantity("MinMemory is the per-GPU memory floor."),
        "type": strings("Type lists 1–8 accelerator ids or families from the catalog.", min_items=1,
                        max_items=8, unique=True),
    },
)

RESOURCES = Obj(
    description="Resources are capacity floors. For GPU work the offering’s host shape applies if larger.",
    fields={
        "cpu": quantity("CPU is the vCPU floor."),
        "disk": quantity("Disk is the ephemeral disk floor."),
        "gpu": GPU,
        "memory": quantity("Memory is the host memory floor."),
        "nodes": Int(description="Nodes above 1 is shorthand for spec.distributed.nodes and is stored in that form.",
                     minimum=1),
    },
)

PLACEMENT = Obj(
    description="Placement constrains where work may run.",
    materialize=True,
    fields={
        "dedicated": Bool(description="Dedicated is reserved; only true is accepted.", enum=(True,),
                          enum_message="only true is accepted (dedicated is reserved)"),
        "interruptible": Str(description="Interruptible is Never, Allow (the scheduler decides by expected cost) or Prefer.",
                             enum=("Never", "Allow", "Prefer"), default="Never"),
        "maxRateUSDPerHour": money("MaxRateUSDPerHour filters out offerings above this customer rate."),
        "offerings": strings("Offerings restricts placement to these Offerings.", unique=True),
        "pool": Str(description="Pool is a BYOC Pool in the project."),
        "profile": Str(description="Profile is Balanced, Cost or Speed.", enum=("Balanced", "Cost", "Speed"),
                       default="Balanced"),
        "queueTimeout": duration("QueueTimeout is how long the Job may wait for capacity before failing with "
                                 "CapacityUnavailable (default 24h; 0s waits forever).", default="24h0m0s"),
        "regions": strings("Regions are region classes (us, eu, …); empty means any.", unique=True),
    },
)

DISTRIBUTED = Obj(
    description="Distributed runs the Job as a gang of nodes that start together and restart together (Beta).",
    one_of=(("nodes", "totalGPUs"),),
    fields={
        "gpusPerNode": Int(description="GPUsPerNode is 1, 2, 4 or 8 and equals resources.gpu.count when both are set.",
                           enum=GPU_COUNTS),
        "launcher": Str(description="Launcher is Plain (env contract only), Torchrun, Ray, Verl, Accelerate or Deepspeed.",
                        enum=("Plain", "Torchrun", "Ray", "Verl", "Accelerate", "Deepspeed"), default="Plain"),
        "maxAssemblyRetries": Int(description="MaxAssemblyRetries is how many times a timed-out assembly is re-placed "
                                              "(0–5, default 2).", minimum=0, maximum=5, default=2),
        # launcher, network and transport defaults are not on the spec page: Plain needs nothing of the
        # program, Regional is the middle locality, and Auto lets a gang form over relayed paths.
        "network": Str(description="Network is Colocated (one provider and region), Regional (one region class) or Global.",
                       enum=("Colocated", "Regional", "Global"), default="Regional"),
        "nodes": Int(description="Nodes is the gang size (2–16; the beta caps it at 8). Exactly one of nodes and totalGPUs.",
                     minimum=GANG_NODES[0], maximum=GANG_NODES[1], limit_checks=(_beta_nodes,)),
        "startupTimeout": duration("StartupTimeout is the gang assembly budget (5m–60m, default 15m).",
                                   minimum="5m", maximum="60m", default="15m0s"),
        "totalGPUs": Int(description="TotalGPUs is resolved into status.topology at admission (2–64).",
                         minimum=2, maximum=64),
        "transport": Str(description="Transport is Direct (private or direct paths only) or Auto (relayed paths allowed).",
                         enum=("Direct", "Auto"), default="Auto"),
    },
)

ENV_VAR = Obj(
    description="EnvVar is one environment variable: a literal value or a Secret key.",
    required=("name",),
    one_of=(("value", "valueFrom"),),
    fields={
        "name": Str(description="Name matches ^[A-Za-z_][A-Za-z0-9_]*$.", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$"),
        "value": Str(description="Value is the literal value."),
        "valueFrom": Obj(
            description="EnvVarSource names where an env value comes from.",
            required=("secretKeyRef",),
            fields={"secretKeyRef": Obj(
                description="SecretKeySelector selects one key of a Secret.",
                required=("name", "key"),
                fields={"key": Str(description="Key is the key within it.", pattern=r"^[-._a-zA-Z0-9]+$"),
                        "name": Str(description="Name is the Secret.", pattern=DNS_LABEL,
                                    pattern_message=DNS_LABEL_MESSAGE)},
            )},
        ),
    },
)


def env_list(description: str) -> List:
    return List(description=description, items=ENV_VAR, unique_key="name")


INIT_COMMAND = Obj(
    description="InitCommand is a preflight run before the command.",
    required=("command",),
    fields={"command": strings("Command is the argv.", min_items=1),
            "timeout": duration("Timeout is at most 30m.", positive=True, maximum="30m")},
)

SIDECARS = List(
    description="Sidecar is a helper container with native-sidecar semantics.",
    unique_key="name",
    items=Obj(
        description="Sidecar is a helper container with native-sidecar semantics.",
        required=("name",),
        checks=(_sidecar,),
        fields={
            "command": strings("Command is the sidecar’s argv."),
            "env": env_list("Env adds environment variables."),
            "image": Str(description="Image defaults to the Job’s image."),
            "name": Str(description="Name is unique within the Job.", pattern=DNS_LABEL,
                        pattern_message=DNS_LABEL_MESSAGE),
            "startupTimeout": duration("StartupTimeout bounds how long the sidecar may take to become ready.",
                                       positive=True),
        },
    ),
)

_INPUT = Obj(
    description="JobInput is one input: exactly one of volume, output, bucket, url, fromWorkspace and fromStage. "
                "It is mounted at /nodus/inputs/<name>.",
    required=("name",),
    one_of=(("volume", "output", "bucket", "url", "fromWorkspace", "fromStage"),),
    fields={
        "bucket": Obj(description="BucketInput is an object in customer storage.", required=("uri",), fields={
            "connection": Str(description="Connection is an S3 Connection that can read it."),
            "sha256": Str(description="SHA256 is checked at end of stream when set.", pattern=SHA256_HEX,
                          pattern_message="must be 64 hexadecimal digits"),
            "uri": Str(description="URI is s3://bucket/key.", pattern=r"^s3://[^/]+/.+",
                       pattern_message="must be s3://bucket/key"),
        }),
        "fromStage": Obj(description="StageInput names an output of a Pipeline stage.", required=("stage", "output"),
                         fields={"output": Str(description="Output is the output name."),
                                 "stage": Str(description="Stage is the producing stage.")}),
        "fromWorkspace": Obj(description="WorkspaceInput mounts a Workspace home.", required=("name",),
                             fields={"name": Str(description="Name is the Workspace."),
                                     "path": Str(description="Path is a subdirectory of the home.")}),
        "name": Str(description="Name matches ^[A-Za-z][A-Za-z0-9_]{0,63}$ and is unique among inputs.",
                    pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$"),
        "output": Obj(description="OutputInput names a committed output of another Job.", required=("job", "name"),
                      fields={"index": Int(description="Index selects an index of an Indexed Job (default 0).",
                                           minimum=0, default=0),
                              "job": Str(description="Job is the producing Job."),
                              "name": Str(description="Name is the output.")}),
        "url": Obj(description="URLInput is a file downloaded over HTTPS.", required=("url",), fields={
            "sha256": Str(description="SHA256 is the expected digest.", pattern=SHA256_HEX,
                          pattern_message="must be 64 hexadecimal digits"),
            "url": Str(description="URL is https:// only.", pattern=r"^https://[^\s/]+", pattern_message="must be an https:// URL"),
        }),
        "volume": Obj(description="VolumeInput names a Volume revision.", required=("name",),
                      fields={"name": Str(description="Name is the Volume."),
                              "revision": Int(description="Revision pins a revision.", minimum=0)}),
    },
)

_OUTPUT = Obj(
    description="JobOutput is a declared output.",
    required=("name", "path"),
    fields={
        "fromRanks": Str(description="FromRanks is Zero (rank 0 only) or All (every rank under rank-<n>/).",
                         enum=("Zero", "All"), default="Zero"),
        "name": Str(description="Name matches ^[a-z0-9._-]{1,64}$; the nodus. prefix is reserved.",
                    pattern=r"^[a-z0-9._-]{1,64}$", checks=(_output_name,)),
        "path": Str(description="Path is an absolute file or directory path; directories are archived as tar.zst.",
                    checks=(_absolute,)),
        "sink": Obj(description="OutputSink loads an output into a customer database table.",
                    required=("connection", "table"), fields={
                        "connection": Str(description="Connection is a Postgres, Neon or Supabase Connection."),
                        "mode": Str(description="Mode is Append (default) or Replace.", enum=("Append", "Replace"),
                                    default="Append"),
                        "table": Str(description="Table is the destination table."),
                    }),
    },
)

RECOVERY = Obj(
    description="Recovery says how progress survives lost capacity.",
    materialize=True,
    fields={
        "checkpoint": Obj(description="CheckpointPolicy configures checkpoints.", materialize=True, fields={
            # format has no static default: it is Dcp for distributed Jobs (see complete_spec).
            "format": Str(description="Format is Snapshot, or Dcp for torch.distributed.checkpoint (the default "
                                      "for distributed Jobs).", enum=("Snapshot", "Dcp")),
            "integration": Str(description="Integration is Auto, None or HFTrainer.",
                               enum=("Auto", "None", "HFTrainer"), default="Auto"),
            "interval": duration("Interval is auto or a duration from 1m to 6h.", minimum="1m", maximum="6h",
                                 literals=("auto",), default="auto"),
            "maxSize": quantity("MaxSize is checked before upload (default 1Ti, at most 2Ti).", maximum="2Ti",
                                positive=True, default="1Ti"),
            "paths": List(description="Paths are saved together in one checkpoint (at most 64; default /nodus/state).",
                          items=Str(checks=(_absolute,)), min_items=1, max_items=64, unique=True,
                          default=["/nodus/state"]),
            "retainAfterFinish": duration("RetainAfterFinish keeps checkpoints this long after the Job finishes "
                                          "(default 168h).", default="168h0m0s"),
        }),
        "continuity": Str(description="Continuity is Checkpointed (restore the latest checkpoint), Restartable "
                                      "(progress cursor) or Ephemeral.",
                          enum=("Checkpointed", "Restartable", "Ephemeral"), default="Checkpointed"),
        "maxAttempts": Int(description="MaxAttempts is how many infrastructure replacements each index may use "
                                       "(1–32; gangs count restarts).", minimum=1, maximum=32, default=3),
        "minProgressDuration": duration("MinProgressDuration is the run time that counts as progress (default 2m).",
                                        default="2m0s"),
        "onInterruption": Str(description="OnInterruption is Resume, or Fail to fail instead of recovering or suspending.",
                              enum=("Resume", "Fail"), default="Resume"),
    },
)

JOB_SPEC = Obj(
    description="JobSpec describes a Job. Everything is immutable after create except parallelism, backoffLimit, "
                "timeout, maxCostUSD (raise only), recovery.maxAttempts, recovery.checkpoint.interval and "
                "retainAfterFinish, ttlSecondsAfterFinished and state.",
    fields={
        "activeDeadlineSeconds": Int(description="ActiveDeadlineSeconds is accepted as an alias of timeout on write "
                                                 "and folded into it.", minimum=1),
        "args": strings("Args are appended to the command (or to the image's entrypoint)."),
        # The spec page gives only the range; 6 is Kubernetes' batch/v1 Job default.
        "backoffLimit": Int(description="BackoffLimit is how many customer failures (non-zero exits, OOM) across all "
                                        "indexes are retried before the Job fails (0–100).",
                            minimum=0, maximum=100, default=6),
        "command": strings("Command is the argv; without it the image's entrypoint runs."),
        "completeByTime": Str(description="CompleteByTime is a finish-by hint for placement and checkpoint cadence. "
                                          "It never stops the Job.", format="time"),
        "completions": Int(description="Completions is how many indexes must succeed (1–10000). Each index gets "
                                       "NODUS_INDEX and JOB_COMPLETION_INDEX.", minimum=1, maximum=10000, default=1),
        "connections": strings("Connections are the project Connections the Job may use.", unique=True),
        "distributed": DISTRIBUTED,
        "env": env_list("EnvVar is one environment variable: a literal value or a Secret key."),
        "expectedDuration": duration("ExpectedDuration is the declared runtime the estimate uses first.", positive=True),
        "image": Str(description="Image is the container image; a Job without one runs in the node's own environment.",
                     min_length=1),
        "imagePullSecrets": strings("ImagePullSecrets name Secrets holding registry credentials.", unique=True),
        "imageRef": Str(description="ImageRef names a project image by reference."),
        "initCommand": INIT_COMMAND,
        "inputs": List(description="Inputs are materialized read-only under /nodus/inputs/<name>.", items=_INPUT,
                       unique_key="name"),
        "maxCostUSD": money("MaxCostUSD caps what the Job may spend. Reaching it suspends the Job; it can only be raised."),
        "network": Obj(description="Network sets egress for the container.", fields={
            "egress": Obj(description="Egress is the outbound network policy.", fields={
                "allow": strings("Allow lists DNS names or *.suffix patterns (AllowList only; at most 128).",
                                 max_items=128, unique=True),
                "policy": Str(description="Policy is Deny, AllowList or Open.", enum=("Deny", "AllowList", "Open")),
                "presets": strings("Presets add curated host lists such as python-packages or huggingface.",
                                   unique=True),
            }),
        }),
        "outputs": List(description="Outputs are files or directories collected when an index succeeds (at most 32). "
                                    "Everything under /nodus/outputs is also collected as the output named “outputs”.",
                        items=_OUTPUT, max_items=32, unique_key="name"),
        # Unset parallelism runs one index at a time, as a Kubernetes Job does.
        "parallelism": Int(description="Parallelism is how many indexes run at once (1 to min(completions, 256)).",
                           minimum=1, maximum=256, default=1),
        "placement": PLACEMENT,
        "recovery": RECOVERY,
        "resources": RESOURCES,
        "scaledownWindow": duration("ScaledownWindow keeps the capacity warm for reuse this long after the Job ends "
                                    "(0s–20m).", maximum="20m"),
        "secrets": List(description="SecretMount mounts one Secret, optionally pinned to a version. The bare name is "
                                    "accepted on write.", unique_key="name", items=Obj(
            description="SecretMount mounts one Secret, optionally pinned to a version.",
            required=("name",),
            fields={"name": Str(description="Name is the Secret.", pattern=DNS_LABEL, pattern_message=DNS_LABEL_MESSAGE),
                    "version": Int(description="Version pins a version; unset pins the latest at admission.",
                                   minimum=1)})),
        "serviceAccountName": Str(description="ServiceAccountName is the project's ServiceAccount the workload runs as: "
                                              "each attempt gets a short-lived token of it in $NODUS_TOKEN_FILE.",
                                  pattern=DNS_LABEL, pattern_message=DNS_LABEL_MESSAGE, max_length=63),
        "sidecars": SIDECARS,
        "source": Obj(description="Source is the code for the container: exactly one of git and blob.",
                      one_of=(("git", "blob"),), fields={
                          "blob": Str(description="Blob is sha256:<hex digest> of an uploaded archive.",
                                      pattern=r"^sha256:[0-9a-f]{64}$",
                                      pattern_message="must be sha256: followed by 64 lowercase hexadecimal digits"),
                          "git": Obj(description="GitSource is a repository checkout.", required=("repo",), fields={
                              "path": Str(description="Path is the checkout path (default workingDir)."),
                              "ref": Str(description="Ref is a branch, tag or commit."),
                              "repo": Str(description="Repo is owner/name or an https:// URL.",
                                          pattern=r"^([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+|(https|git)://\S+)$",
                                          pattern_message="must be owner/name, an https:// or a git:// URL"),
                          }),
                      }),
        "state": Str(description="State is the desired state: Running (the default), Suspended, or Cancelled, the "
                                 "cancel state that stops the Job for good.", enum=STATES, default="Running"),
        "timeout": duration("Timeout is the wall-clock limit counted from the first Provisioning, excluding time "
                            "spent Suspended. The Job then fails with DeadlineExceeded.", positive=True),
        "ttlSecondsAfterFinished": Int(description="TTLSecondsAfterFinished deletes the Job, its outputs and "
                                                   "checkpoints this long after it finishes.", minimum=0),
        "volumes": List(description="VolumeMount mounts a Volume.", unique_key="mountPath", items=Obj(
            description="VolumeMount mounts a Volume.",
            required=("volume", "mountPath"),
            checks=(_volume_mount,),
            fields={"mountPath": Str(description="MountPath is the absolute mount point; system paths are refused.",
                                     checks=(_not_system_path,)),
                    "readOnly": Bool(description="ReadOnly mounts it read-only."),
                    "revision": Int(description="Revision pins a revision; only with readOnly.", minimum=0),
                    "volume": Str(description="Volume names the Volume.")})),
        "workingDir": Str(description="WorkingDir is the directory the command starts in.", checks=(_absolute,)),
    },
)

# -- cross-field rules -------------------------------------------------------------------------------

def body_rules(body: dict[str, Any], limits: AdmissionLimits) -> list[Cause]:
    spec = body.get("spec")
    return spec_rules(spec, limits) if isinstance(spec, dict) else []


def fold_body(body: dict[str, Any]) -> list[Cause]:
    return fold_spec(body.get("spec"))


def complete_body(body: dict[str, Any]) -> None:
    if isinstance(body.get("spec"), dict):
        complete_spec(body["spec"])


JOB = KindSchema(
    kind="Job",
    description="Job is a run-to-completion container with checkpoints, recovery from preemption, Indexed "
                "completions, multi-node gangs (Beta), a cost estimate before launch and exact prepaid billing. "
                "Every index runs as Attempts.",
    body=Obj(fields={"spec": JOB_SPEC}, required=("spec",)),
    status=JOB_STATUS,
    rules=body_rules,
    fold=fold_body,
    complete=complete_body,
    resolve=resolve_references,
    mutable=("spec.parallelism", "spec.backoffLimit", "spec.timeout", "spec.maxCostUSD", "spec.recovery.maxAttempts",
             "spec.recovery.checkpoint.interval", "spec.recovery.checkpoint.retainAfterFinish",
             "spec.ttlSecondsAfterFinished", "spec.state"),
    raise_only=("spec.maxCostUSD",),
)

__all__ = ["JOB", "JOB_SPEC", "GPU", "RESOURCES", "PLACEMENT", "DISTRIBUTED", "ENV_VAR", "INIT_COMMAND", "SIDECARS",
           "RECOVERY", "STATES", "DNS_LABEL", "DNS_LABEL_MESSAGE", "not_found",
           "fold_spec", "fold_resources", "fold_gpu", "complete_spec", "spec_rules", "resolve_secrets", "resolve_volumes",
           "secret_version", "env_list", "JOB_STATUS"]

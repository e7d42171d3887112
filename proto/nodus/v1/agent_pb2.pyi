import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from nodus.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GangStep(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GANG_STEP_UNSPECIFIED: _ClassVar[GangStep]
    GANG_STEP_ASSEMBLE: _ClassVar[GangStep]
    GANG_STEP_MESH: _ClassVar[GangStep]
    GANG_STEP_START: _ClassVar[GangStep]

class CheckpointFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINT_FORMAT_UNSPECIFIED: _ClassVar[CheckpointFormat]
    CHECKPOINT_FORMAT_SNAPSHOT: _ClassVar[CheckpointFormat]
    CHECKPOINT_FORMAT_DCP: _ClassVar[CheckpointFormat]

class CheckpointIntegration(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINT_INTEGRATION_UNSPECIFIED: _ClassVar[CheckpointIntegration]
    CHECKPOINT_INTEGRATION_AUTO: _ClassVar[CheckpointIntegration]
    CHECKPOINT_INTEGRATION_NONE: _ClassVar[CheckpointIntegration]
    CHECKPOINT_INTEGRATION_HF_TRAINER: _ClassVar[CheckpointIntegration]

class CheckpointReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINT_REASON_UNSPECIFIED: _ClassVar[CheckpointReason]
    CHECKPOINT_REASON_PERIODIC: _ClassVar[CheckpointReason]
    CHECKPOINT_REASON_SUSPEND: _ClassVar[CheckpointReason]
    CHECKPOINT_REASON_PREEMPTION: _ClassVar[CheckpointReason]
    CHECKPOINT_REASON_REQUESTED: _ClassVar[CheckpointReason]

class EgressPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EGRESS_POLICY_UNSPECIFIED: _ClassVar[EgressPolicy]
    EGRESS_POLICY_DENY: _ClassVar[EgressPolicy]
    EGRESS_POLICY_ALLOW_LIST: _ClassVar[EgressPolicy]
    EGRESS_POLICY_OPEN: _ClassVar[EgressPolicy]
GANG_STEP_UNSPECIFIED: GangStep
GANG_STEP_ASSEMBLE: GangStep
GANG_STEP_MESH: GangStep
GANG_STEP_START: GangStep
CHECKPOINT_FORMAT_UNSPECIFIED: CheckpointFormat
CHECKPOINT_FORMAT_SNAPSHOT: CheckpointFormat
CHECKPOINT_FORMAT_DCP: CheckpointFormat
CHECKPOINT_INTEGRATION_UNSPECIFIED: CheckpointIntegration
CHECKPOINT_INTEGRATION_AUTO: CheckpointIntegration
CHECKPOINT_INTEGRATION_NONE: CheckpointIntegration
CHECKPOINT_INTEGRATION_HF_TRAINER: CheckpointIntegration
CHECKPOINT_REASON_UNSPECIFIED: CheckpointReason
CHECKPOINT_REASON_PERIODIC: CheckpointReason
CHECKPOINT_REASON_SUSPEND: CheckpointReason
CHECKPOINT_REASON_PREEMPTION: CheckpointReason
CHECKPOINT_REASON_REQUESTED: CheckpointReason
EGRESS_POLICY_UNSPECIFIED: EgressPolicy
EGRESS_POLICY_DENY: EgressPolicy
EGRESS_POLICY_ALLOW_LIST: EgressPolicy
EGRESS_POLICY_OPEN: EgressPolicy

class EnrolRequest(_message.Message):
    __slots__ = ("node_name", "csr_pem")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    csr_pem: str
    def __init__(self, node_name: _Optional[str] = ..., csr_pem: _Optional[str] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("csr_pem",)
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    csr_pem: str
    def __init__(self, csr_pem: _Optional[str] = ...) -> None: ...

class EnrolResponse(_message.Message):
    __slots__ = ("node_name", "certificate_pem", "ca_pem", "expire_time", "agent_port")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    AGENT_PORT_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    certificate_pem: str
    ca_pem: str
    expire_time: _timestamp_pb2.Timestamp
    agent_port: int
    def __init__(self, node_name: _Optional[str] = ..., certificate_pem: _Optional[str] = ..., ca_pem: _Optional[str] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., agent_port: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("node_name", "inventory")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    inventory: _common_pb2.NodeInventory
    def __init__(self, node_name: _Optional[str] = ..., inventory: _Optional[_Union[_common_pb2.NodeInventory, _Mapping]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("node_id", "session_id", "epoch", "lease_duration", "heartbeat_interval")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_DURATION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session_id: str
    epoch: int
    lease_duration: _duration_pb2.Duration
    heartbeat_interval: _duration_pb2.Duration
    def __init__(self, node_id: _Optional[str] = ..., session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., lease_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("seq", "hello", "heartbeat", "attempt_update", "progress", "checkpoint_commit", "probe_result", "ack")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_UPDATE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_COMMIT_FIELD_NUMBER: _ClassVar[int]
    PROBE_RESULT_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    seq: int
    hello: Hello
    heartbeat: Heartbeat
    attempt_update: AttemptUpdate
    progress: Progress
    checkpoint_commit: CheckpointCommit
    probe_result: ProbeResult
    ack: Ack
    def __init__(self, seq: _Optional[int] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., attempt_update: _Optional[_Union[AttemptUpdate, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., checkpoint_commit: _Optional[_Union[CheckpointCommit, _Mapping]] = ..., probe_result: _Optional[_Union[ProbeResult, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ...) -> None: ...

class CoordinatorMessage(_message.Message):
    __slots__ = ("seq", "full_state", "assignment", "cancel", "checkpoint_request", "suspend", "gang_plan", "lease_renewal", "ack")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FULL_STATE_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_REQUEST_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_FIELD_NUMBER: _ClassVar[int]
    GANG_PLAN_FIELD_NUMBER: _ClassVar[int]
    LEASE_RENEWAL_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    seq: int
    full_state: FullState
    assignment: Assignment
    cancel: Cancel
    checkpoint_request: CheckpointRequest
    suspend: Suspend
    gang_plan: GangPlan
    lease_renewal: LeaseRenewal
    ack: Ack
    def __init__(self, seq: _Optional[int] = ..., full_state: _Optional[_Union[FullState, _Mapping]] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., checkpoint_request: _Optional[_Union[CheckpointRequest, _Mapping]] = ..., suspend: _Optional[_Union[Suspend, _Mapping]] = ..., gang_plan: _Optional[_Union[GangPlan, _Mapping]] = ..., lease_renewal: _Optional[_Union[LeaseRenewal, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node_id", "session_id", "epoch", "attempts")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session_id: str
    epoch: int
    attempts: _containers.RepeatedCompositeFieldContainer[AttemptObservation]
    def __init__(self, node_id: _Optional[str] = ..., session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., attempts: _Optional[_Iterable[_Union[AttemptObservation, _Mapping]]] = ...) -> None: ...

class AttemptObservation(_message.Message):
    __slots__ = ("status", "progress", "checkpoint")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    status: AttemptUpdate
    progress: Progress
    checkpoint: CheckpointCommit
    def __init__(self, status: _Optional[_Union[AttemptUpdate, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., checkpoint: _Optional[_Union[CheckpointCommit, _Mapping]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("time", "gpus", "disk_free_bytes")
    TIME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    gpus: _containers.RepeatedCompositeFieldContainer[_common_pb2.Gpu]
    disk_free_bytes: int
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., gpus: _Optional[_Iterable[_Union[_common_pb2.Gpu, _Mapping]]] = ..., disk_free_bytes: _Optional[int] = ...) -> None: ...

class AttemptUpdate(_message.Message):
    __slots__ = ("attempt_id", "phase", "exit_code", "reason", "message", "start_time", "finish_time", "oom_killed", "time", "inputs_ready_time", "restored_from_seq", "outputs", "gang", "image_pull", "egress_denied", "input_sha256")
    class InputSha256Entry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    OOM_KILLED_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    INPUTS_READY_TIME_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    GANG_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PULL_FIELD_NUMBER: _ClassVar[int]
    EGRESS_DENIED_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHA256_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    phase: _common_pb2.AttemptPhase
    exit_code: int
    reason: str
    message: str
    start_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    oom_killed: bool
    time: _timestamp_pb2.Timestamp
    inputs_ready_time: _timestamp_pb2.Timestamp
    restored_from_seq: int
    outputs: _containers.RepeatedCompositeFieldContainer[OutputCommit]
    gang: GangMemberReport
    image_pull: ImagePull
    egress_denied: int
    input_sha256: _containers.ScalarMap[str, str]
    def __init__(self, attempt_id: _Optional[str] = ..., phase: _Optional[_Union[_common_pb2.AttemptPhase, str]] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., oom_killed: _Optional[bool] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., inputs_ready_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., restored_from_seq: _Optional[int] = ..., outputs: _Optional[_Iterable[_Union[OutputCommit, _Mapping]]] = ..., gang: _Optional[_Union[GangMemberReport, _Mapping]] = ..., image_pull: _Optional[_Union[ImagePull, _Mapping]] = ..., egress_denied: _Optional[int] = ..., input_sha256: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ImagePull(_message.Message):
    __slots__ = ("bytes_done", "bytes_total")
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    bytes_done: int
    bytes_total: int
    def __init__(self, bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ...) -> None: ...

class OutputCommit(_message.Message):
    __slots__ = ("name", "path", "rank", "uri", "sha256", "size_bytes", "archive")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    rank: int
    uri: str
    sha256: str
    size_bytes: int
    archive: bool
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., rank: _Optional[int] = ..., uri: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., archive: _Optional[bool] = ...) -> None: ...

class GangMemberReport(_message.Message):
    __slots__ = ("epoch", "done", "address", "port", "probe_port")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    PROBE_PORT_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    done: GangStep
    address: str
    port: int
    probe_port: int
    def __init__(self, epoch: _Optional[int] = ..., done: _Optional[_Union[GangStep, str]] = ..., address: _Optional[str] = ..., port: _Optional[int] = ..., probe_port: _Optional[int] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("attempt_id", "stage", "units_completed", "units_total", "metrics", "step", "total_steps", "tokens_per_second", "gpu_memory_bytes", "time")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    UNITS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    UNITS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    stage: str
    units_completed: int
    units_total: int
    metrics: _containers.ScalarMap[str, str]
    step: int
    total_steps: int
    tokens_per_second: str
    gpu_memory_bytes: int
    time: _timestamp_pb2.Timestamp
    def __init__(self, attempt_id: _Optional[str] = ..., stage: _Optional[str] = ..., units_completed: _Optional[int] = ..., units_total: _Optional[int] = ..., metrics: _Optional[_Mapping[str, str]] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., tokens_per_second: _Optional[str] = ..., gpu_memory_bytes: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CheckpointCommit(_message.Message):
    __slots__ = ("attempt_id", "job", "seq", "time", "size_bytes", "sha256", "paths", "epoch", "format", "pause", "uri", "rank", "reason")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    job: _common_pb2.JobRef
    seq: int
    time: _timestamp_pb2.Timestamp
    size_bytes: int
    sha256: str
    paths: _containers.RepeatedScalarFieldContainer[str]
    epoch: int
    format: CheckpointFormat
    pause: _duration_pb2.Duration
    uri: str
    rank: int
    reason: CheckpointReason
    def __init__(self, attempt_id: _Optional[str] = ..., job: _Optional[_Union[_common_pb2.JobRef, _Mapping]] = ..., seq: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., paths: _Optional[_Iterable[str]] = ..., epoch: _Optional[int] = ..., format: _Optional[_Union[CheckpointFormat, str]] = ..., pause: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., uri: _Optional[str] = ..., rank: _Optional[int] = ..., reason: _Optional[_Union[CheckpointReason, str]] = ...) -> None: ...

class ProbeResult(_message.Message):
    __slots__ = ("gang_id", "epoch", "attempt_id", "rank", "rtt_ms", "bus_gbps", "path", "measured_time", "error")
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    BUS_GBPS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MEASURED_TIME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    gang_id: str
    epoch: int
    attempt_id: str
    rank: int
    rtt_ms: str
    bus_gbps: str
    path: _common_pb2.NetworkPath
    measured_time: _timestamp_pb2.Timestamp
    error: str
    def __init__(self, gang_id: _Optional[str] = ..., epoch: _Optional[int] = ..., attempt_id: _Optional[str] = ..., rank: _Optional[int] = ..., rtt_ms: _Optional[str] = ..., bus_gbps: _Optional[str] = ..., path: _Optional[_Union[_common_pb2.NetworkPath, str]] = ..., measured_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class FullState(_message.Message):
    __slots__ = ("assignments", "cancels", "lease")
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    CANCELS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    assignments: _containers.RepeatedCompositeFieldContainer[Assignment]
    cancels: _containers.RepeatedCompositeFieldContainer[Cancel]
    lease: LeaseRenewal
    def __init__(self, assignments: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ..., cancels: _Optional[_Iterable[_Union[Cancel, _Mapping]]] = ..., lease: _Optional[_Union[LeaseRenewal, _Mapping]] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("attempt_id", "job", "index", "attempt_number", "env", "secret_env", "command", "args", "image", "working_dir", "resources", "gpu_indexes", "source", "inputs", "volumes", "secrets", "image_pull_credentials", "init_command", "sidecars", "outputs", "checkpoint", "restore_from", "gang", "egress")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NUMBER_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    SECRET_ENV_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEXES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    VOLUMES_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PULL_CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    INIT_COMMAND_FIELD_NUMBER: _ClassVar[int]
    SIDECARS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FROM_FIELD_NUMBER: _ClassVar[int]
    GANG_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    job: _common_pb2.JobRef
    index: int
    attempt_number: int
    env: _containers.ScalarMap[str, str]
    secret_env: _containers.RepeatedCompositeFieldContainer[SecretEnvVar]
    command: _containers.RepeatedScalarFieldContainer[str]
    args: _containers.RepeatedScalarFieldContainer[str]
    image: str
    working_dir: str
    resources: _common_pb2.Resources
    gpu_indexes: _containers.RepeatedScalarFieldContainer[int]
    source: Source
    inputs: _containers.RepeatedCompositeFieldContainer[Input]
    volumes: _containers.RepeatedCompositeFieldContainer[VolumeMount]
    secrets: _containers.RepeatedCompositeFieldContainer[SecretMount]
    image_pull_credentials: _containers.RepeatedCompositeFieldContainer[RegistryCredential]
    init_command: InitCommand
    sidecars: _containers.RepeatedCompositeFieldContainer[Sidecar]
    outputs: _containers.RepeatedCompositeFieldContainer[Output]
    checkpoint: CheckpointPolicy
    restore_from: CheckpointRef
    gang: GangPlan
    egress: Egress
    def __init__(self, attempt_id: _Optional[str] = ..., job: _Optional[_Union[_common_pb2.JobRef, _Mapping]] = ..., index: _Optional[int] = ..., attempt_number: _Optional[int] = ..., env: _Optional[_Mapping[str, str]] = ..., secret_env: _Optional[_Iterable[_Union[SecretEnvVar, _Mapping]]] = ..., command: _Optional[_Iterable[str]] = ..., args: _Optional[_Iterable[str]] = ..., image: _Optional[str] = ..., working_dir: _Optional[str] = ..., resources: _Optional[_Union[_common_pb2.Resources, _Mapping]] = ..., gpu_indexes: _Optional[_Iterable[int]] = ..., source: _Optional[_Union[Source, _Mapping]] = ..., inputs: _Optional[_Iterable[_Union[Input, _Mapping]]] = ..., volumes: _Optional[_Iterable[_Union[VolumeMount, _Mapping]]] = ..., secrets: _Optional[_Iterable[_Union[SecretMount, _Mapping]]] = ..., image_pull_credentials: _Optional[_Iterable[_Union[RegistryCredential, _Mapping]]] = ..., init_command: _Optional[_Union[InitCommand, _Mapping]] = ..., sidecars: _Optional[_Iterable[_Union[Sidecar, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[Output, _Mapping]]] = ..., checkpoint: _Optional[_Union[CheckpointPolicy, _Mapping]] = ..., restore_from: _Optional[_Union[CheckpointRef, _Mapping]] = ..., gang: _Optional[_Union[GangPlan, _Mapping]] = ..., egress: _Optional[_Union[Egress, _Mapping]] = ...) -> None: ...

class Location(_message.Message):
    __slots__ = ("uri", "credentials")
    class CredentialsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    URI_FIELD_NUMBER: _ClassVar[int]
    CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    uri: str
    credentials: _containers.ScalarMap[str, str]
    def __init__(self, uri: _Optional[str] = ..., credentials: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SecretEnvVar(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class SecretMount(_message.Message):
    __slots__ = ("name", "version", "version_id", "data", "mount_path")
    class DataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MOUNT_PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    version_id: str
    data: _containers.ScalarMap[str, bytes]
    mount_path: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., version_id: _Optional[str] = ..., data: _Optional[_Mapping[str, bytes]] = ..., mount_path: _Optional[str] = ...) -> None: ...

class RegistryCredential(_message.Message):
    __slots__ = ("registry", "username", "password")
    REGISTRY_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    registry: str
    username: str
    password: str
    def __init__(self, registry: _Optional[str] = ..., username: _Optional[str] = ..., password: _Optional[str] = ...) -> None: ...

class Source(_message.Message):
    __slots__ = ("git", "blob", "path")
    GIT_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    git: GitSource
    blob: BlobSource
    path: str
    def __init__(self, git: _Optional[_Union[GitSource, _Mapping]] = ..., blob: _Optional[_Union[BlobSource, _Mapping]] = ..., path: _Optional[str] = ...) -> None: ...

class GitSource(_message.Message):
    __slots__ = ("repo", "commit")
    REPO_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    repo: Location
    commit: str
    def __init__(self, repo: _Optional[_Union[Location, _Mapping]] = ..., commit: _Optional[str] = ...) -> None: ...

class BlobSource(_message.Message):
    __slots__ = ("location", "sha256")
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    location: Location
    sha256: str
    def __init__(self, location: _Optional[_Union[Location, _Mapping]] = ..., sha256: _Optional[str] = ...) -> None: ...

class Input(_message.Message):
    __slots__ = ("name", "source", "sha256", "archive", "size_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: Location
    sha256: str
    archive: bool
    size_bytes: int
    def __init__(self, name: _Optional[str] = ..., source: _Optional[_Union[Location, _Mapping]] = ..., sha256: _Optional[str] = ..., archive: _Optional[bool] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class VolumeMount(_message.Message):
    __slots__ = ("volume", "revision", "mount_path", "read_only", "source")
    VOLUME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    MOUNT_PATH_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    volume: str
    revision: int
    mount_path: str
    read_only: bool
    source: Location
    def __init__(self, volume: _Optional[str] = ..., revision: _Optional[int] = ..., mount_path: _Optional[str] = ..., read_only: _Optional[bool] = ..., source: _Optional[_Union[Location, _Mapping]] = ...) -> None: ...

class InitCommand(_message.Message):
    __slots__ = ("command", "timeout")
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    command: _containers.RepeatedScalarFieldContainer[str]
    timeout: _duration_pb2.Duration
    def __init__(self, command: _Optional[_Iterable[str]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Sidecar(_message.Message):
    __slots__ = ("name", "image", "command", "env", "secret_env", "startup_timeout")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    SECRET_ENV_FIELD_NUMBER: _ClassVar[int]
    STARTUP_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    name: str
    image: str
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    secret_env: _containers.RepeatedCompositeFieldContainer[SecretEnvVar]
    startup_timeout: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., image: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., secret_env: _Optional[_Iterable[_Union[SecretEnvVar, _Mapping]]] = ..., startup_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Output(_message.Message):
    __slots__ = ("name", "path", "all_ranks", "destination")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ALL_RANKS_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    all_ranks: bool
    destination: Location
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., all_ranks: _Optional[bool] = ..., destination: _Optional[_Union[Location, _Mapping]] = ...) -> None: ...

class CheckpointPolicy(_message.Message):
    __slots__ = ("paths", "interval", "max_size_bytes", "format", "integration", "store")
    PATHS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    INTEGRATION_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    paths: _containers.RepeatedScalarFieldContainer[str]
    interval: _duration_pb2.Duration
    max_size_bytes: int
    format: CheckpointFormat
    integration: CheckpointIntegration
    store: Location
    def __init__(self, paths: _Optional[_Iterable[str]] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_size_bytes: _Optional[int] = ..., format: _Optional[_Union[CheckpointFormat, str]] = ..., integration: _Optional[_Union[CheckpointIntegration, str]] = ..., store: _Optional[_Union[Location, _Mapping]] = ...) -> None: ...

class CheckpointRef(_message.Message):
    __slots__ = ("seq", "manifest", "sha256", "size_bytes", "format", "epoch", "parts")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    manifest: Location
    sha256: str
    size_bytes: int
    format: CheckpointFormat
    epoch: int
    parts: _containers.RepeatedCompositeFieldContainer[CheckpointRef]
    def __init__(self, seq: _Optional[int] = ..., manifest: _Optional[_Union[Location, _Mapping]] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., format: _Optional[_Union[CheckpointFormat, str]] = ..., epoch: _Optional[int] = ..., parts: _Optional[_Iterable[_Union[CheckpointRef, _Mapping]]] = ...) -> None: ...

class Egress(_message.Message):
    __slots__ = ("policy", "allow", "presets")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FIELD_NUMBER: _ClassVar[int]
    PRESETS_FIELD_NUMBER: _ClassVar[int]
    policy: EgressPolicy
    allow: _containers.RepeatedScalarFieldContainer[str]
    presets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, policy: _Optional[_Union[EgressPolicy, str]] = ..., allow: _Optional[_Iterable[str]] = ..., presets: _Optional[_Iterable[str]] = ...) -> None: ...

class GangPlan(_message.Message):
    __slots__ = ("attempt_id", "gang_id", "epoch", "rank", "size", "gpus_per_node", "launcher", "rendezvous_address", "rendezvous_port", "step", "peers", "probe_max_bytes", "probe_budget", "startup_timeout", "probe")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    GANG_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_PORT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    PROBE_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROBE_BUDGET_FIELD_NUMBER: _ClassVar[int]
    STARTUP_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    gang_id: str
    epoch: int
    rank: int
    size: int
    gpus_per_node: int
    launcher: _common_pb2.Launcher
    rendezvous_address: str
    rendezvous_port: int
    step: GangStep
    peers: _containers.RepeatedCompositeFieldContainer[GangPeer]
    probe_max_bytes: int
    probe_budget: _duration_pb2.Duration
    startup_timeout: _duration_pb2.Duration
    probe: bool
    def __init__(self, attempt_id: _Optional[str] = ..., gang_id: _Optional[str] = ..., epoch: _Optional[int] = ..., rank: _Optional[int] = ..., size: _Optional[int] = ..., gpus_per_node: _Optional[int] = ..., launcher: _Optional[_Union[_common_pb2.Launcher, str]] = ..., rendezvous_address: _Optional[str] = ..., rendezvous_port: _Optional[int] = ..., step: _Optional[_Union[GangStep, str]] = ..., peers: _Optional[_Iterable[_Union[GangPeer, _Mapping]]] = ..., probe_max_bytes: _Optional[int] = ..., probe_budget: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., startup_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., probe: _Optional[bool] = ...) -> None: ...

class GangPeer(_message.Message):
    __slots__ = ("rank", "address", "port", "probe_port")
    RANK_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    PROBE_PORT_FIELD_NUMBER: _ClassVar[int]
    rank: int
    address: str
    port: int
    probe_port: int
    def __init__(self, rank: _Optional[int] = ..., address: _Optional[str] = ..., port: _Optional[int] = ..., probe_port: _Optional[int] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("attempt_id", "reason", "grace_seconds")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    reason: str
    grace_seconds: int
    def __init__(self, attempt_id: _Optional[str] = ..., reason: _Optional[str] = ..., grace_seconds: _Optional[int] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("attempt_id", "reason", "seq", "deadline", "store")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    reason: CheckpointReason
    seq: int
    deadline: _timestamp_pb2.Timestamp
    store: Location
    def __init__(self, attempt_id: _Optional[str] = ..., reason: _Optional[_Union[CheckpointReason, str]] = ..., seq: _Optional[int] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., store: _Optional[_Union[Location, _Mapping]] = ...) -> None: ...

class Suspend(_message.Message):
    __slots__ = ("attempt_id", "reason", "seq", "checkpoint_deadline", "grace_seconds", "store")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    reason: str
    seq: int
    checkpoint_deadline: _timestamp_pb2.Timestamp
    grace_seconds: int
    store: Location
    def __init__(self, attempt_id: _Optional[str] = ..., reason: _Optional[str] = ..., seq: _Optional[int] = ..., checkpoint_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., grace_seconds: _Optional[int] = ..., store: _Optional[_Union[Location, _Mapping]] = ...) -> None: ...

class LeaseRenewal(_message.Message):
    __slots__ = ("valid_for", "expire_time")
    VALID_FOR_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    valid_for: _duration_pb2.Duration
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, valid_for: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

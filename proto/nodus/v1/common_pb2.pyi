import datetime

from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Runtime(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUNTIME_UNSPECIFIED: _ClassVar[Runtime]
    RUNTIME_PROCESS: _ClassVar[Runtime]
    RUNTIME_OCI: _ClassVar[Runtime]

class AttemptPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTEMPT_PHASE_UNSPECIFIED: _ClassVar[AttemptPhase]
    ATTEMPT_PHASE_PENDING: _ClassVar[AttemptPhase]
    ATTEMPT_PHASE_PROVISIONING: _ClassVar[AttemptPhase]
    ATTEMPT_PHASE_MATERIALIZING: _ClassVar[AttemptPhase]
    ATTEMPT_PHASE_INITIALIZING: _ClassVar[AttemptPhase]
    ATTEMPT_PHASE_STARTING_SIDECARS: _ClassVar[AttemptPhase]
    ATTEMPT_PHASE_RUNNING: _ClassVar[AttemptPhase]
    ATTEMPT_PHASE_CHECKPOINTING: _ClassVar[AttemptPhase]
    ATTEMPT_PHASE_STOPPING: _ClassVar[AttemptPhase]
    ATTEMPT_PHASE_SUCCEEDED: _ClassVar[AttemptPhase]
    ATTEMPT_PHASE_FAILED: _ClassVar[AttemptPhase]
    ATTEMPT_PHASE_LOST: _ClassVar[AttemptPhase]
    ATTEMPT_PHASE_CANCELLED: _ClassVar[AttemptPhase]

class ReasonClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REASON_CLASS_UNSPECIFIED: _ClassVar[ReasonClass]
    REASON_CLASS_SUCCESS: _ClassVar[ReasonClass]
    REASON_CLASS_CUSTOMER_FAILURE: _ClassVar[ReasonClass]
    REASON_CLASS_LOST_CAPACITY: _ClassVar[ReasonClass]
    REASON_CLASS_CANCEL: _ClassVar[ReasonClass]
    REASON_CLASS_NO_END: _ClassVar[ReasonClass]

class AttemptReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTEMPT_REASON_UNSPECIFIED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_COMPLETED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_ERROR: _ClassVar[AttemptReason]
    ATTEMPT_REASON_OOM_KILLED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_INIT_FAILED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_SIDECAR_FAILED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_LAUNCH_FAILED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_INPUT_FAILED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_IMAGE_UNSUPPORTED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_INVALID_ASSIGNMENT: _ClassVar[AttemptReason]
    ATTEMPT_REASON_NODE_LOST: _ClassVar[AttemptReason]
    ATTEMPT_REASON_DRAINED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_PREEMPTED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_RECLAIMED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_AGENT_FAULT: _ClassVar[AttemptReason]
    ATTEMPT_REASON_RENDEZVOUS_TIMEOUT: _ClassVar[AttemptReason]
    ATTEMPT_REASON_GANG_MEMBER_EXITED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_CANCELLED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_TERMINATED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_SUSPENDED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_UNASSIGNED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_JOB_DELETED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_GANG_RESTART: _ClassVar[AttemptReason]
    ATTEMPT_REASON_GANG_COMPLETED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_ASSEMBLY_TIMEOUT: _ClassVar[AttemptReason]
    ATTEMPT_REASON_DEADLINE_EXCEEDED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_BACKOFF_LIMIT_EXCEEDED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_MAX_ATTEMPTS_EXCEEDED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_CAPACITY_UNAVAILABLE: _ClassVar[AttemptReason]
    ATTEMPT_REASON_GANG_ASSEMBLY_TIMEOUT: _ClassVar[AttemptReason]
    ATTEMPT_REASON_MAX_COST_REACHED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_WAITING_FOR_CAPACITY: _ClassVar[AttemptReason]
    ATTEMPT_REASON_SUSPEND_FAILED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_OUTPUT_MISSING: _ClassVar[AttemptReason]
    ATTEMPT_REASON_RESTORE_FAILED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_LEASE_EXPIRED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_IMAGE_PULL_FAILED: _ClassVar[AttemptReason]
    ATTEMPT_REASON_IMAGE_PULL_NODE_FAULT: _ClassVar[AttemptReason]
    ATTEMPT_REASON_INSUFFICIENT_CREDITS: _ClassVar[AttemptReason]
    ATTEMPT_REASON_WAITING_FOR_INPUT: _ClassVar[AttemptReason]

class Launcher(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LAUNCHER_UNSPECIFIED: _ClassVar[Launcher]
    LAUNCHER_PLAIN: _ClassVar[Launcher]
    LAUNCHER_TORCHRUN: _ClassVar[Launcher]
    LAUNCHER_RAY: _ClassVar[Launcher]
    LAUNCHER_VERL: _ClassVar[Launcher]
    LAUNCHER_ACCELERATE: _ClassVar[Launcher]
    LAUNCHER_DEEPSPEED: _ClassVar[Launcher]

class NetworkPath(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NETWORK_PATH_UNSPECIFIED: _ClassVar[NetworkPath]
    NETWORK_PATH_PRIVATE: _ClassVar[NetworkPath]
    NETWORK_PATH_PUBLIC: _ClassVar[NetworkPath]
    NETWORK_PATH_DIRECT: _ClassVar[NetworkPath]
    NETWORK_PATH_RELAYED: _ClassVar[NetworkPath]
RUNTIME_UNSPECIFIED: Runtime
RUNTIME_PROCESS: Runtime
RUNTIME_OCI: Runtime
ATTEMPT_PHASE_UNSPECIFIED: AttemptPhase
ATTEMPT_PHASE_PENDING: AttemptPhase
ATTEMPT_PHASE_PROVISIONING: AttemptPhase
ATTEMPT_PHASE_MATERIALIZING: AttemptPhase
ATTEMPT_PHASE_INITIALIZING: AttemptPhase
ATTEMPT_PHASE_STARTING_SIDECARS: AttemptPhase
ATTEMPT_PHASE_RUNNING: AttemptPhase
ATTEMPT_PHASE_CHECKPOINTING: AttemptPhase
ATTEMPT_PHASE_STOPPING: AttemptPhase
ATTEMPT_PHASE_SUCCEEDED: AttemptPhase
ATTEMPT_PHASE_FAILED: AttemptPhase
ATTEMPT_PHASE_LOST: AttemptPhase
ATTEMPT_PHASE_CANCELLED: AttemptPhase
REASON_CLASS_UNSPECIFIED: ReasonClass
REASON_CLASS_SUCCESS: ReasonClass
REASON_CLASS_CUSTOMER_FAILURE: ReasonClass
REASON_CLASS_LOST_CAPACITY: ReasonClass
REASON_CLASS_CANCEL: ReasonClass
REASON_CLASS_NO_END: ReasonClass
ATTEMPT_REASON_UNSPECIFIED: AttemptReason
ATTEMPT_REASON_COMPLETED: AttemptReason
ATTEMPT_REASON_ERROR: AttemptReason
ATTEMPT_REASON_OOM_KILLED: AttemptReason
ATTEMPT_REASON_INIT_FAILED: AttemptReason
ATTEMPT_REASON_SIDECAR_FAILED: AttemptReason
ATTEMPT_REASON_LAUNCH_FAILED: AttemptReason
ATTEMPT_REASON_INPUT_FAILED: AttemptReason
ATTEMPT_REASON_IMAGE_UNSUPPORTED: AttemptReason
ATTEMPT_REASON_INVALID_ASSIGNMENT: AttemptReason
ATTEMPT_REASON_NODE_LOST: AttemptReason
ATTEMPT_REASON_DRAINED: AttemptReason
ATTEMPT_REASON_PREEMPTED: AttemptReason
ATTEMPT_REASON_RECLAIMED: AttemptReason
ATTEMPT_REASON_AGENT_FAULT: AttemptReason
ATTEMPT_REASON_RENDEZVOUS_TIMEOUT: AttemptReason
ATTEMPT_REASON_GANG_MEMBER_EXITED: AttemptReason
ATTEMPT_REASON_CANCELLED: AttemptReason
ATTEMPT_REASON_TERMINATED: AttemptReason
ATTEMPT_REASON_SUSPENDED: AttemptReason
ATTEMPT_REASON_UNASSIGNED: AttemptReason
ATTEMPT_REASON_JOB_DELETED: AttemptReason
ATTEMPT_REASON_GANG_RESTART: AttemptReason
ATTEMPT_REASON_GANG_COMPLETED: AttemptReason
ATTEMPT_REASON_ASSEMBLY_TIMEOUT: AttemptReason
ATTEMPT_REASON_DEADLINE_EXCEEDED: AttemptReason
ATTEMPT_REASON_BACKOFF_LIMIT_EXCEEDED: AttemptReason
ATTEMPT_REASON_MAX_ATTEMPTS_EXCEEDED: AttemptReason
ATTEMPT_REASON_CAPACITY_UNAVAILABLE: AttemptReason
ATTEMPT_REASON_GANG_ASSEMBLY_TIMEOUT: AttemptReason
ATTEMPT_REASON_MAX_COST_REACHED: AttemptReason
ATTEMPT_REASON_WAITING_FOR_CAPACITY: AttemptReason
ATTEMPT_REASON_SUSPEND_FAILED: AttemptReason
ATTEMPT_REASON_OUTPUT_MISSING: AttemptReason
ATTEMPT_REASON_RESTORE_FAILED: AttemptReason
ATTEMPT_REASON_LEASE_EXPIRED: AttemptReason
ATTEMPT_REASON_IMAGE_PULL_FAILED: AttemptReason
ATTEMPT_REASON_IMAGE_PULL_NODE_FAULT: AttemptReason
ATTEMPT_REASON_INSUFFICIENT_CREDITS: AttemptReason
ATTEMPT_REASON_WAITING_FOR_INPUT: AttemptReason
LAUNCHER_UNSPECIFIED: Launcher
LAUNCHER_PLAIN: Launcher
LAUNCHER_TORCHRUN: Launcher
LAUNCHER_RAY: Launcher
LAUNCHER_VERL: Launcher
LAUNCHER_ACCELERATE: Launcher
LAUNCHER_DEEPSPEED: Launcher
NETWORK_PATH_UNSPECIFIED: NetworkPath
NETWORK_PATH_PRIVATE: NetworkPath
NETWORK_PATH_PUBLIC: NetworkPath
NETWORK_PATH_DIRECT: NetworkPath
NETWORK_PATH_RELAYED: NetworkPath
COUNTS_AS_FIELD_NUMBER: _ClassVar[int]
counts_as: _descriptor.FieldDescriptor

class JobRef(_message.Message):
    __slots__ = ("project", "name", "uid")
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    project: str
    name: str
    uid: str
    def __init__(self, project: _Optional[str] = ..., name: _Optional[str] = ..., uid: _Optional[str] = ...) -> None: ...

class NodeInventory(_message.Message):
    __slots__ = ("hostname", "agent_version", "runtimes", "region_class", "offering", "labels", "host", "gpus", "advertise_address", "interruptible")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIMES_FIELD_NUMBER: _ClassVar[int]
    REGION_CLASS_FIELD_NUMBER: _ClassVar[int]
    OFFERING_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ADVERTISE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTIBLE_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    agent_version: str
    runtimes: _containers.RepeatedScalarFieldContainer[Runtime]
    region_class: str
    offering: str
    labels: _containers.ScalarMap[str, str]
    host: HostInventory
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    advertise_address: str
    interruptible: bool
    def __init__(self, hostname: _Optional[str] = ..., agent_version: _Optional[str] = ..., runtimes: _Optional[_Iterable[_Union[Runtime, str]]] = ..., region_class: _Optional[str] = ..., offering: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., host: _Optional[_Union[HostInventory, _Mapping]] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., advertise_address: _Optional[str] = ..., interruptible: _Optional[bool] = ...) -> None: ...

class HostInventory(_message.Message):
    __slots__ = ("cpus", "memory_bytes", "disk_bytes", "driver_version", "cuda_version")
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    cpus: int
    memory_bytes: int
    disk_bytes: int
    driver_version: str
    cuda_version: str
    def __init__(self, cpus: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., driver_version: _Optional[str] = ..., cuda_version: _Optional[str] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "name", "uuid", "memory_bytes", "ecc", "remapped_rows", "temperature_c", "power_w", "pcie", "nvlink_active_links", "xid_events", "simulated", "unhealthy_reason", "unhealthy_message")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ECC_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    PCIE_FIELD_NUMBER: _ClassVar[int]
    NVLINK_ACTIVE_LINKS_FIELD_NUMBER: _ClassVar[int]
    XID_EVENTS_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_REASON_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    uuid: str
    memory_bytes: int
    ecc: GpuEccCounters
    remapped_rows: GpuRemappedRows
    temperature_c: int
    power_w: str
    pcie: PcieLink
    nvlink_active_links: int
    xid_events: _containers.RepeatedCompositeFieldContainer[XidEvent]
    simulated: bool
    unhealthy_reason: str
    unhealthy_message: str
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., uuid: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., ecc: _Optional[_Union[GpuEccCounters, _Mapping]] = ..., remapped_rows: _Optional[_Union[GpuRemappedRows, _Mapping]] = ..., temperature_c: _Optional[int] = ..., power_w: _Optional[str] = ..., pcie: _Optional[_Union[PcieLink, _Mapping]] = ..., nvlink_active_links: _Optional[int] = ..., xid_events: _Optional[_Iterable[_Union[XidEvent, _Mapping]]] = ..., simulated: _Optional[bool] = ..., unhealthy_reason: _Optional[str] = ..., unhealthy_message: _Optional[str] = ...) -> None: ...

class GpuEccCounters(_message.Message):
    __slots__ = ("volatile_corrected", "volatile_uncorrected", "aggregate_corrected", "aggregate_uncorrected")
    VOLATILE_CORRECTED_FIELD_NUMBER: _ClassVar[int]
    VOLATILE_UNCORRECTED_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_CORRECTED_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_UNCORRECTED_FIELD_NUMBER: _ClassVar[int]
    volatile_corrected: int
    volatile_uncorrected: int
    aggregate_corrected: int
    aggregate_uncorrected: int
    def __init__(self, volatile_corrected: _Optional[int] = ..., volatile_uncorrected: _Optional[int] = ..., aggregate_corrected: _Optional[int] = ..., aggregate_uncorrected: _Optional[int] = ...) -> None: ...

class GpuRemappedRows(_message.Message):
    __slots__ = ("correctable", "uncorrectable", "pending", "failure")
    CORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    UNCORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool
    def __init__(self, correctable: _Optional[int] = ..., uncorrectable: _Optional[int] = ..., pending: _Optional[bool] = ..., failure: _Optional[bool] = ...) -> None: ...

class PcieLink(_message.Message):
    __slots__ = ("generation", "width", "max_generation", "max_width")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    MAX_GENERATION_FIELD_NUMBER: _ClassVar[int]
    MAX_WIDTH_FIELD_NUMBER: _ClassVar[int]
    generation: int
    width: int
    max_generation: int
    max_width: int
    def __init__(self, generation: _Optional[int] = ..., width: _Optional[int] = ..., max_generation: _Optional[int] = ..., max_width: _Optional[int] = ...) -> None: ...

class XidEvent(_message.Message):
    __slots__ = ("code", "time", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    time: _timestamp_pb2.Timestamp
    message: str
    def __init__(self, code: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ("cpu_millis", "memory_bytes", "disk_bytes", "gpus")
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    cpu_millis: int
    memory_bytes: int
    disk_bytes: int
    gpus: int
    def __init__(self, cpu_millis: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., gpus: _Optional[int] = ...) -> None: ...

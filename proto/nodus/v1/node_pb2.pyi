import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from nodus.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodePhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_PHASE_UNSPECIFIED: _ClassVar[NodePhase]
    NODE_PHASE_READY: _ClassVar[NodePhase]
    NODE_PHASE_NOT_READY: _ClassVar[NodePhase]
    NODE_PHASE_CORDONED: _ClassVar[NodePhase]
    NODE_PHASE_DRAINING: _ClassVar[NodePhase]
    NODE_PHASE_DRAINED: _ClassVar[NodePhase]
    NODE_PHASE_RECLAIMING: _ClassVar[NodePhase]
    NODE_PHASE_RECLAIMED: _ClassVar[NodePhase]
NODE_PHASE_UNSPECIFIED: NodePhase
NODE_PHASE_READY: NodePhase
NODE_PHASE_NOT_READY: NodePhase
NODE_PHASE_CORDONED: NodePhase
NODE_PHASE_DRAINING: NodePhase
NODE_PHASE_DRAINED: NodePhase
NODE_PHASE_RECLAIMING: NodePhase
NODE_PHASE_RECLAIMED: NodePhase

class Node(_message.Message):
    __slots__ = ("name", "id", "phase", "inventory", "capacity", "free", "lease_expire_time", "last_heartbeat_time", "epoch", "register_time", "message", "active_attempts", "enrolled", "revoked", "certificate_expire_time", "conditions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_TIME_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REGISTER_TIME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ENROLLED_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    id: str
    phase: NodePhase
    inventory: _common_pb2.NodeInventory
    capacity: _common_pb2.Resources
    free: _common_pb2.Resources
    lease_expire_time: _timestamp_pb2.Timestamp
    last_heartbeat_time: _timestamp_pb2.Timestamp
    epoch: int
    register_time: _timestamp_pb2.Timestamp
    message: str
    active_attempts: int
    enrolled: bool
    revoked: bool
    certificate_expire_time: _timestamp_pb2.Timestamp
    conditions: _containers.RepeatedCompositeFieldContainer[NodeCondition]
    def __init__(self, name: _Optional[str] = ..., id: _Optional[str] = ..., phase: _Optional[_Union[NodePhase, str]] = ..., inventory: _Optional[_Union[_common_pb2.NodeInventory, _Mapping]] = ..., capacity: _Optional[_Union[_common_pb2.Resources, _Mapping]] = ..., free: _Optional[_Union[_common_pb2.Resources, _Mapping]] = ..., lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_heartbeat_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., epoch: _Optional[int] = ..., register_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., message: _Optional[str] = ..., active_attempts: _Optional[int] = ..., enrolled: _Optional[bool] = ..., revoked: _Optional[bool] = ..., certificate_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., conditions: _Optional[_Iterable[_Union[NodeCondition, _Mapping]]] = ...) -> None: ...

class NodeCondition(_message.Message):
    __slots__ = ("type", "status", "reason", "message")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    type: str
    status: str
    reason: str
    message: str
    def __init__(self, type: _Optional[str] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class RevokeNodeRequest(_message.Message):
    __slots__ = ("name", "message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    message: str
    def __init__(self, name: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ReadmitNodeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RotateJoinTokenRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RotateJoinTokenResponse(_message.Message):
    __slots__ = ("join_token", "retired")
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    join_token: str
    retired: int
    def __init__(self, join_token: _Optional[str] = ..., retired: _Optional[int] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("label_selector", "phase")
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    label_selector: str
    phase: NodePhase
    def __init__(self, label_selector: _Optional[str] = ..., phase: _Optional[_Union[NodePhase, str]] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CordonRequest(_message.Message):
    __slots__ = ("name", "message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    message: str
    def __init__(self, name: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class UncordonRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("name", "grace_seconds", "message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    grace_seconds: int
    message: str
    def __init__(self, name: _Optional[str] = ..., grace_seconds: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ReclaimRequest(_message.Message):
    __slots__ = ("name", "grace_seconds", "message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    grace_seconds: int
    message: str
    def __init__(self, name: _Optional[str] = ..., grace_seconds: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ListAttemptsRequest(_message.Message):
    __slots__ = ("project", "job", "node", "include_finished")
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FINISHED_FIELD_NUMBER: _ClassVar[int]
    project: str
    job: str
    node: str
    include_finished: bool
    def __init__(self, project: _Optional[str] = ..., job: _Optional[str] = ..., node: _Optional[str] = ..., include_finished: _Optional[bool] = ...) -> None: ...

class ListAttemptsResponse(_message.Message):
    __slots__ = ("attempts",)
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    def __init__(self, attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("id", "job", "index", "number", "node", "phase", "reason", "message", "exit_code", "create_time", "start_time", "finish_time", "gang_epoch", "rank", "offering", "restored_from_seq")
    ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    GANG_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    OFFERING_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    id: str
    job: _common_pb2.JobRef
    index: int
    number: int
    node: str
    phase: _common_pb2.AttemptPhase
    reason: str
    message: str
    exit_code: int
    create_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    gang_epoch: int
    rank: int
    offering: str
    restored_from_seq: int
    def __init__(self, id: _Optional[str] = ..., job: _Optional[_Union[_common_pb2.JobRef, _Mapping]] = ..., index: _Optional[int] = ..., number: _Optional[int] = ..., node: _Optional[str] = ..., phase: _Optional[_Union[_common_pb2.AttemptPhase, str]] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., exit_code: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., gang_epoch: _Optional[int] = ..., rank: _Optional[int] = ..., offering: _Optional[str] = ..., restored_from_seq: _Optional[int] = ...) -> None: ...

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

class GangPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GANG_PHASE_UNSPECIFIED: _ClassVar[GangPhase]
    GANG_PHASE_QUEUED: _ClassVar[GangPhase]
    GANG_PHASE_ASSEMBLING: _ClassVar[GangPhase]
    GANG_PHASE_MESHING: _ClassVar[GangPhase]
    GANG_PHASE_STARTING: _ClassVar[GangPhase]
    GANG_PHASE_RUNNING: _ClassVar[GangPhase]
    GANG_PHASE_RECOVERING: _ClassVar[GangPhase]
    GANG_PHASE_STOPPING: _ClassVar[GangPhase]
    GANG_PHASE_RELEASING: _ClassVar[GangPhase]
    GANG_PHASE_DONE: _ClassVar[GangPhase]
GANG_PHASE_UNSPECIFIED: GangPhase
GANG_PHASE_QUEUED: GangPhase
GANG_PHASE_ASSEMBLING: GangPhase
GANG_PHASE_MESHING: GangPhase
GANG_PHASE_STARTING: GangPhase
GANG_PHASE_RUNNING: GangPhase
GANG_PHASE_RECOVERING: GangPhase
GANG_PHASE_STOPPING: GangPhase
GANG_PHASE_RELEASING: GangPhase
GANG_PHASE_DONE: GangPhase

class Gang(_message.Message):
    __slots__ = ("id", "job", "epoch", "phase", "size", "ready", "started", "restarts", "rendezvous", "launcher", "members", "probe", "transport", "phase_time")
    ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PHASE_TIME_FIELD_NUMBER: _ClassVar[int]
    id: str
    job: _common_pb2.JobRef
    epoch: int
    phase: GangPhase
    size: int
    ready: int
    started: int
    restarts: int
    rendezvous: str
    launcher: _common_pb2.Launcher
    members: _containers.RepeatedCompositeFieldContainer[GangMember]
    probe: GangProbe
    transport: _common_pb2.NetworkPath
    phase_time: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., job: _Optional[_Union[_common_pb2.JobRef, _Mapping]] = ..., epoch: _Optional[int] = ..., phase: _Optional[_Union[GangPhase, str]] = ..., size: _Optional[int] = ..., ready: _Optional[int] = ..., started: _Optional[int] = ..., restarts: _Optional[int] = ..., rendezvous: _Optional[str] = ..., launcher: _Optional[_Union[_common_pb2.Launcher, str]] = ..., members: _Optional[_Iterable[_Union[GangMember, _Mapping]]] = ..., probe: _Optional[_Union[GangProbe, _Mapping]] = ..., transport: _Optional[_Union[_common_pb2.NetworkPath, str]] = ..., phase_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GangMember(_message.Message):
    __slots__ = ("rank", "attempt", "node", "offering", "region_class", "phase", "path")
    RANK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    OFFERING_FIELD_NUMBER: _ClassVar[int]
    REGION_CLASS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    rank: int
    attempt: str
    node: str
    offering: str
    region_class: str
    phase: _common_pb2.AttemptPhase
    path: _common_pb2.NetworkPath
    def __init__(self, rank: _Optional[int] = ..., attempt: _Optional[str] = ..., node: _Optional[str] = ..., offering: _Optional[str] = ..., region_class: _Optional[str] = ..., phase: _Optional[_Union[_common_pb2.AttemptPhase, str]] = ..., path: _Optional[_Union[_common_pb2.NetworkPath, str]] = ...) -> None: ...

class GangProbe(_message.Message):
    __slots__ = ("rtt_ms", "bus_gbps", "path", "measured_time")
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    BUS_GBPS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MEASURED_TIME_FIELD_NUMBER: _ClassVar[int]
    rtt_ms: str
    bus_gbps: str
    path: _common_pb2.NetworkPath
    measured_time: _timestamp_pb2.Timestamp
    def __init__(self, rtt_ms: _Optional[str] = ..., bus_gbps: _Optional[str] = ..., path: _Optional[_Union[_common_pb2.NetworkPath, str]] = ..., measured_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetGangRequest(_message.Message):
    __slots__ = ("project", "job")
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    project: str
    job: str
    def __init__(self, project: _Optional[str] = ..., job: _Optional[str] = ...) -> None: ...

class ListGangsRequest(_message.Message):
    __slots__ = ("project", "phase")
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    project: str
    phase: GangPhase
    def __init__(self, project: _Optional[str] = ..., phase: _Optional[_Union[GangPhase, str]] = ...) -> None: ...

class ListGangsResponse(_message.Message):
    __slots__ = ("gangs",)
    GANGS_FIELD_NUMBER: _ClassVar[int]
    gangs: _containers.RepeatedCompositeFieldContainer[Gang]
    def __init__(self, gangs: _Optional[_Iterable[_Union[Gang, _Mapping]]] = ...) -> None: ...

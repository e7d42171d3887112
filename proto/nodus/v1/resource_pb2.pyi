from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetRequest(_message.Message):
    __slots__ = ("kind", "project", "name")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    kind: str
    project: str
    name: str
    def __init__(self, kind: _Optional[str] = ..., project: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("kind", "project", "label_selector", "field_selector", "limit", "continue_token", "resource_version")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    FIELD_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    kind: str
    project: str
    label_selector: str
    field_selector: str
    limit: int
    continue_token: str
    resource_version: str
    def __init__(self, kind: _Optional[str] = ..., project: _Optional[str] = ..., label_selector: _Optional[str] = ..., field_selector: _Optional[str] = ..., limit: _Optional[int] = ..., continue_token: _Optional[str] = ..., resource_version: _Optional[str] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("items", "resource_version", "continue_token", "remaining_item_count")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REMAINING_ITEM_COUNT_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    resource_version: str
    continue_token: str
    remaining_item_count: int
    def __init__(self, items: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., resource_version: _Optional[str] = ..., continue_token: _Optional[str] = ..., remaining_item_count: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("kind", "project", "label_selector", "field_selector", "resource_version", "send_initial_events", "allow_bookmarks", "timeout_seconds")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    FIELD_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SEND_INITIAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_BOOKMARKS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    project: str
    label_selector: str
    field_selector: str
    resource_version: str
    send_initial_events: bool
    allow_bookmarks: bool
    timeout_seconds: int
    def __init__(self, kind: _Optional[str] = ..., project: _Optional[str] = ..., label_selector: _Optional[str] = ..., field_selector: _Optional[str] = ..., resource_version: _Optional[str] = ..., send_initial_events: _Optional[bool] = ..., allow_bookmarks: _Optional[bool] = ..., timeout_seconds: _Optional[int] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("type", "object")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    type: str
    object: _struct_pb2.Struct
    def __init__(self, type: _Optional[str] = ..., object: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("kind", "project", "object", "dry_run", "field_validation")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    FIELD_VALIDATION_FIELD_NUMBER: _ClassVar[int]
    kind: str
    project: str
    object: _struct_pb2.Struct
    dry_run: bool
    field_validation: str
    def __init__(self, kind: _Optional[str] = ..., project: _Optional[str] = ..., object: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., dry_run: _Optional[bool] = ..., field_validation: _Optional[str] = ...) -> None: ...

class UpdateRequest(_message.Message):
    __slots__ = ("kind", "project", "name", "object", "dry_run", "field_validation", "subresource")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    FIELD_VALIDATION_FIELD_NUMBER: _ClassVar[int]
    SUBRESOURCE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    project: str
    name: str
    object: _struct_pb2.Struct
    dry_run: bool
    field_validation: str
    subresource: str
    def __init__(self, kind: _Optional[str] = ..., project: _Optional[str] = ..., name: _Optional[str] = ..., object: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., dry_run: _Optional[bool] = ..., field_validation: _Optional[str] = ..., subresource: _Optional[str] = ...) -> None: ...

class PatchRequest(_message.Message):
    __slots__ = ("kind", "project", "name", "patch_type", "patch", "dry_run", "field_validation", "subresource")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATCH_TYPE_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    FIELD_VALIDATION_FIELD_NUMBER: _ClassVar[int]
    SUBRESOURCE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    project: str
    name: str
    patch_type: str
    patch: str
    dry_run: bool
    field_validation: str
    subresource: str
    def __init__(self, kind: _Optional[str] = ..., project: _Optional[str] = ..., name: _Optional[str] = ..., patch_type: _Optional[str] = ..., patch: _Optional[str] = ..., dry_run: _Optional[bool] = ..., field_validation: _Optional[str] = ..., subresource: _Optional[str] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("kind", "project", "name", "dry_run", "resource_version")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    kind: str
    project: str
    name: str
    dry_run: bool
    resource_version: str
    def __init__(self, kind: _Optional[str] = ..., project: _Optional[str] = ..., name: _Optional[str] = ..., dry_run: _Optional[bool] = ..., resource_version: _Optional[str] = ...) -> None: ...

import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Project(_message.Message):
    __slots__ = ("name", "display_name", "create_time")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    name: str
    display_name: str
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., display_name: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateProjectRequest(_message.Message):
    __slots__ = ("name", "display_name")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    display_name: str
    def __init__(self, name: _Optional[str] = ..., display_name: _Optional[str] = ...) -> None: ...

class ListProjectsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListProjectsResponse(_message.Message):
    __slots__ = ("projects",)
    PROJECTS_FIELD_NUMBER: _ClassVar[int]
    projects: _containers.RepeatedCompositeFieldContainer[Project]
    def __init__(self, projects: _Optional[_Iterable[_Union[Project, _Mapping]]] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("id", "subject", "project", "role", "secret", "create_time", "expire_time", "last_use_time", "revoke_time")
    ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_USE_TIME_FIELD_NUMBER: _ClassVar[int]
    REVOKE_TIME_FIELD_NUMBER: _ClassVar[int]
    id: str
    subject: str
    project: str
    role: str
    secret: str
    create_time: _timestamp_pb2.Timestamp
    expire_time: _timestamp_pb2.Timestamp
    last_use_time: _timestamp_pb2.Timestamp
    revoke_time: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., subject: _Optional[str] = ..., project: _Optional[str] = ..., role: _Optional[str] = ..., secret: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_use_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoke_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("project", "role", "subject", "ttl_seconds")
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    project: str
    role: str
    subject: str
    ttl_seconds: int
    def __init__(self, project: _Optional[str] = ..., role: _Optional[str] = ..., subject: _Optional[str] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class ListTokensRequest(_message.Message):
    __slots__ = ("project", "include_revoked")
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_REVOKED_FIELD_NUMBER: _ClassVar[int]
    project: str
    include_revoked: bool
    def __init__(self, project: _Optional[str] = ..., include_revoked: _Optional[bool] = ...) -> None: ...

class ListTokensResponse(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[Token]
    def __init__(self, tokens: _Optional[_Iterable[_Union[Token, _Mapping]]] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class Credits(_message.Message):
    __slots__ = ("project", "available_usd", "held_usd", "spent_this_month_usd", "month", "granted_usd", "budgets")
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_USD_FIELD_NUMBER: _ClassVar[int]
    HELD_USD_FIELD_NUMBER: _ClassVar[int]
    SPENT_THIS_MONTH_USD_FIELD_NUMBER: _ClassVar[int]
    MONTH_FIELD_NUMBER: _ClassVar[int]
    GRANTED_USD_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    project: str
    available_usd: str
    held_usd: str
    spent_this_month_usd: str
    month: str
    granted_usd: str
    budgets: _containers.RepeatedCompositeFieldContainer[Budget]
    def __init__(self, project: _Optional[str] = ..., available_usd: _Optional[str] = ..., held_usd: _Optional[str] = ..., spent_this_month_usd: _Optional[str] = ..., month: _Optional[str] = ..., granted_usd: _Optional[str] = ..., budgets: _Optional[_Iterable[_Union[Budget, _Mapping]]] = ...) -> None: ...

class GrantCreditsRequest(_message.Message):
    __slots__ = ("project", "amount_usd", "request_id", "note")
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_USD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    project: str
    amount_usd: str
    request_id: str
    note: str
    def __init__(self, project: _Optional[str] = ..., amount_usd: _Optional[str] = ..., request_id: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class GrantCreditsResponse(_message.Message):
    __slots__ = ("credits", "granted", "seq", "book_time")
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    BOOK_TIME_FIELD_NUMBER: _ClassVar[int]
    credits: Credits
    granted: bool
    seq: int
    book_time: _timestamp_pb2.Timestamp
    def __init__(self, credits: _Optional[_Union[Credits, _Mapping]] = ..., granted: _Optional[bool] = ..., seq: _Optional[int] = ..., book_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetCreditsRequest(_message.Message):
    __slots__ = ("project",)
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    project: str
    def __init__(self, project: _Optional[str] = ...) -> None: ...

class Budget(_message.Message):
    __slots__ = ("project", "name", "amount_usd", "selector", "month", "used_usd", "left_usd")
    class SelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_USD_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    MONTH_FIELD_NUMBER: _ClassVar[int]
    USED_USD_FIELD_NUMBER: _ClassVar[int]
    LEFT_USD_FIELD_NUMBER: _ClassVar[int]
    project: str
    name: str
    amount_usd: str
    selector: _containers.ScalarMap[str, str]
    month: str
    used_usd: str
    left_usd: str
    def __init__(self, project: _Optional[str] = ..., name: _Optional[str] = ..., amount_usd: _Optional[str] = ..., selector: _Optional[_Mapping[str, str]] = ..., month: _Optional[str] = ..., used_usd: _Optional[str] = ..., left_usd: _Optional[str] = ...) -> None: ...

class SetBudgetRequest(_message.Message):
    __slots__ = ("project", "name", "amount_usd", "selector")
    class SelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_USD_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    project: str
    name: str
    amount_usd: str
    selector: _containers.ScalarMap[str, str]
    def __init__(self, project: _Optional[str] = ..., name: _Optional[str] = ..., amount_usd: _Optional[str] = ..., selector: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DeleteBudgetRequest(_message.Message):
    __slots__ = ("project", "name")
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    project: str
    name: str
    def __init__(self, project: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ListBudgetsRequest(_message.Message):
    __slots__ = ("project",)
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    project: str
    def __init__(self, project: _Optional[str] = ...) -> None: ...

class ListBudgetsResponse(_message.Message):
    __slots__ = ("budgets",)
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    budgets: _containers.RepeatedCompositeFieldContainer[Budget]
    def __init__(self, budgets: _Optional[_Iterable[_Union[Budget, _Mapping]]] = ...) -> None: ...

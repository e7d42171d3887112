import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApplyOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPLY_OUTCOME_UNSPECIFIED: _ClassVar[ApplyOutcome]
    APPLY_OUTCOME_CREATED: _ClassVar[ApplyOutcome]
    APPLY_OUTCOME_ACTIVATED: _ClassVar[ApplyOutcome]
    APPLY_OUTCOME_UNCHANGED: _ClassVar[ApplyOutcome]
APPLY_OUTCOME_UNSPECIFIED: ApplyOutcome
APPLY_OUTCOME_CREATED: ApplyOutcome
APPLY_OUTCOME_ACTIVATED: ApplyOutcome
APPLY_OUTCOME_UNCHANGED: ApplyOutcome

class ApplyPriceBookRequest(_message.Message):
    __slots__ = ("document",)
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    document: str
    def __init__(self, document: _Optional[str] = ...) -> None: ...

class ApplyPriceBookResponse(_message.Message):
    __slots__ = ("price_book", "outcome")
    PRICE_BOOK_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    price_book: PriceBook
    outcome: ApplyOutcome
    def __init__(self, price_book: _Optional[_Union[PriceBook, _Mapping]] = ..., outcome: _Optional[_Union[ApplyOutcome, str]] = ...) -> None: ...

class GetPriceBookRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: str
    def __init__(self, version: _Optional[str] = ...) -> None: ...

class ListPriceBookVersionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPriceBookVersionsResponse(_message.Message):
    __slots__ = ("price_books",)
    PRICE_BOOKS_FIELD_NUMBER: _ClassVar[int]
    price_books: _containers.RepeatedCompositeFieldContainer[PriceBook]
    def __init__(self, price_books: _Optional[_Iterable[_Union[PriceBook, _Mapping]]] = ...) -> None: ...

class PriceBook(_message.Message):
    __slots__ = ("version", "digest", "apply_time", "active", "storage_usd_per_gib_month", "offerings")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    APPLY_TIME_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_USD_PER_GIB_MONTH_FIELD_NUMBER: _ClassVar[int]
    OFFERINGS_FIELD_NUMBER: _ClassVar[int]
    version: str
    digest: str
    apply_time: _timestamp_pb2.Timestamp
    active: bool
    storage_usd_per_gib_month: str
    offerings: _containers.RepeatedCompositeFieldContainer[Offering]
    def __init__(self, version: _Optional[str] = ..., digest: _Optional[str] = ..., apply_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., active: _Optional[bool] = ..., storage_usd_per_gib_month: _Optional[str] = ..., offerings: _Optional[_Iterable[_Union[Offering, _Mapping]]] = ...) -> None: ...

class Offering(_message.Message):
    __slots__ = ("id", "accelerator", "vcpus", "memory_bytes", "disk_bytes", "region_class", "provider", "region", "rate_usd_per_hour", "interruptible", "interruptions_per_hour", "billing_increment", "minimum_charge", "relative_speed")
    ID_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    VCPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    REGION_CLASS_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    RATE_USD_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTIBLE_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTIONS_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    BILLING_INCREMENT_FIELD_NUMBER: _ClassVar[int]
    MINIMUM_CHARGE_FIELD_NUMBER: _ClassVar[int]
    RELATIVE_SPEED_FIELD_NUMBER: _ClassVar[int]
    id: str
    accelerator: Accelerator
    vcpus: int
    memory_bytes: int
    disk_bytes: int
    region_class: str
    provider: str
    region: str
    rate_usd_per_hour: str
    interruptible: bool
    interruptions_per_hour: str
    billing_increment: _duration_pb2.Duration
    minimum_charge: _duration_pb2.Duration
    relative_speed: str
    def __init__(self, id: _Optional[str] = ..., accelerator: _Optional[_Union[Accelerator, _Mapping]] = ..., vcpus: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., region_class: _Optional[str] = ..., provider: _Optional[str] = ..., region: _Optional[str] = ..., rate_usd_per_hour: _Optional[str] = ..., interruptible: _Optional[bool] = ..., interruptions_per_hour: _Optional[str] = ..., billing_increment: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., minimum_charge: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., relative_speed: _Optional[str] = ...) -> None: ...

class Accelerator(_message.Message):
    __slots__ = ("id", "family", "gpus_per_node", "memory_bytes", "interconnect")
    ID_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    INTERCONNECT_FIELD_NUMBER: _ClassVar[int]
    id: str
    family: str
    gpus_per_node: int
    memory_bytes: int
    interconnect: str
    def __init__(self, id: _Optional[str] = ..., family: _Optional[str] = ..., gpus_per_node: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., interconnect: _Optional[str] = ...) -> None: ...

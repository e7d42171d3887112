from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PutRequest(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: PutHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[PutHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class PutHeader(_message.Message):
    __slots__ = ("sha256", "size", "media_type", "attempt_id")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size: int
    media_type: str
    attempt_id: str
    def __init__(self, sha256: _Optional[str] = ..., size: _Optional[int] = ..., media_type: _Optional[str] = ..., attempt_id: _Optional[str] = ...) -> None: ...

class BlobRef(_message.Message):
    __slots__ = ("sha256", "size", "uri")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size: int
    uri: str
    def __init__(self, sha256: _Optional[str] = ..., size: _Optional[int] = ..., uri: _Optional[str] = ...) -> None: ...

class GetBlobRequest(_message.Message):
    __slots__ = ("sha256", "offset", "attempt_id")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    offset: int
    attempt_id: str
    def __init__(self, sha256: _Optional[str] = ..., offset: _Optional[int] = ..., attempt_id: _Optional[str] = ...) -> None: ...

class BlobChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class StatBlobRequest(_message.Message):
    __slots__ = ("sha256", "attempt_id")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    attempt_id: str
    def __init__(self, sha256: _Optional[str] = ..., attempt_id: _Optional[str] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("attempt_id", "offset", "data", "eof")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    offset: int
    data: bytes
    eof: bool
    def __init__(self, attempt_id: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., eof: _Optional[bool] = ...) -> None: ...

class LogAck(_message.Message):
    __slots__ = ("size",)
    SIZE_FIELD_NUMBER: _ClassVar[int]
    size: int
    def __init__(self, size: _Optional[int] = ...) -> None: ...

from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WatchRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RouteCounts(_message.Message):
    __slots__ = ("route", "held", "inflight")
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    route: str
    held: int
    inflight: int
    def __init__(self, route: _Optional[str] = ..., held: _Optional[int] = ..., inflight: _Optional[int] = ...) -> None: ...

class CountsUpdate(_message.Message):
    __slots__ = ("routes", "sent_unix_nanos", "sequence", "heartbeat")
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    routes: _containers.RepeatedCompositeFieldContainer[RouteCounts]
    sent_unix_nanos: int
    sequence: int
    heartbeat: bool
    def __init__(self, routes: _Optional[_Iterable[_Union[RouteCounts, _Mapping]]] = ..., sent_unix_nanos: _Optional[int] = ..., sequence: _Optional[int] = ..., heartbeat: _Optional[bool] = ...) -> None: ...

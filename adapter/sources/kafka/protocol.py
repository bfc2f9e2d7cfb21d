"""OffsetFetch v8 (KIP-709): the committed offsets of many groups in one request per coordinator;
and ListOffsets v3 with an answer read directly. Lengths and counts from the wire are checked against
the bytes received before use: a hostile or broken answer fails its request, never loops the reader.

aiokafka defines requests as data (a Schema of typed fields) and sends whatever Request it is given,
negotiating the version per connection from the broker's ApiVersions; it defines OffsetFetch only up
to v3, one group per request. This is v8, declared the same way on aiokafka's own types. v8 is a
flexible version: compact strings and arrays (lengths as unsigned varints, plus one) and a tagged-field
buffer closing every structure; the request header is v2 and the response header v1.

ListOffsets v3 is aiokafka's own request; only its answer is read here, directly (one struct per
partition), as is OffsetFetch v8's: aiokafka's generic reader makes some thirty calls a partition, and
a round of many groups reads thousands of partitions (docs/architecture.md#hot-kafka-decode).

Request v8:  groups [group_id, topics (nullable: null = every committed topic)
                     [name, partition_indexes [int32]]], require_stable
Response v8: throttle_time_ms, groups [group_id, topics [name, partitions [partition_index,
             committed_offset, committed_leader_epoch, metadata (nullable), error_code]], error_code]
"""

from __future__ import annotations

import struct
from io import BytesIO
from typing import Any

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.offset import OffsetRequest_v3, OffsetResponse_v3
from aiokafka.protocol.types import Boolean, CompactArray, CompactString, Int16, Int32, Int64, Schema, TaggedFields

# aiokafka ships no type information (mypy sees its classes as Any), hence the ignores on subclassing.
_LIST_OFFSETS = 2
_LIST_OFFSETS_VERSION = 3
_OFFSET_FETCH = 9
_MULTI_GROUP_VERSION = 8
_NO_TAGS: dict[int, bytes] = {}


# A partition's fixed head in the response: partition_index, committed_offset, committed_leader_epoch.
_PARTITION_HEAD = struct.Struct(">iqi")
# A ListOffsets v3 answer's partition: partition, error_code, timestamp, offset.
_LOG_OFFSET = struct.Struct(">ihqq")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_TWO_INT32 = struct.Struct(">ii")
_TOPIC_HEAD_SIZE = 6  # a ListOffsets topic: int16 name length (the name may be empty), int32 partition count


class VersionUnsupported(Exception):
    """The broker's ApiVersions lacks the version of a request defined here: use aiokafka's own."""


def _require(versions: dict[int, tuple[int, int]], api_key: int, version: int, api: str) -> None:
    """Refuse to build a request the broker cannot read. aiokafka calls prepare() with the connection's
    negotiated versions before anything is written, so nothing is sent."""
    low, high = versions.get(api_key, (0, -1))
    if not low <= version <= high:
        raise VersionUnsupported(f"{api} v{low}-v{high}")


class OffsetFetchResponseV8(Response):  # type: ignore[misc]
    API_KEY = _OFFSET_FETCH
    API_VERSION = _MULTI_GROUP_VERSION
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "groups",
            CompactArray(
                ("group_id", CompactString("utf-8")),
                (
                    "topics",
                    CompactArray(
                        ("name", CompactString("utf-8")),
                        (
                            "partitions",
                            CompactArray(
                                ("partition_index", Int32),
                                ("committed_offset", Int64),
                                ("committed_leader_epoch", Int32),
                                ("metadata", CompactString("utf-8")),
                                ("error_code", Int16),
                                ("tags", TaggedFields),
                            ),
                        ),
                        ("tags", TaggedFields),
                    ),
                ),
                ("error_code", Int16),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )

    @classmethod
    def decode(cls, data: BytesIO | bytes) -> OffsetFetchResponseV8:
        """What SCHEMA decodes, read directly. Every length and count is checked against the bytes left
        (ValueError), so a hostile answer cannot make the reader loop or read past the end."""
        buf = data.read() if isinstance(data, BytesIO) else data
        try:
            return cls._read(buf)
        except (struct.error, IndexError) as err:  # a fixed-size field or a varint cut off by the end
            raise ValueError(f"OffsetFetch v8 answer ends inside a field: {err}") from err

    @classmethod
    def _read(cls, buf: bytes) -> OffsetFetchResponseV8:
        (throttle,) = _INT32.unpack_from(buf, 0)
        count, pos = _count(buf, 4, "groups")
        groups = []
        for _ in range(count):
            group, pos = _string(buf, pos)
            topic_count, pos = _count(buf, pos, "topics")
            topics = []
            for _ in range(topic_count):
                name, pos = _string(buf, pos)
                partition_count, pos = _count(buf, pos, "partitions")
                partitions = []
                for _ in range(partition_count):
                    index, offset, epoch = _PARTITION_HEAD.unpack_from(buf, pos)
                    metadata, pos = _string(buf, pos + _PARTITION_HEAD.size)
                    (error,) = _INT16.unpack_from(buf, pos)
                    tags, pos = _tags(buf, pos + 2)
                    partitions.append((index, offset, epoch, metadata, error, tags))
                tags, pos = _tags(buf, pos)
                topics.append((name, partitions, tags))
            (error,) = _INT16.unpack_from(buf, pos)
            tags, pos = _tags(buf, pos + 2)
            groups.append((group, topics, error, tags))
        tags, pos = _tags(buf, pos)
        if pos != len(buf):
            raise ValueError(f"OffsetFetch v8 answer: {len(buf) - pos} bytes left over")
        return cls(throttle, groups, tags)


_VARINT_BYTES = 5  # every varint here is an unsigned 32-bit length or count


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint (7 bits a byte, low first) at pos, and the position after it."""
    byte = buf[pos]
    if byte < 0x80:  # most are one byte: a few thousand a round
        return byte, pos + 1
    value = 0
    for shift in range(0, 7 * _VARINT_BYTES, 7):
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
    raise ValueError(f"varint longer than {_VARINT_BYTES} bytes at byte {pos}")


def _count(buf: bytes, pos: int, what: str) -> tuple[int, int]:
    """A compact array's element count (0 for null); each element takes at least one byte, so a count
    beyond the bytes left is a broken answer, refused before any element is read."""
    count, pos = _uvarint(buf, pos)
    count = max(count - 1, 0)
    if count > len(buf) - pos:
        raise ValueError(f"{count} {what} announced with {len(buf) - pos} bytes left")
    return count, pos


def _string(buf: bytes, pos: int) -> tuple[str | None, int]:
    """A compact nullable string: its length plus one as a varint (0: null), then UTF-8."""
    length, pos = _uvarint(buf, pos)
    if length == 0:
        return None, pos
    end = pos + length - 1
    if end > len(buf):
        raise ValueError(f"string of {length - 1} bytes at byte {pos} runs past the answer's end")
    return buf[pos:end].decode(), end


def _tags(buf: bytes, pos: int) -> tuple[dict[int, bytes], int]:
    """A tagged-field buffer: a count, then (tag, size, bytes) each."""
    if buf[pos] == 0:  # nearly always: no tagged field
        return {}, pos + 1
    count, pos = _uvarint(buf, pos)
    if count > len(buf) - pos:
        raise ValueError(f"{count} tagged fields announced with {len(buf) - pos} bytes left")
    tags = {}
    for _ in range(count):
        tag, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        if pos + size > len(buf):
            raise ValueError(f"tagged field of {size} bytes at byte {pos} runs past the answer's end")
        tags[tag] = buf[pos : pos + size]
        pos += size
    return tags, pos


class OffsetFetchRequestV8(RequestStruct):  # type: ignore[misc]
    API_KEY = _OFFSET_FETCH
    API_VERSION = _MULTI_GROUP_VERSION
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = OffsetFetchResponseV8
    SCHEMA = Schema(
        (
            "groups",
            CompactArray(
                ("group_id", CompactString("utf-8")),
                (
                    "topics",
                    CompactArray(
                        ("name", CompactString("utf-8")),
                        ("partition_indexes", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("require_stable", Boolean),
        ("tags", TaggedFields),
    )


class OffsetFetchGroups(Request[OffsetFetchRequestV8]):  # type: ignore[misc]
    """Every committed offset of each group (topics null), for groups sharing one coordinator."""

    API_KEY = _OFFSET_FETCH

    def __init__(self, groups: list[str]) -> None:
        self._groups = groups

    def prepare(self, versions: dict[int, tuple[int, int]]) -> OffsetFetchRequestV8:
        _require(versions, _OFFSET_FETCH, _MULTI_GROUP_VERSION, "OffsetFetch")
        request: OffsetFetchRequestV8 = super().prepare(versions)
        return request

    def build(self, request_struct_class: type[OffsetFetchRequestV8]) -> OffsetFetchRequestV8:
        # require_stable false: offsets of open transactions are not waited for (a lag reader, not a consumer)
        groups: list[Any] = [(group, None, _NO_TAGS) for group in self._groups]
        return request_struct_class(groups, False, _NO_TAGS)


class ListOffsetsResponseV3(OffsetResponse_v3):  # type: ignore[misc]
    """throttle_time_ms, topics [topic, partitions [partition, error_code, timestamp, offset]]."""

    @classmethod
    def decode(cls, data: BytesIO | bytes) -> ListOffsetsResponseV3:
        """What SCHEMA decodes, read directly, every length and count checked against the bytes left."""
        buf = data.read() if isinstance(data, BytesIO) else data
        try:
            return cls._read(buf)
        except struct.error as err:  # a fixed-size field cut off by the end
            raise ValueError(f"ListOffsets v3 answer ends inside a field: {err}") from err

    @classmethod
    def _read(cls, buf: bytes) -> ListOffsetsResponseV3:
        throttle, count = _TWO_INT32.unpack_from(buf, 0)
        pos = 8
        topics = []
        for _ in range(_bounded(count, buf, pos, _TOPIC_HEAD_SIZE, "topic")):
            (length,) = _INT16.unpack_from(buf, pos)
            if length < 0 or pos + 2 + length > len(buf):
                raise ValueError(f"ListOffsets v3 answer: topic string of {length} bytes at byte {pos} is broken")
            topic = buf[pos + 2 : pos + 2 + length].decode()
            (partition_count,) = _INT32.unpack_from(buf, pos + 2 + length)
            pos += 6 + length
            size = _bounded(partition_count, buf, pos, _LOG_OFFSET.size, "partition") * _LOG_OFFSET.size
            partitions = list(_LOG_OFFSET.iter_unpack(buf[pos : pos + size]))
            pos += size
            topics.append((topic, partitions))
        if pos != len(buf):
            raise ValueError(f"ListOffsets v3 answer: {len(buf) - pos} bytes left over")
        return cls(throttle, topics)


def _bounded(count: int, buf: bytes, pos: int, size: int, what: str) -> int:
    """An array count of elements of at least `size` bytes each, refused when negative or beyond the bytes left."""
    if count < 0 or count * size > len(buf) - pos:
        raise ValueError(f"ListOffsets v3 answer: {what} count {count} at byte {pos} with {len(buf) - pos} bytes left")
    return count


class ListOffsetsRequestV3(OffsetRequest_v3):  # type: ignore[misc]
    RESPONSE_TYPE = ListOffsetsResponseV3


class ListOffsets(Request[ListOffsetsRequestV3]):  # type: ignore[misc]
    """Log offsets of partitions: (topic, [(partition, timestamp)]), LATEST or EARLIEST as timestamp."""

    API_KEY = _LIST_OFFSETS

    def __init__(self, replica_id: int, isolation_level: int, topics: list[tuple[str, list[tuple[int, int]]]]):
        self._fields = (replica_id, isolation_level, topics)

    def prepare(self, versions: dict[int, tuple[int, int]]) -> ListOffsetsRequestV3:
        _require(versions, _LIST_OFFSETS, _LIST_OFFSETS_VERSION, "ListOffsets")
        request: ListOffsetsRequestV3 = super().prepare(versions)
        return request

    def build(self, request_struct_class: type[ListOffsetsRequestV3]) -> ListOffsetsRequestV3:
        return request_struct_class(*self._fields)

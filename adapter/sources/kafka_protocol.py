"""OffsetFetch v8 (KIP-709): the committed offsets of many groups in one request per coordinator.

aiokafka defines requests as data (a Schema of typed fields) and sends whatever Request it is given,
negotiating the version per connection from the broker's ApiVersions; it defines OffsetFetch only up
to v3, one group per request. This is v8, declared the same way on aiokafka's own types. v8 is a
flexible version: compact strings and arrays (lengths as unsigned varints, plus one) and a tagged-field
buffer closing every structure; the request header is v2 and the response header v1.

Request v8:  groups [group_id, topics (nullable: null = every committed topic)
                     [name, partition_indexes [int32]]], require_stable
Response v8: throttle_time_ms, groups [group_id, topics [name, partitions [partition_index,
             committed_offset, committed_leader_epoch, metadata (nullable), error_code]], error_code]
"""

from __future__ import annotations

from typing import Any

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Boolean, CompactArray, CompactString, Int16, Int32, Int64, Schema, TaggedFields

# aiokafka ships no type information (mypy sees its classes as Any), hence the ignores on subclassing.
_OFFSET_FETCH = 9
_MULTI_GROUP_VERSION = 8
_NO_TAGS: dict[int, bytes] = {}


class MultiGroupUnsupported(Exception):
    """The broker's ApiVersions stops below OffsetFetch v8: ask group by group."""


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
        # Called by aiokafka with the connection's negotiated versions, before anything is written.
        low, high = versions.get(_OFFSET_FETCH, (0, -1))
        if not low <= _MULTI_GROUP_VERSION <= high:
            raise MultiGroupUnsupported(f"OffsetFetch v{low}-v{high}")
        request: OffsetFetchRequestV8 = super().prepare(versions)
        return request

    def build(self, request_struct_class: type[OffsetFetchRequestV8]) -> OffsetFetchRequestV8:
        # require_stable false: offsets of open transactions are not waited for (a lag reader, not a consumer)
        groups: list[Any] = [(group, None, _NO_TAGS) for group in self._groups]
        return request_struct_class(groups, False, _NO_TAGS)

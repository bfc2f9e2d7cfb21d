"""OffsetFetch v8 on the wire, byte for byte against the layout of Kafka's OffsetFetchRequest.json and
OffsetFetchResponse.json (flexible: compact lengths are unsigned varints plus one, tagged fields); the
answers read directly (OffsetFetch v8, ListOffsets v3) equal what the declared schemas read."""

from __future__ import annotations

from io import BytesIO

import pytest
from aiokafka.structs import TopicPartition

from adapter.sources.kafka.connection import KafkaConnection
from adapter.sources.kafka.offsets import Committed, CommittedReader, Coordinators
from adapter.sources.kafka.protocol import (
    ListOffsets,
    ListOffsetsResponseV3,
    OffsetFetchGroups,
    OffsetFetchResponseV8,
    VersionUnsupported,
)
from tests.sources.kafka.helpers import source_config


def test_the_request_lists_the_groups_with_null_topics() -> None:
    request = OffsetFetchGroups(["a", "bc"]).prepare({9: (0, 9)})
    assert request.API_VERSION == 8
    # groups: 2 (+1); "a"; topics null; no tags; "bc"; topics null; no tags; require_stable false; no tags
    assert request.encode() == bytes([3, 2]) + b"a" + bytes([0, 0, 3]) + b"bc" + bytes([0, 0, 0, 0])
    # Request header v2: api key 9, version 8, correlation id, client id (int16 length), no tags
    header = request.build_request_header(7, "z").encode()
    assert header == bytes([0, 9, 0, 8, 0, 0, 0, 7, 0, 1]) + b"z" + bytes([0])


def test_a_broker_without_v8_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(VersionUnsupported):
        OffsetFetchGroups(["a"]).prepare({9: (1, 7)})


def test_the_response_gives_each_group_its_offsets_and_error() -> None:
    payload = (
        bytes([0, 0, 0, 0])  # throttle_time_ms
        + bytes([3])  # two groups
        + bytes([2])
        + b"g"
        + bytes([2, 2])  # one topic "t"
        + b"t"
        + bytes([2])  # one partition
        + bytes([0, 0, 0, 4])  # partition 4
        + (42).to_bytes(8, "big")  # committed offset
        + bytes([255, 255, 255, 255])  # leader epoch -1
        + bytes([0])  # metadata null
        + bytes([0, 0])  # error 0
        + bytes([0, 0])  # partition tags, topic tags
        + bytes([0, 0, 0])  # group error 0, group tags
        + bytes([2])
        + b"h"
        + bytes([1])  # topics: empty
        + bytes([0, 69, 0])  # group error 69 (GROUP_ID_NOT_FOUND), tags
        + bytes([1, 0, 1])  # response tags: one, tag 0, one byte
        + b"z"
    )
    response = OffsetFetchResponseV8.decode(payload)
    groups = [(group, topics, error) for group, topics, error, _tags in response.groups]
    assert groups == [("g", [("t", [(4, 42, -1, None, 0, {})], {})], 0), ("h", [], 69)]
    assert response.tags == {0: b"z"}


def test_the_direct_reader_reads_what_the_schema_reads() -> None:
    # More than 127 partitions (a two-byte varint), null and set metadata, non-ASCII names. (Tagged fields
    # are in the hand-made answer above: aiokafka's TaggedFields.encode leaves out each field's size.)
    no_tags: dict[int, bytes] = {}
    partitions = [(p, p * 1000, -1, None if p % 2 else "m", 0, no_tags) for p in range(130)]
    groups: list[object] = [
        (f"group-é{g}", [(f"topic-{t}", partitions, {}) for t in range(2)], g % 3, {}) for g in range(3)
    ]
    payload = OffsetFetchResponseV8.SCHEMA.encode([7, groups, {}])
    response = OffsetFetchResponseV8.decode(BytesIO(payload))
    assert (response.throttle_time_ms, response.groups, response.tags) == (7, groups, {})
    assert list(OffsetFetchResponseV8.SCHEMA.decode(BytesIO(payload))) == [7, groups, {}]


def test_list_offsets_answers_read_directly_as_the_schema_reads() -> None:
    topics = [(f"topic-{t}", [(p, 0 if p % 7 else 6, -1, p * 10) for p in range(t + 1)]) for t in range(40)]
    payload = ListOffsetsResponseV3.SCHEMA.encode([3, topics])
    response = ListOffsetsResponseV3.decode(BytesIO(payload))
    assert (response.throttle_time_ms, response.topics) == (3, topics)
    assert list(ListOffsetsResponseV3.SCHEMA.decode(BytesIO(payload))) == [3, topics]


def test_list_offsets_before_v3_is_left_to_aiokafka() -> None:
    with pytest.raises(VersionUnsupported):
        ListOffsets(-1, 0, [("t", [(0, -1)])]).prepare({2: (0, 2)})
    assert ListOffsets(-1, 0, [("t", [(0, -1)])]).prepare({2: (1, 10)}).API_VERSION == 3


# Hostile answers: lengths and counts come from the wire and are checked against the bytes received
# before they are used, so a broken or hostile broker costs one failed request, never a hung event loop.


# A topic name of 16 bytes, then partition count -1: the reader used to step back one partition's 22 bytes,
# landing where the topic began; with 2^31-1 topics announced it read the same 22 bytes over and over, in
# the event loop, keeping every copy (before the fix this test hung).
_LOOPING_TOPIC = (16).to_bytes(2, "big") + b"t" * 16 + (-1).to_bytes(4, "big", signed=True)


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ((2**31 - 1).to_bytes(4, "big") + _LOOPING_TOPIC, "topic count 2147483647"),
        ((1).to_bytes(4, "big") + _LOOPING_TOPIC, "partition count -1"),
        # A topic name said to be 500 bytes long where 4 are left.
        ((1).to_bytes(4, "big") + (500).to_bytes(2, "big") + b"tttt", "topic string of 500 bytes"),
    ],
)
def test_lengths_from_the_wire_are_checked_in_list_offsets(payload: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        ListOffsetsResponseV3.decode(bytes(4) + payload)


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        # A varint longer than any 32-bit count (each extra byte made a bigger number, without end).
        (bytes(4) + bytes([0xFF] * 6) + bytes([1]), "varint"),
        # 2^28 groups announced in a few bytes: more elements than bytes left.
        (bytes(4) + bytes([0x80, 0x80, 0x80, 0x80, 0x01]) + bytes(3), "groups"),
        # A group name said to be 100 bytes long where 1 is left: read short, then past the end.
        (bytes(4) + bytes([2, 101]) + b"g", "string"),
        # A tagged field said to hold 100 bytes where none are left.
        (bytes(4) + bytes([1, 1, 0, 100]), "tagged field"),
    ],
)
def test_lengths_from_the_wire_are_checked_in_offset_fetch(payload: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        OffsetFetchResponseV8.decode(payload)


async def test_a_partition_error_in_an_offset_fetch_answer_stays_with_its_partition() -> None:
    # Stand-in: an OffsetFetch v8 answer of the exact wire shape, read by the real reader. Group g has topic
    # "a" partition 0 at 42 and topic "b" partition 0 answered UNKNOWN_TOPIC_OR_PARTITION (3). That error used
    # to fail the whole group: every series of g, also those reading only "a".
    def partition(offset: int, error: int) -> bytes:
        head = bytes([2, 0, 0, 0, 0]) + offset.to_bytes(8, "big", signed=True) + bytes([255] * 4)
        return head + bytes([0]) + error.to_bytes(2, "big") + bytes([0, 0])  # metadata null, error, tags

    topics = bytes([3, 2]) + b"a" + partition(42, 0) + bytes([2]) + b"b" + partition(-1, 3)
    payload = bytes(4) + bytes([2, 2]) + b"g" + topics + bytes([0, 0, 0]) + bytes([0])
    conn = KafkaConnection(source_config("127.0.0.1:1"))
    reader = CommittedReader(conn, Coordinators(conn))
    answer = await reader._answers(["g"], OffsetFetchResponseV8.decode(payload), attempts=1)
    committed = answer["g"]
    assert isinstance(committed, Committed)
    assert committed.offsets == {TopicPartition("a", 0): 42}
    assert committed.errors == {TopicPartition("b", 0): "OffsetFetch answered UnknownTopicOrPartitionError"}


async def test_a_group_the_reader_did_not_ask_for_is_ignored() -> None:
    # Stand-in: an OffsetFetch v8 answer of the exact shape naming group "x", which was not asked for. Its
    # entry used to reach the round, which failed every group read with it (an internal KeyError).
    payload = bytes(4) + bytes([2, 2]) + b"x" + bytes([1, 0, 0, 0]) + bytes([0])
    conn = KafkaConnection(source_config("127.0.0.1:1"))
    reader = CommittedReader(conn, Coordinators(conn))
    answer = await reader._answers(["g"], OffsetFetchResponseV8.decode(payload), attempts=1)
    assert list(answer) == ["g"]
    assert str(answer["g"]) == "the broker's OffsetFetch answer left the group out"

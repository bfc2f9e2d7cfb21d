"""What each `query:` kind sends to Redis and how the replies become a value (docs/protocols.md#redis-commands).

Every read is a list of single-key commands handed to the batcher, so the reads of all series
of a source in one interval share one pipeline. Zeros come only from Redis itself: an empty or
missing list, a missing stream. Anything else that does not give a number raises SourceError.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from string import Template
from typing import Any

from redis import exceptions as rx

from adapter.config.redis import NAMESPACE, RedisMetric, placeholders
from adapter.sources.base import Sample, SourceError, SourceQuery
from adapter.sources.redis.batch import Command, Results, Send
from adapter.sources.redis.errors import command_error
from adapter.telemetry import redis as telemetry

# `length` counts whatever the key holds, by its type.
LENGTH_COMMANDS = {"list": "LLEN", "zset": "ZCARD", "set": "SCARD", "hash": "HLEN", "stream": "XLEN"}
# Remembered key types, so the steady state needs one round trip; bounded against key churn.
_MAX_REMEMBERED_TYPES = 100_000


@functools.lru_cache(maxsize=256)
def _parsed(template: str) -> tuple[Template, list[str], str | None]:
    """The template, its placeholder names, and the one name if the template is just `$name` / `${name}`."""
    names = placeholders(template)
    whole = names[0] if len(names) == 1 and template in (f"${names[0]}", f"${{{names[0]}}}") else None
    return Template(template), names, whole


def expand(template: str, query: SourceQuery) -> list[str]:
    """Every string the template makes from the selector's values (`key in (a,b)` gives two) and the asking
    namespace (`${namespace}`)."""
    parsed, names, whole = _parsed(template)
    params: Mapping[str, tuple[str, ...]] = query.params
    if NAMESPACE in names:
        params = {**params, NAMESPACE: (query.namespace,)}
    if whole is not None and params.get(whole):
        return list(params[whole])  # the common case, `${key}`, without substituting
    missing = [name for name in names if not params.get(name)]
    if missing:
        raise SourceError(f"the selector gives no value for {', '.join(missing)}")
    combos = itertools.product(*(params[name] for name in names))
    return [parsed.substitute(dict(zip(names, combo, strict=True))) for combo in combos]


def _value(results: Results, command: Command) -> Any:
    result = results[command]
    if isinstance(result, Exception):
        raise command_error(result, command)
    return result


class QueueReader:
    """Reads the queue depths of one source through its batcher."""

    def __init__(self, send: Send, source: str, clock: Callable[[], float] = time.time) -> None:
        self._send = send
        self._source = source
        self._clock = clock
        self._types: dict[str, str] = {}

    def keys_of(self, query: SourceQuery) -> list[str]:
        metric = query.metric
        assert isinstance(metric, RedisMetric)
        return expand(metric.redis_key, query)

    async def read(self, query: SourceQuery) -> list[Sample]:
        metric = query.metric
        assert isinstance(metric, RedisMetric)
        keys = expand(metric.redis_key, query)
        if metric.group is None:
            if metric.query == "length":  # in one frame: docs/architecture.md#hot-inlined-length-read
                commands = self._length_commands(keys)
                values, retype = self._lengths(keys, commands, await self._send(commands))
                if retype:
                    values.update(await self._retyped(retype))
            else:
                values = await self._by_key(metric, keys)
            return [Sample(Decimal(values[key]), {"key": key}) for key in keys]
        groups = expand(metric.group, query)
        pairs = list(itertools.product(keys, groups))
        counts = await self._streams(metric, pairs)
        return [Sample(Decimal(counts[pair]), {"key": pair[0], "group": pair[1]}) for pair in pairs]

    async def _by_key(self, metric: RedisMetric, keys: list[str]) -> dict[str, int]:
        if metric.query == "zset_due":
            now = self._clock()
            due = f"{now:.6f}" if metric.score_unit == "seconds" else str(int(now * 1000))
            commands: dict[str, Command] = {key: ("ZCOUNT", key, "-inf", due) for key in keys}
        else:  # stream_length
            commands = {key: ("XLEN", key) for key in keys}
        results = await self._send(list(commands.values()))
        return {key: int(_value(results, command)) for key, command in commands.items()}

    def _length_commands(self, keys: list[str]) -> list[Command]:
        """One command per key: the length command of the type the key had last time (list at first)."""
        types = self._types
        return [(LENGTH_COMMANDS[types.get(key, "list")], key) for key in keys]

    @staticmethod
    def _lengths(keys: list[str], commands: list[Command], results: Results) -> tuple[dict[str, int], list[str]]:
        """The lengths the replies give, and the keys that need their type read first.

        A missing key answers 0 to every length command (Redis deletes empty lists, sets, hashes
        and sorted sets), so only a key of another type needs more: it answers WRONGTYPE, and
        then TYPE goes out with every length command in a second trip.
        """
        lengths: dict[str, int] = {}
        retype: list[str] = []
        for key, command in zip(keys, commands, strict=True):
            reply = results[command]
            if type(reply) is int:  # the usual reply: no exception, no conversion
                lengths[key] = reply
            elif isinstance(reply, rx.ResponseError) and str(reply).startswith("WRONGTYPE"):
                retype.append(key)
            else:
                lengths[key] = int(_value(results, command))
        return lengths, retype

    async def _retyped(self, keys: list[str]) -> dict[str, int]:
        commands: list[Command] = []
        for key in keys:
            commands += [("TYPE", key), *((name, key) for name in LENGTH_COMMANDS.values())]
        results = await self._send(commands)
        lengths: dict[str, int] = {}
        for key in keys:
            kind = str(_value(results, ("TYPE", key)))
            if kind == "none":
                lengths[key] = 0  # deleted between the two trips
                continue
            if kind not in LENGTH_COMMANDS:
                raise SourceError(
                    f"WRONGTYPE: key {key!r} holds a {kind}; `length` counts lists, sorted sets, sets, hashes, streams"
                )
            self._remember(key, kind)
            lengths[key] = int(_value(results, (LENGTH_COMMANDS[kind], key)))
        return lengths

    def _remember(self, key: str, kind: str) -> None:
        if key not in self._types and len(self._types) >= _MAX_REMEMBERED_TYPES:
            self._types.clear()
        self._types[key] = kind

    async def _streams(self, metric: RedisMetric, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
        keys = list(dict.fromkeys(key for key, _ in pairs))
        commands: list[Command] = [("XLEN", key) for key in keys]
        if metric.query == "stream_pending":
            commands += [("XPENDING", key, group) for key, group in pairs]
        else:
            commands += [("XINFO GROUPS", key) for key in keys]
        results = await self._send(commands)
        counts: dict[tuple[str, str], int] = {}
        estimate: list[tuple[str, str, int, int | None]] = []
        for key, group in pairs:
            length = int(_value(results, ("XLEN", key)))
            if metric.query == "stream_pending":
                counts[key, group] = self._pending(results, key, group, length)
                continue
            info = self._group_info(results, key, group)
            if info is None:
                # No stream (0), or the consumers have not created the group yet: everything is waiting.
                counts[key, group] = length
                continue
            pending = int(info["pending"])
            lag = info.get("lag")
            if lag is None:
                entries_read = info.get("entries-read")
                estimate.append((key, group, pending, None if entries_read is None else int(entries_read)))
                continue
            counts[key, group] = int(lag) + (pending if metric.query == "stream_backlog" else 0)
        if estimate:
            counts.update(await self._estimate_lag(metric, estimate))
        return counts

    @staticmethod
    def _pending(results: Results, key: str, group: str, length: int) -> int:
        reply = results[("XPENDING", key, group)]
        if isinstance(reply, rx.ResponseError) and str(reply).startswith("NOGROUP"):
            return length  # no stream (0), or the group is not created yet: all entries wait
        return int(_value(results, ("XPENDING", key, group))["pending"])

    @staticmethod
    def _group_info(results: Results, key: str, group: str) -> dict[str, Any] | None:
        reply = results[("XINFO GROUPS", key)]
        if isinstance(reply, rx.ResponseError) and "no such key" in str(reply):
            return None
        groups: list[dict[str, Any]] = _value(results, ("XINFO GROUPS", key))
        return next((g for g in groups if g.get("name") == group), None)

    async def _estimate_lag(
        self, metric: RedisMetric, rows: list[tuple[str, str, int, int | None]]
    ) -> dict[tuple[str, str], int]:
        """Redis said lag is NULL (group set to an arbitrary ID, or entries deleted): serve an upper bound.

        Undelivered entries are still stored (at most XLEN of them) and were added after the group's
        read counter (at most entries-added - entries-read). The smaller bound is served, so a
        waiting workload is never reported idle; a NULL counter leaves XLEN.
        """
        commands: list[Command] = [("XINFO STREAM", key) for key in dict.fromkeys(row[0] for row in rows)]
        results = await self._send(commands)
        counts: dict[tuple[str, str], int] = {}
        for key, group, pending, entries_read in rows:
            info = _value(results, ("XINFO STREAM", key))
            lag = int(info["length"])
            if entries_read is not None:
                lag = max(0, min(lag, int(info["entries-added"]) - entries_read))
            counts[key, group] = lag + (pending if metric.query == "stream_backlog" else 0)
            telemetry.LAG_ESTIMATED.labels(self._source, metric.name).inc()
        return counts

"""Turn redis-py exceptions into SourceError messages that name the cause (they end up in the HPA's events).

Messages name the server and the key, never credentials: redis-py's own texts carry neither
passwords nor URLs, and we add only host:port.
"""

from __future__ import annotations

from redis import exceptions as rx
from redis.asyncio.sentinel import MasterNotFoundError

from adapter.sources.base import SourceError


def connection_error(err: BaseException, target: str) -> SourceError:
    """A failure of the whole round trip: nothing was read."""
    detail = str(err) or type(err).__name__
    match err:
        case rx.AuthenticationError():
            cause = f"authentication to {target} failed (wrong username or password, or the ACL user is off): {detail}"
        case MasterNotFoundError():
            cause = f"{target}: the Sentinels know no reachable master ({detail})"
        case rx.TimeoutError() | TimeoutError():
            cause = f"{target} did not answer in time: {detail}"
        case rx.ClusterDownError() | rx.SlotNotCoveredError():
            cause = f"cluster {target} cannot serve every slot (CLUSTERDOWN or slots moving): {detail}"
        case rx.AskError() | rx.TryAgainError():
            cause = f"cluster {target}: keys kept moving between nodes (MOVED/ASK) after retries: {detail}"
        case rx.RedisClusterException() | rx.ClusterError():
            cause = f"cluster {target}: {detail}"
        case rx.NoPermissionError():
            cause = f"the ACL user may not run a command this source needs on {target}: {detail}"
        case rx.ConnectionError() | OSError():
            cause = f"cannot reach {target}: {detail}"
        case _:
            cause = f"{target}: {type(err).__name__}: {detail}"
    return SourceError(cause)


def command_error(err: BaseException, command: tuple[str, ...]) -> SourceError:
    """A failure of one command inside a pipeline that otherwise went through."""
    key = command[1] if len(command) > 1 else ""
    detail = str(err) or type(err).__name__
    if isinstance(err, rx.NoPermissionError):
        return SourceError(f"the ACL user may not run {command[0]} on key {key!r}: {detail}")
    if isinstance(err, rx.ResponseError) and detail.startswith("WRONGTYPE"):
        return SourceError(f"WRONGTYPE: {command[0]} cannot read key {key!r}: it holds another data type")
    if isinstance(err, rx.AskError | rx.TryAgainError):
        return SourceError(f"key {key!r} is moving between cluster nodes (MOVED/ASK): {detail}")
    return SourceError(f"{command[0]} {key!r} failed: {detail}")

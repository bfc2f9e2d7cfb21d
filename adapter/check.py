"""`zeroscale check`: connect to every configured source once and say which fail."""

from __future__ import annotations

import asyncio

from adapter.config import ZeroscaleConfig
from adapter.sources import SourceError, build_source


async def check_sources(config: ZeroscaleConfig) -> int:
    """Print one line per source; return 0 when all answered, 1 otherwise."""
    for warning in config.grpc.unauthenticated():
        print(f"WARNING {warning}")
    limit = config.cache.query_timeout
    failures = 0
    for source_config in config.sources:
        source = build_source(source_config)
        try:
            await asyncio.wait_for(source.check(), limit)
        except (SourceError, TimeoutError) as err:
            failures += 1
            reason = str(err) or f"no answer within {limit:g}s"
            print(f"source {source_config.name} ({source_config.type}): FAILED: {reason}")
        else:
            print(f"source {source_config.name} ({source_config.type}): ok")
        finally:
            await source.close()
    return 1 if failures else 0

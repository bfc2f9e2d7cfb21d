"""The `redis` source: queue depths from lists, sorted sets and streams. `source.RedisQueues` is the entry.

Empty on purpose, like every source package. Its config models live in adapter/config/redis.py; the
redis-py internals it relies on are fenced in `internals`.
"""

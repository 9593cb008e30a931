"""Shared pieces of the Redis sink tests: a reader of the test's own streams on the session's redis-server.

Every test uses streams under its own ``topic_prefix`` (``{prefix}.{aggregate_type}``,
dead letters ``{prefix}.dlq``) and deletes them. Entries read back are turned into
``tests.support.Msg`` so that ``wal_support.assert_contract`` checks them as it checks
Kafka records: the stream is the topic, the offset the entry's place in its stream, the
key the ``aggregate_id`` field, the value the ``payload`` field, the other fields headers.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any

import redis

from tests.integration.wal_support import AGGREGATE_TYPES
from tests.support import Msg, wait_for

OWN = ("payload", "aggregate_id", "timestamp")


def redis_args(prefix: str, *extra: str) -> tuple[str, ...]:
    """Relay options sending to streams ``{prefix}.{aggregate_type}``, dead letters to ``{prefix}.dlq``."""
    return ("--sink", "redis", "--topic-pattern", f"{prefix}.{{aggregate_type}}",
            "--dead-letter-topic", f"{prefix}.dlq", *extra)


class RedisReader:
    """Reads the test's streams (XRANGE, from the start each time) and deletes them at the end."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix
        self.client: Any = redis.Redis.from_url(url)

    def stream(self, name: str) -> list[Msg]:
        """Every entry of ``{prefix}.{name}``, in stream order."""
        key = f"{self.prefix}.{name}"
        return [to_msg(key, fields, offset)
                for offset, (_, fields) in enumerate(self.client.xrange(key))]

    def everything(self, names: tuple[str, ...] = AGGREGATE_TYPES) -> list[Msg]:
        return [m for name in names for m in self.stream(name)]

    def collect(self, until: Callable[[list[Msg]], bool], names: tuple[str, ...] = AGGREGATE_TYPES,
                timeout: float = 90.0) -> list[Msg]:
        """Read until ``until(everything read)``; return everything read."""
        got: list[Msg] = []

        def read() -> bool:
            got[:] = self.everything(names)
            return until(got)

        wait_for(read, timeout=timeout, interval=0.1, message=f"the entries of {names}")
        return got

    def close(self) -> None:
        with suppress(Exception):
            keys = list(self.client.scan_iter(match=f"{self.prefix}.*"))
            if keys:
                self.client.delete(*keys)
        self.client.close()


def to_msg(stream: str, fields: dict[bytes, bytes], offset: int) -> Msg:
    decoded = {k.decode(): v for k, v in fields.items()}
    headers = {k: v for k, v in decoded.items() if k not in ("payload",)}
    return Msg(topic=stream, partition=0, offset=offset, key=decoded.get("aggregate_id"),
               value=decoded.get("payload"), headers=headers,
               timestamp=int(decoded.get("timestamp", b"0")))


def ids_of(messages: list[Msg]) -> set[str]:
    return {m.headers["id"].decode() for m in messages}

"""Settings of the Redis Streams sink: ``--brokers`` and ``--sink-config`` parsed and checked.

Pure: redis-py is not imported here, so the CLI can validate a command line before the
client library loads (docs/sinks.md, Redis Streams). ``parse_redis`` turns the address
(``redis://[USER:PASSWORD@]HOST:PORT[/DB]``, ``rediss://`` for TLS) and the repeated
``KEY=VALUE`` settings into one frozen ``RedisConfig``, and refuses ``--header`` names
that would overwrite the entry's own fields. Must not: do I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from cdc_relay.errors import ConfigError, mask_secrets
from cdc_relay.sink.common import positive_float, positive_int, settings_of

# Fields every stream entry has besides the message's headers (docs/sinks.md).
OWN_FIELDS = ("payload", "aggregate_id", "timestamp")
_KEYS = ("maxlen", "batch_size", "concurrency", "max_in_flight", "max_message_bytes",
         "connect_timeout", "read_timeout", "tls_ca_file", "tls_cert_file", "tls_key_file")


@dataclass(frozen=True, slots=True)
class RedisConfig:
    """The Redis Streams sink (docs/sinks.md): where to XADD and how much may be unconfirmed."""

    url: str
    dead_letter_stream: str = "outbox.dead-letters"
    topic_pattern: str = "outbox.event.{aggregate_type}"  # for doctor's look at the streams
    maxlen: int = 0  # XADD MAXLEN ~ N; 0: no trimming
    batch_size: int = 100  # XADDs per pipeline
    concurrency: int = 2  # pipelines in flight at once
    max_in_flight: int = 10_000
    max_message_bytes: int = 64 << 20
    message_timeout_ms: int = 30_000
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @property
    def where(self) -> str:
        """The address for messages, without its password."""
        return mask_secrets(self.url)


def check_headers(header_names: Sequence[str]) -> None:
    """A ``--header`` name equal to one of the entry's own fields would overwrite it: refused."""
    for name in header_names:
        if name in OWN_FIELDS:
            raise ConfigError(f"--header name {name!r} is one of the Redis stream entry's own "
                              "fields (payload, aggregate_id, timestamp); rename it with COLUMN:NAME")


def parse_redis(brokers: str, items: Iterable[str], *, topic_pattern: str, dead_letter_topic: str,
                header_names: Sequence[str] = (), message_timeout_ms: int = 30_000) -> RedisConfig:
    """The Redis config of ``--brokers redis://HOST:PORT[/DB]`` and ``--sink-config``."""
    url = brokers.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ConfigError(f"invalid --brokers {mask_secrets(url)!r} for the redis sink: expected "
                          "redis://[USER:PASSWORD@]HOST:PORT[/DB] (or rediss:// for TLS)")
    s = settings_of(items, _KEYS, "redis")
    check_headers(header_names)
    return RedisConfig(
        url=url, dead_letter_stream=dead_letter_topic, topic_pattern=topic_pattern,
        maxlen=positive_int(s, "maxlen", 0, zero=True),
        batch_size=positive_int(s, "batch_size", 100),
        concurrency=positive_int(s, "concurrency", 2),
        max_in_flight=positive_int(s, "max_in_flight", 10_000),
        max_message_bytes=positive_int(s, "max_message_bytes", 64 << 20),
        message_timeout_ms=message_timeout_ms,
        connect_timeout=positive_float(s, "connect_timeout", 5.0),
        read_timeout=positive_float(s, "read_timeout", 10.0),
        tls_ca_file=s.get("tls_ca_file"), tls_cert_file=s.get("tls_cert_file"),
        tls_key_file=s.get("tls_key_file"),
    )

"""Settings of the Amazon Kinesis sink: ``--brokers`` and ``--sink-config`` parsed and checked; its limits.

Pure: boto3 is not imported here, so the CLI can validate a command line before the
client library loads (docs/sinks.md, Amazon Kinesis). ``parse_kinesis`` turns the address
(``kinesis://REGION`` for AWS's endpoint, ``http[s]://HOST:PORT`` for another) and the
repeated ``KEY=VALUE`` settings into one frozen ``KinesisConfig``, and refuses at
start-up a topic pattern or dead-letter name that can never be a stream name. Must not:
do I/O or read the environment (boto3's standard chain does that, in sink/kinesis/client.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from cdc_relay.errors import ConfigError, mask_secrets
from cdc_relay.sink.common import aws_address, aws_region, positive_float, positive_int, settings_of

MAX_RECORDS = 500  # PutRecords: records per call
MAX_BATCH_BYTES = 5 * 1024 * 1024  # PutRecords: data and partition keys per call
MAX_RECORD_BYTES = 1024 * 1024  # one record's data and partition key
MAX_PARTITION_KEY = 256  # characters
_STREAM = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_KEYS = ("region", "profile", "concurrency", "max_in_flight", "batch_size", "record_format",
         "connect_timeout", "read_timeout")
RECORD_FORMATS = ("envelope", "value")


@dataclass(frozen=True, slots=True)
class KinesisConfig:
    """The Kinesis sink (docs/sinks.md): where to put records and how much may be unconfirmed."""

    endpoint_url: str | None  # None: AWS's regional endpoint
    region: str | None = None
    profile: str | None = None
    dead_letter_stream: str = "outbox.dead-letters"
    topic_pattern: str = "outbox.event.{aggregate_type}"
    record_format: str = "envelope"  # envelope: headers in the data; value: the value alone
    batch_size: int = MAX_RECORDS
    concurrency: int = 4  # PutRecords calls in flight at once
    max_in_flight: int = 10_000
    message_timeout_ms: int = 30_000
    connect_timeout: float = 5.0
    read_timeout: float = 10.0

    @property
    def where(self) -> str:
        """The address for messages: the endpoint, or ``kinesis://REGION``."""
        return mask_secrets(self.endpoint_url) if self.endpoint_url else f"kinesis://{self.region}"


def stream_name_problem(name: str) -> str | None:
    """Why ``name`` is not a legal Kinesis stream name, or None."""
    if not _STREAM.fullmatch(name):
        return (f"stream name {name[:60]!r} is not legal in Kinesis: 1 to 128 letters, digits, "
                "'_', '-' and '.'")
    return None


def parse_kinesis(brokers: str, items: Iterable[str], *, topic_pattern: str,
                  dead_letter_topic: str, message_timeout_ms: int = 30_000) -> KinesisConfig:
    """The Kinesis config of ``--brokers`` and ``--sink-config``."""
    endpoint, region = aws_address(brokers, "kinesis")
    s = settings_of(items, _KEYS, "kinesis")
    region = aws_region(s, region, "kinesis")
    for name in (dead_letter_topic, re.sub(r"\{[a-z_]+\}", "x", topic_pattern)):
        problem = stream_name_problem(name)
        if problem is not None:
            raise ConfigError(f"{problem}; fix --topic-pattern or --dead-letter-topic")
    record_format = s.get("record_format", "envelope")
    if record_format not in RECORD_FORMATS:
        raise ConfigError(f"invalid --sink-config record_format={record_format!r}: expected "
                          "envelope (headers kept) or value (the value alone)")
    batch_size = positive_int(s, "batch_size", MAX_RECORDS)
    if batch_size > MAX_RECORDS:
        raise ConfigError(f"invalid --sink-config batch_size={batch_size}: PutRecords takes at "
                          f"most {MAX_RECORDS} records")
    return KinesisConfig(
        endpoint_url=endpoint, region=region, profile=s.get("profile") or None,
        dead_letter_stream=dead_letter_topic, topic_pattern=topic_pattern,
        record_format=record_format, batch_size=batch_size,
        concurrency=positive_int(s, "concurrency", 4),
        max_in_flight=positive_int(s, "max_in_flight", 10_000),
        message_timeout_ms=message_timeout_ms,
        connect_timeout=positive_float(s, "connect_timeout", 5.0),
        read_timeout=positive_float(s, "read_timeout", 10.0),
    )

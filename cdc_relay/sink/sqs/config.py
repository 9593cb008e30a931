"""Settings of the Amazon SQS sink: ``--brokers`` and ``--sink-config`` parsed and checked, and its limits.

Pure: boto3 is not imported here, so the CLI can validate a command line before the
client library loads (docs/sinks.md, Amazon SQS). ``parse_sqs`` turns the address
(``http[s]://HOST:PORT`` for an endpoint, ``sqs://REGION`` for AWS's own) and the
repeated ``KEY=VALUE`` settings into one frozen ``SqsConfig`` and raises ConfigError
naming the key and the fix. It also refuses, at start-up, ``--header`` columns that
SQS's limit of 10 message attributes cannot hold, and header names SQS does not accept
as attribute names: a message is never sent with an attribute silently left out.

Must not: do I/O or read the environment (boto3's standard chain does that, in sink/sqs/sink.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cdc_relay.errors import ConfigError, mask_secrets
from cdc_relay.sink.batches import MAX_ENTRIES
from cdc_relay.sink.common import aws_address, aws_region, settings_of

# --topic-pattern and --dead-letter-topic for this sink when they are left at Kafka's
# defaults (which are no legal queue names: SQS allows '.' only in the .fifo suffix).
DEFAULT_QUEUE_PATTERN = "outbox-event-{aggregate_type}.fifo"
DEFAULT_DEAD_LETTER_QUEUE = "outbox-dead-letters.fifo"
KAFKA_TOPIC_PATTERN = "outbox.event.{aggregate_type}"
KAFKA_DEAD_LETTER_TOPIC = "outbox.dead-letters"

MAX_ATTRIBUTES = 10  # SQS: message attributes per message
# Attributes a message may carry besides the --header columns: id, event_type,
# aggregate_type, aggregate_id, traceparent, tracestate, and a dead letter's error,
# original_topic and (when its payload was too large) payload_omitted_bytes.
RESERVED_ATTRIBUTES = ("id", "event_type", "aggregate_type", "aggregate_id", "traceparent",
                       "tracestate", "error", "original_topic", "payload_omitted_bytes")
MAX_HEADER_COLUMNS = MAX_ATTRIBUTES - len(RESERVED_ATTRIBUTES)
DEFAULT_MAX_MESSAGE_BYTES = 262_144  # SQS's default MaximumMessageSize (256 KiB)
LARGEST_MESSAGE_BYTES = 1_048_576  # the largest MaximumMessageSize a queue may have (1 MiB)
MAX_QUEUE_NAME = 80
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")

_KEYS = ("region", "profile", "concurrency", "max_in_flight", "connect_timeout", "read_timeout")


@dataclass(frozen=True, slots=True)
class SqsConfig:
    """The SQS sink (docs/sinks.md): where to send and how much may be unconfirmed."""

    endpoint_url: str | None  # None: AWS's regional endpoint
    region: str | None = None  # None: the environment's (sink/sqs/client.py, region_chain)
    profile: str | None = None
    dead_letter_queue: str = DEFAULT_DEAD_LETTER_QUEUE
    topic_pattern: str = DEFAULT_QUEUE_PATTERN  # for doctor's check of the queues
    concurrency: int = 4  # SendMessageBatch calls in flight at once
    max_in_flight: int = 10_000
    message_timeout_ms: int = 30_000
    connect_timeout: float = 5.0
    read_timeout: float = 10.0

    @property
    def where(self) -> str:
        """The address for messages: the endpoint, or ``sqs://REGION``."""
        return mask_secrets(self.endpoint_url) if self.endpoint_url else f"sqs://{self.region}"

    @property
    def batch_size(self) -> int:
        """Entries per SendMessageBatch: SQS's limit."""
        return MAX_ENTRIES


def sqs_topics(topic_pattern: str, dead_letter_topic: str) -> tuple[str, str]:
    """The queue pattern and dead-letter queue: Kafka's defaults become SQS's (module docstring)."""
    if topic_pattern == KAFKA_TOPIC_PATTERN:
        topic_pattern = DEFAULT_QUEUE_PATTERN
    if dead_letter_topic == KAFKA_DEAD_LETTER_TOPIC:
        dead_letter_topic = DEFAULT_DEAD_LETTER_QUEUE
    return topic_pattern, dead_letter_topic


def queue_name_problem(name: str) -> str | None:
    """Why ``name`` is not a legal SQS queue name, or None."""
    stem = name[:-5] if name.endswith(".fifo") else name
    if len(name) > MAX_QUEUE_NAME:
        return f"queue name {name[:60]!r}... is {len(name)} characters long (SQS allows 80)"
    if not _QUEUE_NAME.fullmatch(stem):
        return (f"queue name {name!r} is not legal in SQS: only letters, digits, '-' and '_', "
                "plus the suffix .fifo for a FIFO queue")
    return None


def attribute_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an SQS message attribute name, or None."""
    lowered = name.lower()
    if (not _ATTRIBUTE_NAME.fullmatch(name) or name.startswith(".") or name.endswith(".")
            or ".." in name or lowered.startswith(("aws.", "amazon."))):
        return (f"{name!r} is not a legal SQS message attribute name (letters, digits, '_', "
                "'-' and '.', not at either end nor doubled, no AWS. or Amazon. prefix)")
    return None


def _positive(key: str, value: str, kind: type[int] | type[float] = int) -> float:
    try:
        number = kind(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise ConfigError(f"invalid --sink-config {key}={value!r}: expected a positive number")
    return number


def check_queue_names(topic_pattern: str, dead_letter_queue: str) -> None:
    """ConfigError when the dead-letter queue, or every queue of the pattern, is illegal."""
    problem = queue_name_problem(dead_letter_queue)
    if problem is not None:
        raise ConfigError(f"invalid dead-letter queue (--dead-letter-topic): {problem}")
    sample = topic_pattern.replace("{aggregate_type}", "x").replace("{event_type}", "x")
    sample = sample.replace("{schema}", "x").replace("{table}", "x")
    problem = queue_name_problem(sample)
    if problem is not None:
        raise ConfigError(f"invalid --topic-pattern {topic_pattern!r} for the sqs sink: {problem} "
                          f"(e.g. {DEFAULT_QUEUE_PATTERN})")


def check_headers(header_names: Sequence[str], message_format: str = "raw") -> None:
    """ConfigError when the ``--header`` names (and the message format's own headers) do not
    fit SQS's attributes (module docstring)."""
    if message_format == "cloudevents":
        raise ConfigError("--message-format cloudevents (binary mode) adds up to 9 ce_* headers, "
                          f"more than SQS's {MAX_ATTRIBUTES} message attributes allow beside the "
                          "relay's own: use --message-format cloudevents-structured with the sqs sink")
    reserved = (*RESERVED_ATTRIBUTES, "content-type") if message_format.startswith(
        "cloudevents") else RESERVED_ATTRIBUTES
    room = MAX_ATTRIBUTES - len(reserved)
    if len(header_names) > room:
        raise ConfigError(
            f"{len(header_names)} --header columns do not fit SQS's {MAX_ATTRIBUTES} message "
            f"attributes: {len(reserved)} are the relay's own (" + ", ".join(reserved)
            + f"), so at most {room} --header columns can be sent; drop some (the payload can "
            "carry them)")
    for name in header_names:
        problem = attribute_name_problem(name)
        if problem is not None:
            raise ConfigError(f"invalid --header name for the sqs sink: {problem}; rename it "
                              "with COLUMN:NAME")
        if name in (*RESERVED_ATTRIBUTES, "content-type"):
            raise ConfigError(f"--header name {name!r} is one of the relay's own attributes; "
                              "rename it with COLUMN:NAME")


def parse_sqs(brokers: str, items: Iterable[str], *, topic_pattern: str, dead_letter_topic: str,
              header_names: Sequence[str] = (), message_format: str = "raw",
              message_timeout_ms: int = 30_000) -> SqsConfig:
    """The SQS config of ``--brokers`` and ``--sink-config`` (queue names as ``sqs_topics`` gives)."""
    endpoint, region = aws_address(brokers, "sqs")
    settings = settings_of(items, _KEYS, "sqs")
    region = aws_region(settings, region, "sqs")
    check_queue_names(topic_pattern, dead_letter_topic)
    check_headers(header_names, message_format)
    return SqsConfig(
        endpoint_url=endpoint, region=region, profile=settings.get("profile") or None,
        dead_letter_queue=dead_letter_topic, topic_pattern=topic_pattern,
        concurrency=int(_positive("concurrency", settings.get("concurrency", "4"))),
        max_in_flight=int(_positive("max_in_flight", settings.get("max_in_flight", "10000"))),
        message_timeout_ms=message_timeout_ms,
        connect_timeout=_positive("connect_timeout", settings.get("connect_timeout", "5"), float),
        read_timeout=_positive("read_timeout", settings.get("read_timeout", "10"), float),
    )

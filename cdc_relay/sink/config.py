"""Settings of the RabbitMQ and NATS sinks: ``--brokers`` and ``--sink-config`` parsed and checked.

Pure but for checking that named files exist: no broker client is imported here, so the
CLI can validate a command line (and say which ``pip install`` is missing) before any
client library loads. Each sink gets one
frozen config; ``parse_rabbitmq`` / ``parse_nats`` turn the address and the repeated
``KEY=VALUE`` settings into it and raise ConfigError naming the key and the fix.
``SinkProbe`` is what a sink's doctor probe reports (ops/doctor turns it into checks).

The Kafka sink keeps its own config (``cdc_relay.config.KafkaConfig``); ``SINK_KINDS``
lists every sink ``--sink`` accepts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from cdc_relay.config import parse_duration
from cdc_relay.errors import ConfigError, ExitCode, mask_secrets
from cdc_relay.sink.common import flag, settings_of

# sqs, redis, http, kinesis: their own config modules (sink/<name>/config.py)
SINK_KINDS = ("kafka", "rabbitmq", "nats", "sqs", "redis", "http", "kinesis")


@dataclass(frozen=True, slots=True)
class RabbitMqConfig:
    """The RabbitMQ sink (docs/sinks.md): where to publish and how much may be unconfirmed."""

    url: str
    exchange: str = "outbox"
    declare_exchange: bool = True
    dead_letter_exchange: str | None = None  # None: the main exchange
    dead_letter_routing_key: str = "outbox.dead-letters"  # the router's dead-letter topic
    dead_letter_queue: str | None = "outbox.dead-letters"  # declared + bound; None: not declared
    max_in_flight: int = 10_000
    max_message_bytes: int = 16 * 1024 * 1024  # RabbitMQ 4's default max_message_size
    message_timeout_ms: int = 30_000
    heartbeat: int = 30
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @property
    def dlx(self) -> str:
        """The exchange dead letters go to."""
        return self.exchange if self.dead_letter_exchange is None else self.dead_letter_exchange


@dataclass(frozen=True, slots=True)
class NatsConfig:
    """The NATS JetStream sink (docs/sinks.md)."""

    servers: tuple[str, ...]
    stream: str = "OUTBOX"
    create_stream: bool = True
    stream_subjects: tuple[str, ...] = ()  # for creation; () = derived from the topic pattern
    duplicate_window: float = 120.0  # seconds; the server's default is 2 minutes
    max_in_flight: int = 10_000
    message_timeout_ms: int = 30_000
    user: str | None = None
    password: str | None = None
    token: str | None = None
    credentials_file: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None


@dataclass(frozen=True, slots=True)
class SinkProbe:
    """One finding of a sink's doctor probe: ``ok`` None means a warning. ``exit_code``:
    a failure that is the broker unreachable (UNAVAILABLE) or refusing the credentials
    (REFUSED), as doctor exits for it (docs/operations.md, exit codes)."""

    name: str
    ok: bool | None
    detail: str
    fix: str | None = None
    exit_code: ExitCode | None = None


def _positive(key: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ConfigError(f"invalid --sink-config {key}={value!r}: expected a positive integer")
    return number


_RABBIT_KEYS = ("exchange", "declare_exchange", "dead_letter_exchange", "dead_letter_queue",
                "max_in_flight", "max_message_bytes", "heartbeat", "tls_ca_file", "tls_cert_file",
                "tls_key_file")


def parse_rabbitmq(brokers: str, items: Iterable[str], *, dead_letter_topic: str,
                   message_timeout_ms: int = 30_000) -> RabbitMqConfig:
    """The RabbitMQ config of ``--brokers amqp://user:pass@host:port/vhost`` and ``--sink-config``."""
    url = brokers.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        raise ConfigError(f"invalid --brokers {mask_secrets(url)!r} for the rabbitmq sink: "
                          "expected amqp://USER:PASSWORD@HOST:PORT/VHOST (or amqps://)")
    s = settings_of(items, _RABBIT_KEYS, "rabbitmq")
    exchange = s.get("exchange", "outbox")
    if not exchange:
        raise ConfigError("invalid --sink-config exchange=: the relay cannot publish to the "
                          "default exchange; name a topic exchange, e.g. exchange=outbox")
    return RabbitMqConfig(
        url=url, exchange=exchange,
        declare_exchange=flag(s, "declare_exchange", True),
        dead_letter_exchange=s.get("dead_letter_exchange") or None,
        dead_letter_routing_key=dead_letter_topic,
        dead_letter_queue=s.get("dead_letter_queue", dead_letter_topic) or None,
        max_in_flight=_positive("max_in_flight", s.get("max_in_flight", "10000")),
        max_message_bytes=_positive("max_message_bytes", s.get("max_message_bytes", str(16 << 20))),
        message_timeout_ms=message_timeout_ms,
        heartbeat=_positive("heartbeat", s.get("heartbeat", "30")),
        tls_ca_file=s.get("tls_ca_file"), tls_cert_file=s.get("tls_cert_file"),
        tls_key_file=s.get("tls_key_file"),
    )


_NATS_KEYS = ("stream", "create_stream", "stream_subjects", "duplicate_window", "max_in_flight",
              "user", "password", "token", "credentials_file", "tls_ca_file", "tls_cert_file",
              "tls_key_file")


def parse_nats(brokers: str, items: Iterable[str], *, topic_pattern: str, dead_letter_topic: str,
               message_timeout_ms: int = 30_000) -> NatsConfig:
    """The NATS config of ``--brokers nats://host:port,...`` and ``--sink-config``."""
    servers = tuple(s.strip() for s in brokers.split(",") if s.strip())
    for server in servers:
        parts = urlsplit(server)
        if parts.scheme not in ("nats", "tls") or not parts.hostname:
            raise ConfigError(f"invalid --brokers entry {mask_secrets(server)!r} for the nats "
                              "sink: expected nats://HOST:PORT[,nats://HOST:PORT...] (or tls://)")
    if not servers:
        raise ConfigError("no brokers given: pass --brokers nats://HOST:PORT")
    s = settings_of(items, _NATS_KEYS, "nats")
    stream = s.get("stream", "OUTBOX")
    if not stream or any(c in stream for c in " .*>\t"):
        raise ConfigError(f"invalid --sink-config stream={stream!r}: a JetStream stream name "
                          "may not contain spaces, '.', '*' or '>'")
    subjects = tuple(x.strip() for x in s.get("stream_subjects", "").split(",") if x.strip())
    if not subjects:
        subjects = default_subjects(topic_pattern, dead_letter_topic)
    try:
        window = parse_duration(s.get("duplicate_window", "2m"), "duplicate_window")
    except ConfigError as exc:
        raise ConfigError(f"invalid --sink-config {exc}") from exc
    return NatsConfig(
        servers=servers, stream=stream,
        create_stream=flag(s, "create_stream", True),
        stream_subjects=subjects, duplicate_window=window,
        max_in_flight=_positive("max_in_flight", s.get("max_in_flight", "10000")),
        message_timeout_ms=message_timeout_ms,
        user=s.get("user"), password=s.get("password"), token=s.get("token"),
        credentials_file=s.get("credentials_file"), tls_ca_file=s.get("tls_ca_file"),
        tls_cert_file=s.get("tls_cert_file"), tls_key_file=s.get("tls_key_file"),
    )


def default_subjects(topic_pattern: str, dead_letter_topic: str) -> tuple[str, ...]:
    """Stream subjects covering every subject the pattern can make, plus the dead letters.

    The literal tokens before the first placeholder stay, the rest becomes ``>``
    (``outbox.event.{aggregate_type}`` -> ``outbox.event.>``): an aggregate type that
    contains dots is covered too. A pattern that starts with a placeholder would need a
    stream on every subject; then ``stream_subjects`` must be given.
    """
    literal: list[str] = []
    for token in topic_pattern.split("."):
        if "{" in token:
            break
        literal.append(token)
    else:  # no placeholder: one subject
        return tuple(dict.fromkeys([topic_pattern, dead_letter_topic]))
    if not literal:
        raise ConfigError(f"the topic pattern {topic_pattern!r} starts with a placeholder: give "
                          "the stream's subjects with --sink-config stream_subjects=SUBJ,SUBJ "
                          "(or use a pattern such as outbox.event.{aggregate_type})")
    wildcard = ".".join([*literal, ">"])
    prefix = ".".join(literal) + "."
    extra = [] if dead_letter_topic.startswith(prefix) else [dead_letter_topic]
    return (wildcard, *extra)


def subject_problem(subject: str) -> str | None:
    """Why ``subject`` cannot be published to on NATS, or None."""
    if not subject or any(not token for token in subject.split(".")):
        return f"subject {subject!r} has an empty token (a leading, trailing or doubled '.')"
    if any(c in subject for c in " \t\r\n*>"):
        return f"subject {subject!r} contains whitespace or a wildcard ('*', '>')"
    return None

"""Picking the sink: ``--sink kafka|rabbitmq|nats|sqs|redis|...`` -> a SinkFactory, and doctor's probe.

The composition roots (app/run.py, app/poll.py) and doctor call this instead of a
sink module, so they never import a broker client themselves. The RabbitMQ, NATS, SQS,
Redis, HTTP and Kinesis clients are optional extras: they are imported only here, on demand, and a missing one
is a ConfigError naming the ``pip install`` to run (one line, exit 2), not a traceback.
Must not hold state or start I/O: it only chooses and builds.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

from cdc_relay.config import KafkaConfig
from cdc_relay.errors import ConfigError
from cdc_relay.sink.base import SinkFactory
from cdc_relay.sink.config import NatsConfig, RabbitMqConfig, SinkProbe
from cdc_relay.sink.http.config import HttpConfig
from cdc_relay.sink.kinesis.config import KinesisConfig
from cdc_relay.sink.redis.config import RedisConfig
from cdc_relay.sink.sqs.config import SqsConfig

# Sink configs other than Kafka's; None in the settings means "the Kafka sink".
OtherSink = RabbitMqConfig | NatsConfig | SqsConfig | RedisConfig | HttpConfig | KinesisConfig
_NAMES: tuple[tuple[type, str], ...] = ((RabbitMqConfig, "rabbitmq"), (NatsConfig, "nats"),
                                        (SqsConfig, "sqs"), (RedisConfig, "redis"),
                                        (HttpConfig, "http"), (KinesisConfig, "kinesis"))

# name -> (client library, pip extra, module)
_EXTRAS = {"rabbitmq": ("pika", "rabbitmq", "cdc_relay.sink.rabbitmq"),
           "nats": ("nats", "nats", "cdc_relay.sink.nats"),
           "sqs": ("boto3", "sqs", "cdc_relay.sink.sqs.sink"),
           "redis": ("redis", "redis", "cdc_relay.sink.redis.sink"),
           "http": ("httpx", "http", "cdc_relay.sink.http.sink"),
           "kinesis": ("boto3", "kinesis", "cdc_relay.sink.kinesis.sink")}


def sink_name(other: OtherSink | None) -> str:
    """``kafka``, ``rabbitmq``, ``nats``, ``sqs``, ...: the sink's name in logs and metrics."""
    for kind, name in _NAMES:
        if isinstance(other, kind):
            return name
    return "kafka"


def sink_module(name: str) -> ModuleType:
    """Import the ``name`` sink's module; a missing client library is a one-line ConfigError."""
    client, extra, module = _EXTRAS[name]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] in (client, "botocore", "httpcore"):
            raise ConfigError(f"the {name} sink needs the {client} client library, which is not "
                              f"installed: pip install 'cdc-relay[{extra}]'") from exc
        raise


def make_sink_factory(kafka: KafkaConfig, other: OtherSink | None) -> SinkFactory:
    """The SinkFactory of the configured sink; its loggers are ``cdc_relay.<sink>``."""
    name = sink_name(other)
    logger = logging.getLogger(f"cdc_relay.{name}")
    if other is None:
        from cdc_relay.sink.kafka.sink import kafka_sink_factory

        if kafka.schema_registry is None:
            return kafka_sink_factory(kafka, logger=logger)
        return _registry_factory(kafka_sink_factory(kafka, logger=logger), kafka, logger)
    module = sink_module(name)
    factory: SinkFactory = getattr(module, f"{name}_sink_factory")(other, logger=logger)
    return factory


def _registry_factory(inner: SinkFactory, kafka: KafkaConfig, logger: logging.Logger) -> SinkFactory:
    """The Kafka sinks of ``inner`` encoding through the schema registry (docs/messages.md);
    confluent-kafka's registry extras missing: a one-line ConfigError."""
    assert kafka.schema_registry is not None
    try:
        from cdc_relay.sink.registry.outbox_encoder import OutboxEncoder
        from cdc_relay.sink.registry.sink import registry_sink_factory
    except ImportError as exc:
        raise ConfigError(f"--message-format {kafka.schema_registry.message_format} needs "
                          f"confluent-kafka's schema registry extras ({exc.name} is missing): "
                          "pip install 'cdc-relay[registry]'") from exc
    return registry_sink_factory(inner, OutboxEncoder(kafka.schema_registry), logger)


def with_schema_registry(inner: SinkFactory, kafka: KafkaConfig, logger: logging.Logger) -> SinkFactory:
    """``inner`` (a Kafka sink factory, e.g. exactly-once's transactional one) encoding
    through the schema registry when a registry format is configured, else ``inner``."""
    if kafka.schema_registry is None:
        return inner
    return _registry_factory(inner, kafka, logger)


def probe_sink(other: OtherSink, timeout: float) -> list[SinkProbe]:
    """The doctor's reachability and permission findings for a sink other than Kafka."""
    found: list[SinkProbe] = sink_module(sink_name(other)).probe(other, timeout)
    return found

"""The options that say where messages go and how they look: the sink, Kafka's producer,
the message format and the schema registry (docs/sinks.md, docs/messages.md).

Owns those options (``sink_options``, ``kafka_options``, ``message_options``) and turning
their values into configs (``sink_settings``, ``registry_config``, ``router_config``),
refusing a mismatch (a sink's address under Kafka, a setting of another sink) with one
ConfigError naming the fix. Must not build a sink or connect to anything: the composition
roots do, from these configs.
"""

from __future__ import annotations

import click

from cdc_relay.cli.options import DURATION, IDENTIFIER, F, option
from cdc_relay.cloudevents import DEFAULT_SOURCE as DEFAULT_CLOUDEVENTS_SOURCE
from cdc_relay.config import (
    MESSAGE_FORMATS,
    REGISTRY_FORMATS,
    SUBJECT_STRATEGIES,
    VALUE_ENCODINGS,
    RegistryConfig,
    RouterConfig,
    parse_header_option,
    split_registry_config,
)
from cdc_relay.errors import ConfigError
from cdc_relay.sink.config import SINK_KINDS, parse_nats, parse_rabbitmq
from cdc_relay.sink.factory import OtherSink
from cdc_relay.sink.http.config import parse_http
from cdc_relay.sink.kinesis.config import parse_kinesis
from cdc_relay.sink.redis.config import parse_redis
from cdc_relay.sink.sqs.config import parse_sqs, sqs_topics

BROKERS_HELP = ("Broker address in the sink's form: HOST:PORT[,...] (kafka), "
                "amqp://USER:PASSWORD@HOST:PORT/VHOST (rabbitmq), nats://HOST:PORT[,...] (nats), "
                "sqs://REGION or http[s]://HOST:PORT (sqs), redis://HOST:PORT[/DB] (redis), "
                "a URL template http[s]://HOST/PATH/{aggregate_type} (http), "
                "kinesis://REGION or http[s]://HOST:PORT (kinesis).")


def brokers_option(f: F) -> F:
    return option("--brokers", required=True, help=BROKERS_HELP)(f)


def sink_options(f: F) -> F:
    """``--sink`` and ``--sink-config`` (docs/sinks.md)."""
    f = option("--sink-config", multiple=True, metavar="KEY=VALUE",
               help="A setting of a sink other than Kafka (repeatable), e.g. exchange=outbox, "
                    "stream=OUTBOX, region=eu-west-1, maxlen=1000000; see docs/sinks.md.")(f)
    return option("--sink", type=click.Choice(list(SINK_KINDS)), default="kafka",
                  show_default=True, help="The broker to publish to.")(f)


_ADDRESS_SINKS = (("amqp://", "rabbitmq"), ("amqps://", "rabbitmq"), ("nats://", "nats"),
                  ("tls://", "nats"), ("sqs://", "sqs"), ("redis://", "redis"),
                  ("rediss://", "redis"), ("kinesis://", "kinesis"))


def sink_topics(sink: str, topic_pattern: str, dead_letter_topic: str) -> tuple[str, str]:
    """The topic pattern and dead-letter topic for the sink: SQS swaps Kafka's defaults for its
    own (docs/sinks.md), which Kafka's are not legal queue names."""
    return sqs_topics(topic_pattern, dead_letter_topic) if sink == "sqs" else (
        topic_pattern, dead_letter_topic)


def sink_settings(sink: str, brokers: str, sink_config: tuple[str, ...],
                  producer_config: tuple[str, ...], *, topic_pattern: str,
                  dead_letter_topic: str, message_timeout: float,
                  header: tuple[str, ...] = (), message_format: str = "raw") -> OtherSink | None:
    """The RabbitMQ/NATS config of the sink options; None for Kafka (its config is KafkaConfig)."""
    timeout_ms = int(message_timeout * 1000)
    if sink == "kafka":
        if sink_config:
            raise ConfigError("--sink-config is for the sinks other than Kafka; Kafka producer "
                              "settings go in --producer-config KEY=VALUE")
        for prefix, other in _ADDRESS_SINKS:
            if brokers.strip().lower().startswith(prefix):
                raise ConfigError(f"--brokers {prefix}... is a {other} address but the sink is "
                                  f"kafka: add --sink {other}")
        return None
    if producer_config:
        raise ConfigError(f"--producer-config is for the Kafka sink; {sink} settings go in "
                          "--sink-config KEY=VALUE (see docs/sinks.md)")
    if sink == "sqs":
        return parse_sqs(brokers, sink_config, topic_pattern=topic_pattern,
                         dead_letter_topic=dead_letter_topic, message_timeout_ms=timeout_ms,
                         header_names=[parse_header_option(h)[1] for h in header],
                         message_format=message_format)
    if sink == "kinesis":
        return parse_kinesis(brokers, sink_config, topic_pattern=topic_pattern,
                             dead_letter_topic=dead_letter_topic, message_timeout_ms=timeout_ms)
    if sink == "http":
        return parse_http(brokers, sink_config, message_timeout_ms=timeout_ms,
                          header_names=[parse_header_option(h)[1] for h in header])
    if sink == "redis":
        return parse_redis(brokers, sink_config, topic_pattern=topic_pattern,
                           dead_letter_topic=dead_letter_topic, message_timeout_ms=timeout_ms,
                           header_names=[parse_header_option(h)[1] for h in header])
    if sink == "rabbitmq":
        return parse_rabbitmq(brokers, sink_config, dead_letter_topic=dead_letter_topic,
                              message_timeout_ms=timeout_ms)
    return parse_nats(brokers, sink_config, topic_pattern=topic_pattern,
                      dead_letter_topic=dead_letter_topic, message_timeout_ms=timeout_ms)


def kafka_options(f: F) -> F:
    f = option("--producer-config", multiple=True, metavar="KEY=VALUE",
               help="Any librdkafka producer property (repeatable), e.g. compression.type=lz4.")(f)
    f = option("--message-timeout", type=DURATION, default="30s", show_default=True,
               help="Give up on an unacknowledged message after this long (then replay).")(f)
    f = option("--dead-letter-topic", default="outbox.dead-letters", show_default=True,
               help="Topic (RabbitMQ: routing key, NATS: subject) for events the broker "
                    "rejects permanently.")(f)
    f = option("--topic-pattern", default="outbox.event.{aggregate_type}", show_default=True,
               help="Topic name pattern; placeholders {aggregate_type}, {event_type}, "
                    "{schema}, {table}.")(f)
    return brokers_option(f)


def message_options(f: F) -> F:
    """``--message-format``, ``--header``, ``--partition-column``, ``--cloudevents-source``,
    and the schema registry's ``--schema-registry``, ``--schema-registry-config``,
    ``--subject-name-strategy``, ``--value-schema``, ``--value-encoding``, ``--key-schema``
    (docs/messages.md)."""
    f = option("--key-schema", default=None, metavar="FILE",
               help="Encode the key as this struct (a record/object/message schema file, as "
                    "--value-schema); the aggregate id holds its JSON. Default: the string.")(f)
    f = option("--value-encoding", type=click.Choice(list(VALUE_ENCODINGS)), default="schema",
               show_default=True,
               help="schema: the JSON payload encoded by --value-schema; pre-encoded: a bytea "
                    "payload already in the Confluent wire format, passed through.")(f)
    f = option("--value-schema", multiple=True, metavar="EVENT_TYPE=FILE|DIRECTORY",
               help="The value schema of an event type (repeatable): .avsc (avro), .json "
                    "(json-schema), .desc FileDescriptorSet[#package.Message] (protobuf); or "
                    "a directory of <event type>.<ext> files.")(f)
    f = option("--subject-name-strategy", type=click.Choice(list(SUBJECT_STRATEGIES)),
               default="topic", show_default=True,
               help="Registry subjects: topic (<topic>-value), record (the record's full "
                    "name), topic-record (<topic>-<record name>).")(f)
    f = option("--schema-registry-config", multiple=True, metavar="KEY=VALUE",
               help="confluent-kafka SchemaRegistryClient setting (repeatable): "
                    "basic.auth.user.info, bearer.auth.*, ssl.ca.location...; or "
                    "auto.register.schemas=false.")(f)
    f = option("--schema-registry", default=None, metavar="URL", envvar="CDC_RELAY_SCHEMA_REGISTRY",
               help="Schema registry (Confluent-compatible API) for --message-format "
                    "avro|json-schema|protobuf.")(f)
    f = option("--cloudevents-source", default=DEFAULT_CLOUDEVENTS_SOURCE, show_default=True,
               metavar="URI", help="The source attribute of the cloudevents formats; "
                                   "placeholders {database}, {schema}, {table}.")(f)
    f = option("--partition-column", type=IDENTIFIER, default=None, metavar="COLUMN",
               help="Take the partition from this integer column (NULL: hash the key).")(f)
    f = option("--header", multiple=True, metavar="COLUMN[:NAME]",
               help="Copy a column into a header, as text (repeatable; NULL: no header).")(f)
    return option("--message-format", type=click.Choice(MESSAGE_FORMATS), default="raw",
                  show_default=True,
                  help="Key/value serialization: raw (Debezium StringConverter), debezium-json "
                       "(JsonConverter with schemas), debezium-json-schemaless, cloudevents "
                       "(binary mode: ce_* headers), cloudevents-structured (JSON envelope), "
                       "avro, json-schema, protobuf (through --schema-registry).")(f)


def registry_config(message_format: str, url: str | None, settings: tuple[str, ...],
                    subject_strategy: str, value_schema: tuple[str, ...], *, sink: str,
                    dead_letter_topic: str, outbox: bool = True, value_encoding: str = "schema",
                    key_schema: str | None = None) -> RegistryConfig | None:
    """The RegistryConfig of the schema-registry options; None for the other formats."""
    if message_format not in REGISTRY_FORMATS:
        if url or settings or value_schema or key_schema or value_encoding != "schema":
            raise ConfigError("--schema-registry, --schema-registry-config, --value-schema, "
                              "--value-encoding and --key-schema go with --message-format "
                              "avro|json-schema|protobuf")
        return None
    if sink != "kafka":
        raise ConfigError(f"--message-format {message_format} is for the Kafka sink (not {sink})")
    schemas = []
    for item in value_schema:
        event_type, sep, path = item.partition("=")
        schemas.append((event_type.strip(), path.strip()) if sep else ("", item.strip()))
    client, serializer = split_registry_config(settings)
    return RegistryConfig(url=url or "", message_format=message_format, client_config=client,
                          serializer_config=serializer, subject_strategy=subject_strategy,
                          value_schemas=tuple(schemas), dead_letter_topic=dead_letter_topic,
                          outbox=outbox, value_encoding=value_encoding, key_schema=key_schema or "")


def router_config(topic_pattern: str, dead_letter_topic: str, message_format: str = "raw",
                  header: tuple[str, ...] = (), partition_column: str | None = None,
                  cloudevents_source: str = DEFAULT_CLOUDEVENTS_SOURCE) -> RouterConfig:
    """The RouterConfig of the topic, dead-letter and message options."""
    return RouterConfig(topic_pattern=topic_pattern, dead_letter_topic=dead_letter_topic,
                        message_format=message_format,
                        header_columns=tuple(parse_header_option(h) for h in header),
                        partition_column=partition_column, cloudevents_source=cloudevents_source)

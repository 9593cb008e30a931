"""The CLI's plumbing: option types, shared options, secrets from files, error exit.

Owns how a value reaches a command - flag > ``CDC_RELAY_*`` environment variable >
``--config`` TOML file > default (click's own precedence: the file becomes the
context's ``default_map``; the file itself is cli/config_file.py) - and how any failure
becomes one line on stderr with a named exit code. It must not contain command logic;
commands live in cli/main.py, cli/ops.py and cli/demo.py and call a composition root
(app/run.py, app/poll.py, ...).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from cdc_relay import accel
from cdc_relay.cli.config_file import FILE_KEYS, config_first, file_says_json
from cdc_relay.cli.config_file import load_config_file as load_config_file  # re-exported
from cdc_relay.cloudevents import DEFAULT_SOURCE as DEFAULT_CLOUDEVENTS_SOURCE
from cdc_relay.config import (
    MESSAGE_FORMATS,
    REGISTRY_FORMATS,
    SUBJECT_STRATEGIES,
    VALUE_ENCODINGS,
    CredentialsConfig,
    OutboxConfig,
    RegistryConfig,
    RouterConfig,
    TableRef,
    parse_columns,
    parse_duration,
    parse_header_option,
    split_registry_config,
    validate_identifier,
)
from cdc_relay.errors import ConfigError, ExitCode, RelayError, mask_secrets
from cdc_relay.logs import DEFERRED_WARNINGS, JsonFormatter, setup_logging
from cdc_relay.sink.config import SINK_KINDS, parse_nats, parse_rabbitmq
from cdc_relay.sink.factory import OtherSink
from cdc_relay.sink.http.config import parse_http
from cdc_relay.sink.kinesis.config import parse_kinesis
from cdc_relay.sink.redis.config import parse_redis
from cdc_relay.sink.sqs.config import parse_sqs, sqs_topics

F = TypeVar("F", bound=Callable[..., Any])
ENV_PREFIX = "CDC_RELAY_"


class DurationType(click.ParamType):  # type: ignore[type-arg]
    """``500ms``, ``1s``, ``5m``, ``2h``, ``7d`` → seconds (float)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):  # a number from the config file: no unit
            value = str(value)
        try:
            return parse_duration(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class TableType(click.ParamType):  # type: ignore[type-arg]
    """``table`` or ``schema.table`` → TableRef (validated identifiers)."""

    name = "schema.table"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> TableRef:
        if isinstance(value, TableRef):
            return value
        try:
            return TableRef.parse(str(value))
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class IdentifierType(click.ParamType):  # type: ignore[type-arg]
    """A bare SQL identifier (publication name, ...)."""

    name = "identifier"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return validate_identifier(str(value), param.name if param and param.name else "name")
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


DURATION = DurationType()
TABLE = TableType()
IDENTIFIER = IdentifierType()


class FileEnvOption(click.Option):
    """An option whose ``CDC_RELAY_<NAME>`` may also be given as ``CDC_RELAY_<NAME>_FILE``:
    the path of a file holding the value (a mounted secret; one trailing newline dropped)."""

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        value = super().resolve_envvar_value(ctx)
        if value is not None or not isinstance(self.envvar, str):
            return value
        variable = self.envvar + "_FILE"
        path = os.environ.get(variable)
        if not path:
            return None
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise click.BadParameter(f"cannot read {variable}={path}: {exc.strerror}",
                                     ctx=ctx, param=self) from exc
        return text[:-1] if text.endswith("\n") else text


def option(*decls: str, **attrs: Any) -> Callable[[F], F]:
    """``click.option`` with ``CDC_RELAY_<NAME>`` (or ``..._FILE``) as its environment variable."""
    long_name = next(d for d in decls if d.startswith("--")).lstrip("-").split("/")[0]
    attrs.setdefault("envvar", ENV_PREFIX + long_name.replace("-", "_").upper())
    attrs.setdefault("show_envvar", True)
    attrs.setdefault("cls", FileEnvOption)
    return click.option(*decls, **attrs)


def credentials_options(f: F) -> F:
    """``--password-command``, ``--aws-rds-iam``, ``--aws-region``: the command runs with the
    password provider they ask for installed (app/credentials.py), so every connection it
    opens takes a fresh password from it."""

    @functools.wraps(f)
    def with_credentials(*args: Any, password_command: str | None, aws_rds_iam: bool,
                         aws_region: str | None, **kwargs: Any) -> Any:
        from cdc_relay.app.credentials import credentials_for

        config = CredentialsConfig(password_command=password_command, aws_rds_iam=aws_rds_iam,
                                   aws_region=aws_region)
        with credentials_for(config, kwargs.get("dsn") or ""):
            return f(*args, **kwargs)

    decorated = option("--aws-region", default=None, metavar="REGION",
                       help="The region --aws-rds-iam signs its tokens for (default: boto3's "
                            "standard chain, e.g. AWS_REGION).")(with_credentials)
    decorated = option("--aws-rds-iam", is_flag=True, default=False,
                       help="Authenticate with an RDS/Aurora IAM token made for each connection "
                            "(boto3; needs sslmode=require or stronger in --dsn).")(decorated)
    decorated = option("--password-command", default=None, metavar="CMD",
                       help="Run CMD (through sh) before every PostgreSQL connection; the first "
                            "line it prints is the password (rotating secrets). Never logged.")(
                                decorated)
    return decorated  # type: ignore[return-value]


def dsn_option(f: F) -> F:
    """``--dsn`` and the options that say where its password comes from (credentials_options)."""
    return credentials_options(
        option("--dsn", required=True, help="PostgreSQL connection string (libpq DSN or URL).")(f))


def table_option(f: F) -> F:
    return option("--table", type=TABLE, default="public.outbox_events", show_default=True,
                  help="The outbox table.")(f)


def columns_option(f: F) -> F:
    return option("--columns", default=None,
                  help="Column names: 'debezium', or FIELD=COLUMN,... "
                       "(fields: id, aggregate_type, aggregate_id, event_type, payload, created_at).")(f)


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


def slot_option(f: F) -> F:
    return option("--slot", default="cdc_relay", show_default=True,
                  help="Logical replication slot name.")(f)


def plugin_option(f: F) -> F:
    return option("--plugin", type=click.Choice(["wal2json", "pgoutput"]), default=None,
                  help="Logical decoding output plugin [default: an existing slot's plugin, "
                       "else pgoutput].")(f)


def publication_option(f: F) -> F:
    return option("--publication", type=IDENTIFIER, default="cdc_relay_outbox", show_default=True,
                  help="Publication on the outbox table (pgoutput only).")(f)


def format_option(f: F) -> F:
    return option("--format", "output_format", type=click.Choice(["table", "json"]),
                  default="table", show_default=True, help="Output for people or for scripts.")(f)


def outbox_config(table: TableRef, columns: str | None) -> OutboxConfig:
    """The OutboxConfig of ``--table`` and ``--columns``."""
    return OutboxConfig(table=table, columns=parse_columns(columns))


_ALIAS_USED = "cdc_relay.pure_python_decoder"


def pure_python_option(f: F) -> F:
    """``--pure-python`` (and its deprecated spelling ``--pure-python-decoder``)."""
    f = option("--pure-python-decoder", is_flag=True, hidden=True, expose_value=False,
               callback=_alias_used)(f)
    # envvar=None: accel.py reads CDC_RELAY_PURE_PYTHON itself (it also takes a list)
    return option("--pure-python", is_flag=True, default=False, envvar=None,
                  help="Run every path in pure Python even where the compiled ones are built "
                       "(same messages, more CPU per event); also CDC_RELAY_PURE_PYTHON=1.")(f)


def _alias_used(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_ALIAS_USED] = True


def choose_paths(pure_python: bool) -> None:
    """The process's one choice of compiled or pure paths (cdc_relay/accel.py), made before
    anything is built and logged (so after setup_logging); ConfigError for a bad
    CDC_RELAY_PURE_PYTHON."""
    ctx = click.get_current_context(silent=True)
    alias = ctx is not None and bool(ctx.meta.get(_ALIAS_USED))
    if alias:
        logging.getLogger("cdc_relay.cli").warning(
            "--pure-python-decoder is deprecated: use --pure-python (it turns off every "
            "compiled path, not only the decoders)")
    accel.choose(pure_python or alias)
    accel.log_choice()


def standby_dsn_option(f: F) -> F:
    return option("--standby-dsn", default=None,
                  help="A streaming standby of the primary (libpq DSN): doctor, status and "
                       "run's metrics check that it holds a failover-ready copy of the slot "
                       "(PostgreSQL 17+ failover slots; docs/high-availability.md).")(f)


def primary_dsn_option(f: F) -> F:
    return option("--primary-dsn", default=None,
                  help="Decode on a standby (PostgreSQL 16+): --dsn is a hot standby that "
                       "holds the slot, and everything that must write (the slot's record and "
                       "horizon, heartbeats, the publication) goes to this primary "
                       "(docs/high-availability.md, decoding on a standby).")(f)


def observability_options(f: F) -> F:
    f = option("--log-format", type=click.Choice(["text", "json"]), default="text",
               show_default=True, help="Log line format on stderr.")(f)
    f = option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
               default="info", show_default=True)(f)
    f = option("--metrics-host", default="127.0.0.1", show_default=True,
               help="Address the metrics/health endpoint binds to.")(f)
    f = option("--metrics-port", type=click.IntRange(0, 65535), default=None,
               help="Serve Prometheus metrics, /healthz and /readyz on this port.")(f)
    return f


# -- error exit ------------------------------------------------------------------------

def _json_logging() -> bool:
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


def _fail(message: str, code: int) -> int:
    message = mask_secrets(message)
    if _json_logging():
        # --log-format json: stderr carries JSON lines only, the final error included.
        logging.getLogger("cdc_relay").error(message, extra={"exit_code": int(code)})
    else:
        click.echo(f"cdc-relay: error: {message}", err=True)
    return code


def _wants_json(args: list[str]) -> bool:
    """--log-format json (flag, environment or config file): then even a usage error is a
    JSON line."""
    config = os.environ.get("CDC_RELAY_CONFIG")
    for i, arg in enumerate(args):
        if arg == "--log-format=json" or (arg == "--log-format" and args[i + 1:i + 2] == ["json"]):
            return True
        if arg == "--config" and i + 1 < len(args):
            config = args[i + 1]
        elif arg.startswith("--config="):
            config = arg.partition("=")[2]
    if ENV_PREFIX + "LOG_FORMAT" in os.environ:
        return os.environ[ENV_PREFIX + "LOG_FORMAT"].strip().lower() == "json"
    return config is not None and file_says_json(config)


def _file_value_error(exc: click.BadParameter) -> str | None:
    """A bad value that came from the config file: the message names the file and the key."""
    from click.core import ParameterSource

    param, ctx = exc.param, exc.ctx
    if param is None or ctx is None or param.name is None:
        return None
    if ctx.get_parameter_source(param.name) is not ParameterSource.DEFAULT_MAP:
        return None
    where = FILE_KEYS.get(param.name)
    if where is None:
        return None
    return f"config file {where[0]}, key {where[1]}: {exc.message}"


def run_cli(group: click.Group, args: list[str] | None = None) -> int:
    """Run the click group; map every failure to one stderr line and a named exit code."""
    args = config_first(sys.argv[1:] if args is None else list(args))
    if _wants_json(args):
        setup_logging("info", "json")
    try:
        code = _run(group, args)
    finally:
        while DEFERRED_WARNINGS:  # the command set up no logging (or failed before it)
            warning = DEFERRED_WARNINGS.pop(0)
            if _json_logging():
                logging.getLogger("cdc_relay.config").warning("%s", warning)
            else:
                click.echo(f"cdc-relay: warning: {warning}", err=True)
    return code


def _run(group: click.Group, args: list[str]) -> int:
    try:
        result = group.main(args=args, prog_name="cdc-relay", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        return ExitCode.USAGE
    except click.UsageError as exc:
        from_file = _file_value_error(exc) if isinstance(exc, click.BadParameter) else None
        if from_file is not None:
            return _fail(from_file, ExitCode.USAGE)
        where = f"{exc.ctx.command_path}: " if exc.ctx else ""
        hint = ""
        if isinstance(exc, click.MissingParameter) and exc.param is not None:
            envvar = getattr(exc.param, "envvar", None)
            if isinstance(envvar, str):
                hint = f" (or set {envvar})"
        return _fail(where + exc.format_message().rstrip(".") + hint, ExitCode.USAGE)
    except click.ClickException as exc:
        return _fail(exc.format_message(), exc.exit_code)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__ or exc.__context__, KeyboardInterrupt):
            click.echo("interrupted", err=True)  # click turns Ctrl-C into Abort
            return ExitCode.INTERRUPTED
        click.echo("aborted", err=True)  # e.g. "no" at a confirmation prompt
        return ExitCode.FAILURE
    except RelayError as exc:
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except Exception as exc:  # the last line of defence: never a traceback for a user
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return _fail(f"unexpected {type(exc).__name__}: {message} "
                     "(please report this; --log-level debug shows details)", ExitCode.FAILURE)
    if isinstance(result, int):
        return result
    return ExitCode.OK


def main_entry(group: click.Group) -> None:
    """Console-script entry point."""
    sys.exit(run_cli(group))

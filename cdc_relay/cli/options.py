"""The CLI's plumbing: option types, shared options, config-file layering, error exit.

Owns how a value reaches a command - flag > ``CDC_RELAY_*`` environment variable >
``--config`` TOML file > default (click's own precedence: the file becomes the
context's ``default_map``) - and how any failure becomes one line on stderr with a named
exit code. It must not contain command logic; commands live in cli/main.py, cli/ops.py
and cli/demo.py and call a composition root (wal/app.py, polling/app.py, ...).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click

from cdc_relay.cloudevents import DEFAULT_SOURCE as DEFAULT_CLOUDEVENTS_SOURCE
from cdc_relay.config import (
    MESSAGE_FORMATS,
    OutboxConfig,
    RouterConfig,
    TableRef,
    parse_columns,
    parse_duration,
    parse_header_option,
    validate_identifier,
)
from cdc_relay.errors import ConfigError, ExitCode, RelayError, mask_secrets
from cdc_relay.logs import JsonFormatter
from cdc_relay.sink.config import SINK_KINDS, parse_nats, parse_rabbitmq
from cdc_relay.sink.factory import OtherSink

F = TypeVar("F", bound=Callable[..., Any])
ENV_PREFIX = "CDC_RELAY_"


class DurationType(click.ParamType):  # type: ignore[type-arg]
    """``500ms``, ``1s``, ``5m``, ``2h``, ``7d`` → seconds (float)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
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


def option(*decls: str, **attrs: Any) -> Callable[[F], F]:
    """``click.option`` with ``CDC_RELAY_<NAME>`` as its environment variable."""
    long_name = next(d for d in decls if d.startswith("--")).lstrip("-").split("/")[0]
    attrs.setdefault("envvar", ENV_PREFIX + long_name.replace("-", "_").upper())
    attrs.setdefault("show_envvar", True)
    return click.option(*decls, **attrs)


def dsn_option(f: F) -> F:
    return option("--dsn", required=True, help="PostgreSQL connection string (libpq DSN or URL).")(f)


def table_option(f: F) -> F:
    return option("--table", type=TABLE, default="public.outbox_events", show_default=True,
                  help="The outbox table.")(f)


def columns_option(f: F) -> F:
    return option("--columns", default=None,
                  help="Column names: 'debezium', or FIELD=COLUMN,... "
                       "(fields: id, aggregate_type, aggregate_id, event_type, payload, created_at).")(f)


BROKERS_HELP = ("Broker address in the sink's form: HOST:PORT[,...] (kafka), "
                "amqp://USER:PASSWORD@HOST:PORT/VHOST (rabbitmq), nats://HOST:PORT[,...] (nats).")


def brokers_option(f: F) -> F:
    return option("--brokers", required=True, help=BROKERS_HELP)(f)


def sink_options(f: F) -> F:
    """``--sink`` and ``--sink-config`` (docs/sinks.md)."""
    f = option("--sink-config", multiple=True, metavar="KEY=VALUE",
               help="A RabbitMQ or NATS sink setting (repeatable), e.g. exchange=outbox, "
                    "stream=OUTBOX; see docs/sinks.md.")(f)
    return option("--sink", type=click.Choice(list(SINK_KINDS)), default="kafka",
                  show_default=True, help="The broker to publish to.")(f)


_ADDRESS_SINKS = (("amqp://", "rabbitmq"), ("amqps://", "rabbitmq"), ("nats://", "nats"),
                  ("tls://", "nats"))


def sink_settings(sink: str, brokers: str, sink_config: tuple[str, ...],
                  producer_config: tuple[str, ...], *, topic_pattern: str,
                  dead_letter_topic: str, message_timeout: float) -> OtherSink | None:
    """The RabbitMQ/NATS config of the sink options; None for Kafka (its config is KafkaConfig)."""
    timeout_ms = int(message_timeout * 1000)
    if sink == "kafka":
        if sink_config:
            raise ConfigError("--sink-config is for the rabbitmq and nats sinks; Kafka producer "
                              "settings go in --producer-config KEY=VALUE")
        for prefix, other in _ADDRESS_SINKS:
            if brokers.strip().lower().startswith(prefix):
                raise ConfigError(f"--brokers {prefix}... is a {other} address but the sink is "
                                  f"kafka: add --sink {other}")
        return None
    if producer_config:
        raise ConfigError(f"--producer-config is for the Kafka sink; {sink} settings go in "
                          "--sink-config KEY=VALUE (see docs/sinks.md)")
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
    """``--message-format``, ``--header``, ``--partition-column``, ``--cloudevents-source``
    (docs/messages.md)."""
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
                       "(binary mode: ce_* headers), cloudevents-structured (JSON envelope).")(f)


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
    return option("--plugin", type=click.Choice(["wal2json", "pgoutput"]), default="wal2json",
                  show_default=True, help="Logical decoding output plugin.")(f)


def publication_option(f: F) -> F:
    return option("--publication", type=IDENTIFIER, default="cdc_relay_outbox", show_default=True,
                  help="Publication on the outbox table (pgoutput only).")(f)


def format_option(f: F) -> F:
    return option("--format", "output_format", type=click.Choice(["table", "json"]),
                  default="table", show_default=True, help="Output for people or for scripts.")(f)


def outbox_config(table: TableRef, columns: str | None) -> OutboxConfig:
    """The OutboxConfig of ``--table`` and ``--columns``."""
    return OutboxConfig(table=table, columns=parse_columns(columns))


def standby_dsn_option(f: F) -> F:
    return option("--standby-dsn", default=None,
                  help="A streaming standby of the primary (libpq DSN): doctor, status and "
                       "run's metrics check that it holds a failover-ready copy of the slot "
                       "(PostgreSQL 17+ failover slots; docs/high-availability.md).")(f)


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


# -- config file -----------------------------------------------------------------------

def _leaf_commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], click.Command]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _leaf_commands(command, (*path, name))
        else:
            yield (*path, name), command


def _param_names(command: click.Command) -> set[str]:
    return {p.name for p in command.params if isinstance(p, click.Option) and p.name}


def _normalise(key: str) -> str:
    return key.replace("-", "_")


def _to_option_value(value: Any) -> Any:
    # [producer_config] / [sink_config] as a TOML table → ("key=value", ...) like the repeated flag.
    if isinstance(value, dict):
        return tuple(f"{k}={v}" for k, v in value.items())
    return value


def load_config_file(path: str, group: click.Group) -> dict[str, Any]:
    """Read a TOML file into a click ``default_map`` for every (sub)command.

    Top-level keys apply to each command that has that option; ``[run]``, ``[poll]``,
    ``[dead-letters.list]``… sections to one command. Unknown keys are errors.
    """
    data = _read_toml(path)
    leaves = dict(_leaf_commands(group))
    by_name = {" ".join(p): c for p, c in leaves.items()} | {".".join(p): c for p, c in leaves.items()}
    all_params = set().union(*(_param_names(c) for c in leaves.values()))
    shared: dict[str, Any] = {}
    sections: dict[tuple[str, ...], dict[str, Any]] = {}

    def section(prefix: tuple[str, ...], table: dict[str, Any]) -> None:
        for key, value in table.items():
            name = _normalise(key)
            path_ = (*prefix, key)
            if isinstance(value, dict) and name not in ("producer_config", "sink_config"):
                section(path_, value)
                continue
            command_path = tuple(prefix)
            if not command_path:
                if name not in all_params:
                    raise ConfigError(f"unknown key {key!r} in config file {path}")
                shared[name] = _to_option_value(value)
                continue
            command = by_name.get(".".join(command_path))
            if command is None:
                raise ConfigError(f"unknown section [{'.'.join(command_path)}] in config file {path}")
            if name not in _param_names(command):
                raise ConfigError(
                    f"unknown key {key!r} in section [{'.'.join(command_path)}] of {path}"
                )
            sections.setdefault(command_path, {})[name] = _to_option_value(value)

    section((), data)
    return _default_map(leaves, shared, sections)


def _read_toml(path: str) -> dict[str, Any]:
    import tomllib  # only with --config: start-up without it does not pay for the parser

    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def _default_map(leaves: dict[tuple[str, ...], click.Command], shared: dict[str, Any],
                 sections: dict[tuple[str, ...], dict[str, Any]]) -> dict[str, Any]:
    """Click's nested ``default_map``: shared keys a command has, then its own section's."""
    default_map: dict[str, Any] = {}
    for command_path, command in leaves.items():
        values = {k: v for k, v in shared.items() if k in _param_names(command)}
        values.update(sections.get(command_path, {}))
        node = default_map
        for part in command_path[:-1]:
            node = node.setdefault(part, {})
        node[command_path[-1]] = values
    return default_map


# -- error exit ------------------------------------------------------------------------

def _fail(message: str, code: int) -> int:
    message = mask_secrets(message)
    if any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers):
        # --log-format json: stderr carries JSON lines only, the final error included.
        logging.getLogger("cdc_relay").error(message, extra={"exit_code": int(code)})
    else:
        click.echo(f"cdc-relay: error: {message}", err=True)
    return code


def run_cli(group: click.Group, args: list[str] | None = None) -> int:
    """Run the click group; map every failure to one stderr line and a named exit code."""
    try:
        result = group.main(args=args, prog_name="cdc-relay", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        return ExitCode.USAGE
    except click.UsageError as exc:
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

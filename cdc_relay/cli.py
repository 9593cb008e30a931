"""``cdc-relay``: click commands only - parse, build config, call app.

Every option can also come from ``CDC_RELAY_<OPTION>`` or the ``--config`` TOML file
(precedence flag > env > file; see cli_support). No command logic lives here.
"""

from __future__ import annotations

from typing import Any

import click

from cdc_relay import __version__
from cdc_relay.cli_support import (
    DURATION,
    IDENTIFIER,
    columns_option,
    dsn_option,
    kafka_options,
    load_config_file,
    main_entry,
    option,
    table_option,
)
from cdc_relay.config import (
    FlowConfig,
    KafkaConfig,
    OutboxConfig,
    ReplicationConfig,
    RouterConfig,
    TableRef,
    parse_columns,
    parse_producer_config,
)
from cdc_relay.logs import setup_logging


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--config", "config_file", type=click.Path(dir_okay=False), envvar="CDC_RELAY_CONFIG",
              show_envvar=True, help="TOML file with option values (flags and env vars win).")
@click.version_option(__version__, prog_name="cdc-relay")
@click.pass_context
def cli(ctx: click.Context, config_file: str | None) -> None:
    """Transactional-outbox relay: PostgreSQL outbox inserts -> Kafka, at least once."""
    if config_file:
        ctx.default_map = load_config_file(config_file, cli)


def slot_option(f: Any) -> Any:
    return option("--slot", default="cdc_relay", show_default=True,
                  help="Logical replication slot name.")(f)


def plugin_option(f: Any) -> Any:
    return option("--plugin", type=click.Choice(["wal2json", "pgoutput"]), default="wal2json",
                  show_default=True, help="Logical decoding output plugin.")(f)


def publication_option(f: Any) -> Any:
    return option("--publication", type=IDENTIFIER, default="cdc_relay_outbox", show_default=True,
                  help="Publication on the outbox table (pgoutput only).")(f)


def outbox_config(table: TableRef, columns: str | None) -> OutboxConfig:
    return OutboxConfig(table=table, columns=parse_columns(columns))


@cli.command()
@dsn_option
@table_option
@columns_option
@slot_option
@plugin_option
@publication_option
@option("--no-slot", is_flag=True, default=False,
        help="Only apply the schema (polling mode): create no slot or publication.")
@option("--no-trigger", is_flag=True, default=False,
        help="Skip the NOTIFY trigger (WAL-mode-only deployments save its cost per insert).")
def init(dsn: str, table: TableRef, columns: str | None, slot: str, plugin: str, publication: str,
         no_slot: bool, no_trigger: bool) -> None:
    """Apply the outbox schema (idempotent) and create the replication slot."""
    from cdc_relay.schema import init_database

    ReplicationConfig(dsn=dsn, slot=slot, plugin=plugin, publication=publication)  # validate
    report = init_database(dsn, outbox_config(table, columns), slot=None if no_slot else slot,
                           plugin=plugin, publication=publication, notify_trigger=not no_trigger)
    click.echo(str(report))


@cli.command()
@dsn_option
@kafka_options
@table_option
@columns_option
@slot_option
@plugin_option
@publication_option
@option("--status-interval", type=DURATION, default="1s", show_default=True,
        help="How often the confirmed LSN is reported to PostgreSQL.")
@option("--max-inflight", type=click.IntRange(1), default=50_000, show_default=True,
        help="Stop reading WAL while this many events await broker acks.")
@option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
        show_default=True)
@option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
def run(dsn: str, brokers: str, topic_pattern: str, dead_letter_topic: str, message_timeout: float,
        producer_config: tuple[str, ...], table: TableRef, columns: str | None, slot: str,
        plugin: str, publication: str, status_interval: float, max_inflight: int,
        log_level: str, log_format: str) -> int:
    """WAL mode: stream outbox inserts from a logical replication slot to Kafka."""
    from cdc_relay.app import WalSettings, run_wal

    settings = WalSettings(
        replication=ReplicationConfig(dsn=dsn, slot=slot, plugin=plugin, publication=publication,
                                      status_interval=status_interval),
        outbox=outbox_config(table, columns),
        router=RouterConfig(topic_pattern=topic_pattern, dead_letter_topic=dead_letter_topic),
        kafka=KafkaConfig(brokers=brokers, producer_config=parse_producer_config(producer_config),
                          message_timeout_ms=int(message_timeout * 1000)),
        flow=FlowConfig(max_inflight_events=max_inflight),
    )
    setup_logging(log_level, log_format)
    return run_wal(settings)


def main() -> None:
    """Console-script entry point (``cdc-relay``)."""
    main_entry(cli)

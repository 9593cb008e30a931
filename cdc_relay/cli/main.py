"""``cdc-relay``: click commands only - parse, build config, call a composition root.

Every option can also come from ``CDC_RELAY_<OPTION>`` or the ``--config`` TOML file
(precedence flag > env > file; see cli/options.py). No command logic lives here.
"""

from __future__ import annotations

from typing import Any

import click

from cdc_relay import __version__
from cdc_relay.cli.capture import capture_options
from cdc_relay.cli.continuity import continuity_options
from cdc_relay.cli.exactly_once import exactly_once_options
from cdc_relay.cli.frame import main_entry
from cdc_relay.cli.options import (
    DURATION,
    choose_paths,
    columns_option,
    credentials_options,
    dsn_option,
    format_option,
    load_config_file,
    observability_options,
    option,
    outbox_config,
    plugin_option,
    primary_dsn_option,
    publication_option,
    pure_python_option,
    slot_option,
    standby_dsn_option,
    table_option,
)
from cdc_relay.cli.sink_options import (
    kafka_options,
    message_options,
    registry_config,
    router_config,
    sink_options,
    sink_settings,
    sink_topics,
)
from cdc_relay.config import (
    CaptureConfig,
    ExactlyOnceConfig,
    FlowConfig,
    KafkaConfig,
    MetricsConfig,
    PollConfig,
    ReplicationConfig,
    TableRef,
    parse_producer_config,
)
from cdc_relay.logs import setup_logging
from cdc_relay.runtime import tune_gc


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--config", "config_file", type=click.Path(dir_okay=False), envvar="CDC_RELAY_CONFIG",
              show_envvar=True, help="TOML file with option values (flags and env vars win).")
@click.version_option(__version__, prog_name="cdc-relay")
@click.pass_context
def cli(ctx: click.Context, config_file: str | None) -> None:
    """Transactional-outbox relay: PostgreSQL outbox inserts -> Kafka, RabbitMQ, NATS or SQS.

    At least once; exactly once into Kafka when asked.
    """
    if config_file:
        ctx.default_map = load_config_file(config_file, cli)


@cli.command()
@dsn_option
@table_option
@columns_option
@option("--mode", type=click.Choice(["wal", "poll"]), default="wal", show_default=True,
        help="The relay mode that will read the table; init installs only what it uses: "
             "wal = slot (+ publication for pgoutput), no NOTIFY trigger; poll = the NOTIFY "
             "trigger, no slot.")
@slot_option
@plugin_option
@publication_option
@option("--no-slot", is_flag=True, default=False,
        help="Same as --mode poll (kept for existing scripts).")
@option("--no-trigger", is_flag=True, default=False,
        help="Polling mode without the NOTIFY trigger (pollers then wake every --interval).")
@option("--with-trace-context", is_flag=True, default=False,
        help="Add the optional traceparent/tracestate columns (W3C trace headers).")
@option("--capture", default=None, metavar="TABLE[,TABLE...]",
        help="Tables run --capture will stream: add them to the publication (which then "
             "publishes updates and deletes) and report replica identity and SELECT problems.")
@option("--no-outbox", is_flag=True, default=False,
        help="With --capture: install only what capturing needs (the publication, the slot), "
             "no outbox schema.")
@option("--capture-truncate", is_flag=True, default=False,
        help="With --capture: the publication publishes truncates from now on (run "
             "--capture-truncate streams them).")
@option("--signal-table", default=None, metavar="SCHEMA.TABLE",
        help="With --capture: the incremental snapshots' signal table to create, as run "
             "--signal-table (default: cdc_relay_signal in --table's schema).")
@option("--failover-slot/--no-failover-slot", default=True, show_default=True,
        help="Create the slot as a failover slot on PostgreSQL 17+ (docs/high-availability.md).")
@click.pass_context
def init(ctx: click.Context, dsn: str, table: TableRef, columns: str | None, mode: str, slot: str,
         plugin: str | None, publication: str, no_slot: bool, no_trigger: bool,
         with_trace_context: bool, capture: str | None, no_outbox: bool,
         capture_truncate: bool, signal_table: str | None, failover_slot: bool) -> None:
    """Apply the outbox schema (idempotent) and install what the relay mode uses."""
    from click.core import ParameterSource

    from cdc_relay.app.init import init_database

    if no_slot:
        if mode == "wal" and ctx.get_parameter_source("mode") is not ParameterSource.DEFAULT:
            raise click.UsageError("--no-slot means --mode poll; it cannot go with --mode wal")
        mode = "poll"
    ReplicationConfig(dsn=dsn, slot=slot, plugin=plugin or "pgoutput",
                      publication=publication)  # validate
    report = init_database(dsn, outbox_config(table, columns), slot=slot if mode == "wal" else None,
                           plugin=plugin, publication=publication, mode=mode,
                           notify_trigger=False if no_trigger else None,
                           trace_context=with_trace_context, failover=failover_slot,
                           capture=capture, no_outbox=no_outbox, capture_truncate=capture_truncate,
                           signal_table=signal_table)
    click.echo(str(report))


@cli.command()
@dsn_option
@sink_options
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
@pure_python_option
@message_options
@option("--snapshot", type=click.Choice(["initial", "never"]), default="never", show_default=True,
        help="initial: when the relay creates the slot, first publish the rows pending in its "
             "snapshot (moving from polling mode; docs/migration.md).")
@exactly_once_options
@capture_options
@continuity_options
@observability_options
@standby_dsn_option
@primary_dsn_option
def run(dsn: str, sink: str, sink_config: tuple[str, ...], brokers: str, topic_pattern: str,
        dead_letter_topic: str, message_timeout: float, producer_config: tuple[str, ...],
        table: TableRef, columns: str | None, slot: str,
        plugin: str | None, publication: str, status_interval: float, max_inflight: int,
        pure_python: bool,
        message_format: str, header: tuple[str, ...], partition_column: str | None,
        cloudevents_source: str, snapshot: str,
        schema_registry: str | None, schema_registry_config: tuple[str, ...],
        subject_name_strategy: str, value_schema: tuple[str, ...],
        value_encoding: str, key_schema: str | None,
        metrics_port: int | None, metrics_host: str, log_level: str, log_format: str,
        exactly_once: ExactlyOnceConfig | None, capture: CaptureConfig | None,
        continuity: dict[str, Any], standby_dsn: str | None, primary_dsn: str | None) -> int:
    """WAL mode: stream outbox inserts (and --capture tables) from a logical slot to the broker."""
    tune_gc()  # done by cli/entry.py already, unless invoked in process (cdc_relay/runtime.py)
    from cdc_relay.app.run import run_wal
    from cdc_relay.app.wal_settings import WalSettings

    setup_logging(log_level, log_format)  # first: a config error is then a log line too
    choose_paths(pure_python)
    topic_pattern, dead_letter_topic = sink_topics(sink, topic_pattern, dead_letter_topic)
    other = sink_settings(sink, brokers, sink_config, producer_config, topic_pattern=topic_pattern,
                          dead_letter_topic=dead_letter_topic, message_timeout=message_timeout,
                          header=header, message_format=message_format)
    registry = registry_config(message_format, schema_registry, schema_registry_config,
                               subject_name_strategy, value_schema, sink=sink,
                               dead_letter_topic=dead_letter_topic,
                               outbox=capture is None or capture.outbox,
                               value_encoding=value_encoding, key_schema=key_schema)
    settings = WalSettings(
        replication=ReplicationConfig(dsn=dsn, slot=slot, plugin=plugin or "pgoutput",
                                      plugin_from_slot=plugin is None, publication=publication,
                                      status_interval=status_interval,
                                      primary_dsn=primary_dsn, **continuity),
        outbox=outbox_config(table, columns),
        router=router_config(topic_pattern, dead_letter_topic, message_format, header,
                             partition_column, cloudevents_source),
        kafka=KafkaConfig(brokers=brokers, producer_config=parse_producer_config(producer_config),
                          message_timeout_ms=int(message_timeout * 1000), schema_registry=registry),
        flow=FlowConfig(max_inflight_events=max_inflight),
        metrics=MetricsConfig(port=metrics_port, host=metrics_host, standby_dsn=standby_dsn),
        sink=other,
        snapshot=snapshot,
        exactly_once=exactly_once,
        capture=capture,
    )
    return run_wal(settings)


# ---------------------------------------------------------------- polling mode

@cli.command()
@dsn_option
@sink_options
@kafka_options
@table_option
@columns_option
@option("--batch-size", type=click.IntRange(1), default=100, show_default=True,
        help="Rows claimed (and published) per transaction.")
@option("--interval", type=DURATION, default="1s", show_default=True,
        help="Fallback poll interval when no NOTIFY arrives (retries, missed notifications).")
@option("--max-attempts", type=click.IntRange(1), default=5, show_default=True,
        help="Failed attempts after which an event becomes a dead letter.")
@option("--backoff-base", type=DURATION, default="1s", show_default=True,
        help="Wait after a first failure; doubles with every further failure.")
@option("--backoff-max", type=DURATION, default="5m", show_default=True,
        help="Longest wait between two attempts of one event.")
@option("--workers", type=click.IntRange(1), default=1, show_default=True,
        help="Polling threads, each with its own connection and producer.")
@option("--no-notify", is_flag=True, default=False,
        help="Do not LISTEN for the insert trigger; poll every --interval only.")
@option("--strict-order", is_flag=True, default=False,
        help="Never publish an aggregate's event before its earlier ones (slower; "
             "use it on every poller of the table).")
@option("--no-pipeline", is_flag=True, default=False,
        help="Run a batch's marking UPDATE only once every ack is in, not while the acks "
             "are awaited (slower on a backlog; no helper thread).")
@pure_python_option
@message_options
@click.option("--snapshot", "poll_snapshot", default=None, hidden=True, expose_value=True)
@observability_options
def poll(dsn: str, sink: str, sink_config: tuple[str, ...], brokers: str, topic_pattern: str,
         dead_letter_topic: str, message_timeout: float, producer_config: tuple[str, ...],
         table: TableRef, columns: str | None, batch_size: int,
         interval: float, max_attempts: int, backoff_base: float, backoff_max: float, workers: int,
         no_notify: bool, strict_order: bool, no_pipeline: bool, pure_python: bool,
         message_format: str, header: tuple[str, ...],
         partition_column: str | None, cloudevents_source: str, poll_snapshot: str | None,
         schema_registry: str | None, schema_registry_config: tuple[str, ...],
         subject_name_strategy: str, value_schema: tuple[str, ...],
         value_encoding: str, key_schema: str | None,
         metrics_port: int | None,
         metrics_host: str, log_level: str, log_format: str) -> int:
    """Polling mode: claim outbox rows (SKIP LOCKED), publish them, mark them processed."""
    tune_gc()  # done by cli/entry.py already, unless invoked in process (cdc_relay/runtime.py)
    from cdc_relay.app.poll import PollSettings, run_poll

    if poll_snapshot is not None:
        raise click.UsageError("--snapshot is a WAL-mode option (cdc-relay run --snapshot "
                               "initial): polling mode publishes every pending row anyway")

    setup_logging(log_level, log_format)  # first: a config error is then a log line too
    choose_paths(pure_python)
    topic_pattern, dead_letter_topic = sink_topics(sink, topic_pattern, dead_letter_topic)
    other = sink_settings(sink, brokers, sink_config, producer_config, topic_pattern=topic_pattern,
                          dead_letter_topic=dead_letter_topic, message_timeout=message_timeout,
                          header=header, message_format=message_format)
    registry = registry_config(message_format, schema_registry, schema_registry_config,
                               subject_name_strategy, value_schema, sink=sink,
                               dead_letter_topic=dead_letter_topic,
                               value_encoding=value_encoding, key_schema=key_schema)
    settings = PollSettings(
        poll=PollConfig(dsn=dsn, batch_size=batch_size, interval=interval,
                        max_attempts=max_attempts, backoff_base=backoff_base,
                        backoff_max=backoff_max, workers=workers, notify=not no_notify,
                        strict_order=strict_order, pipeline=not no_pipeline),
        outbox=outbox_config(table, columns),
        router=router_config(topic_pattern, dead_letter_topic, message_format, header,
                             partition_column, cloudevents_source),
        kafka=KafkaConfig(brokers=brokers, producer_config=parse_producer_config(producer_config),
                          message_timeout_ms=int(message_timeout * 1000), schema_registry=registry),
        metrics=MetricsConfig(port=metrics_port, host=metrics_host),
        sink=other,
    )
    return run_poll(settings)


@cli.group("dead-letters")
def dead_letters() -> None:
    """Inspect, requeue (polling mode) and replay (WAL mode) dead letters."""


@dead_letters.command("list")
@credentials_options
@option("--dsn", default=None, help="PostgreSQL connection string: polling mode's dead letters "
        "(rows of the outbox).")
@option("--from-topic", default=None, metavar="TOPIC",
        help="Read WAL mode's dead letters from this topic instead (needs --brokers).")
@option("--brokers", default=None, help="Kafka bootstrap servers, for --from-topic.")
@option("--producer-config", multiple=True, metavar="KEY=VALUE",
        help="librdkafka settings (SASL/SSL) for --from-topic, as given to the relay.")
@table_option
@columns_option
@option("--limit", type=click.IntRange(1), default=100, show_default=True,
        help="Show at most this many (oldest first).")
@format_option
def dead_letters_list(dsn: str | None, from_topic: str | None, brokers: str | None,
                      producer_config: tuple[str, ...], table: TableRef, columns: str | None,
                      limit: int, output_format: str) -> None:
    """List dead letters: id, aggregate, event type, attempts or topic, error, times."""
    if from_topic is not None:
        from cdc_relay.cli.ops import list_topic_dead_letters

        list_topic_dead_letters(from_topic, brokers, producer_config, limit, output_format)
        return
    if dsn is None:
        raise click.UsageError("give --dsn (polling mode's dead letters, in the outbox table) or "
                               "--from-topic TOPIC --brokers HOST:PORT (WAL mode's)")
    from cdc_relay.app.poll import dead_letters_json, dead_letters_table, list_dead_letters

    rows = list_dead_letters(dsn, outbox_config(table, columns), limit)
    click.echo(dead_letters_json(rows) if output_format == "json" else dead_letters_table(rows))


@dead_letters.command("retry")
@dsn_option
@table_option
@columns_option
@click.option("--id", "ids", type=click.UUID, multiple=True, metavar="UUID",
              help="A dead letter to requeue (repeatable).")
@click.option("--all", "retry_all", is_flag=True, default=False, help="Requeue every dead letter.")
def dead_letters_retry(dsn: str, table: TableRef, columns: str | None, ids: tuple[Any, ...],
                       retry_all: bool) -> None:
    """Requeue dead letters: attempts reset, published by the next poll."""
    from cdc_relay.app.poll import retry_dead_letters

    if bool(ids) == retry_all:
        raise click.UsageError("give either --id UUID (repeatable) or --all")
    report = retry_dead_letters(dsn, outbox_config(table, columns),
                                None if retry_all else [str(i) for i in ids])
    click.echo(str(report))


@cli.command()
@dsn_option
@table_option
@columns_option
@option("--older-than", type=DURATION, required=True,
        help="Delete rows processed longer ago than this, e.g. 7d.")
@option("--batch", type=click.IntRange(1), default=10_000, show_default=True,
        help="Rows deleted per transaction (keeps locks short).")
@option("--wal-mode", is_flag=True, default=False,
        help="The table is relayed by 'run' (WAL mode never sets processed_at): delete every "
             "row created before the cut-off, not only processed ones.")
def cleanup(dsn: str, table: TableRef, columns: str | None, older_than: float, batch: int,
            wal_mode: bool) -> None:
    """Delete processed outbox rows older than a duration (pending and dead letters stay)."""
    from cdc_relay.app.poll import cleanup as cleanup_rows

    deleted = cleanup_rows(dsn, outbox_config(table, columns), older_than, batch, wal_mode=wal_mode)
    click.echo(f"deleted {deleted} {'' if wal_mode else 'processed '}row(s)")


def main() -> None:
    """Run the CLI (the process entry point, cli/entry.py, tunes the collector first)."""
    main_entry(cli)


# ---------------------------------------------------------------- operations

from cdc_relay.cli.ops import doctor, replay, slot, status  # noqa: E402 - registered after the group

dead_letters.add_command(replay)
cli.add_command(status)
cli.add_command(doctor)
cli.add_command(slot)
from cdc_relay.cli.capture import snapshot  # noqa: E402 - registered after the group

cli.add_command(snapshot)
from cdc_relay.cli.demo import demo  # noqa: E402 - registered after the group

cli.add_command(demo)
from cdc_relay.cli.local import local  # noqa: E402 - registered after the group

cli.add_command(local)
from cdc_relay.cli.config_show import config  # noqa: E402 - registered after the group

cli.add_command(config)

"""Operator commands: ``status``, ``doctor``, ``slot drop``, ``dead-letters replay`` - click only.

Parse, build config, call cdc_relay/app/ops.py or app/dead_letters.py, print. Registered on
the group at the end of cdc_relay.cli.main. Options come from cdc_relay.cli.options, so each
has its ``CDC_RELAY_*`` variable and may come from the ``--config`` file like every other
command's.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from cdc_relay.cli.options import (
    columns_option,
    dsn_option,
    format_option,
    option,
    outbox_config,
    plugin_option,
    publication_option,
    slot_option,
    standby_dsn_option,
    table_option,
)
from cdc_relay.cli.sink_options import BROKERS_HELP, brokers_option, sink_options, sink_settings, sink_topics
from cdc_relay.config import KafkaConfig, TableRef, parse_producer_config
from cdc_relay.errors import ConfigError


@click.command()
@dsn_option
@slot_option
@table_option
@columns_option
@standby_dsn_option
@option("--signal-table", default=None, metavar="SCHEMA.TABLE",
        help="The relay's run --signal-table: incremental snapshots' progress is read in its "
             "schema (default: cdc_relay_signal in --table's schema).")
@format_option
def status(dsn: str, slot: str, table: TableRef, columns: str | None, standby_dsn: str | None,
           signal_table: str | None, output_format: str) -> None:
    """Slot position and lag, WAL retained, failover readiness, pending rows, dead letters."""
    from cdc_relay.app.ops import status as read_status

    click.echo(read_status(dsn, slot, outbox_config(table, columns), standby_dsn, output_format,
                           signal_table))


@click.command()
@dsn_option
@sink_options
@option("--brokers", default=None, help="Also check that the broker answers. " + BROKERS_HELP)
@option("--producer-config", multiple=True, metavar="KEY=VALUE",
        help="librdkafka settings for the broker check (SASL/SSL), as given to the relay.")
@slot_option
@plugin_option
@publication_option
@table_option
@columns_option
@option("--mode", type=click.Choice(["wal", "poll"]), default="wal", show_default=True,
        help="Which relay mode to check for (poll skips the logical decoding checks).")
@option("--topic-pattern", default="outbox.event.{aggregate_type}", show_default=True,
        help="The relay's topic pattern (NATS: the subjects the stream must cover).")
@option("--dead-letter-topic", default="outbox.dead-letters", show_default=True,
        help="The relay's dead-letter topic.")
@option("--exactly-once", is_flag=True, default=False,
        help="Also check run --exactly-once: checkpoint topic, checkpoint vs slot, ACL hints.")
@option("--checkpoint-topic", default="cdc-relay.checkpoints", show_default=True,
        help="The checkpoint topic the relay uses (with --exactly-once).")
@option("--capture", default=None, metavar="TABLE[,TABLE...]",
        help="Also check run --capture's tables: they exist, replica identity, SELECT, "
             "the publication.")
@standby_dsn_option
@format_option
def doctor(dsn: str, sink: str, sink_config: tuple[str, ...], brokers: str | None,
           producer_config: tuple[str, ...], slot: str, plugin: str | None, publication: str,
           table: TableRef, columns: str | None, mode: str, topic_pattern: str,
           dead_letter_topic: str, exactly_once: bool, checkpoint_topic: str,
           capture: str | None, standby_dsn: str | None, output_format: str) -> int:
    """Check the server, role, table, slot and broker; print the fix for each failure."""
    from cdc_relay.app.ops import doctor as run_doctor

    kafka = other = None
    topic_pattern, dead_letter_topic = sink_topics(sink, topic_pattern, dead_letter_topic)
    if brokers:
        other = sink_settings(sink, brokers, sink_config, producer_config,
                              topic_pattern=topic_pattern, dead_letter_topic=dead_letter_topic,
                              message_timeout=30.0)
        if other is None:
            kafka = KafkaConfig(brokers=brokers,
                                producer_config=parse_producer_config(producer_config))
    elif sink != "kafka":
        raise ConfigError(f"doctor --sink {sink} needs --brokers (the address the relay uses)")
    text, code = run_doctor(dsn=dsn, outbox=outbox_config(table, columns), slot=slot,
                              plugin=plugin, publication=publication, mode=mode, kafka=kafka,
                              sink=other, standby_dsn=standby_dsn, exactly_once=exactly_once,
                              checkpoint_topic=checkpoint_topic, output_format=output_format,
                              capture=capture)
    click.echo(text)
    return code


@click.group()
def slot() -> None:
    """Manage the logical replication slot."""


@slot.command("drop")
@dsn_option
@slot_option
@click.option("--yes", is_flag=True, default=False,
              help="Do not ask for confirmation (needed when stdin is not a terminal).")
def slot_drop(dsn: str, slot: str, yes: bool) -> None:
    """Drop the slot: its position is lost, the server frees the WAL it retained."""
    from cdc_relay.app.ops import drop_slot, drop_slot_question
    from cdc_relay.config import validate_slot_name

    validate_slot_name(slot)
    if not yes:
        if sys.stdin is None or not sys.stdin.isatty():
            raise ConfigError(f"refusing to drop replication slot {slot!r} without confirmation: "
                              "stdin is not a terminal; pass --yes")
        click.confirm(drop_slot_question(dsn, slot), abort=True, err=True)
    drop_slot(dsn, slot)
    click.echo(f"dropped replication slot {slot}")


# ---------------------------------------------------------------- WAL mode's dead letters

def _kafka(brokers: str | None, producer_config: tuple[str, ...]) -> KafkaConfig:
    if not brokers:
        raise click.UsageError("--from-topic needs --brokers HOST:PORT")
    return KafkaConfig(brokers=brokers, producer_config=parse_producer_config(producer_config))


def list_topic_dead_letters(topic: str, brokers: str | None, producer_config: tuple[str, ...],
                            limit: int, output_format: str) -> None:
    """``dead-letters list --from-topic``: one line (or object) per event, oldest first."""
    from cdc_relay.app.dead_letters import list_from_topic

    click.echo(list_from_topic(_kafka(brokers, producer_config), topic, limit, output_format))


@click.command("replay")
@option("--from-topic", required=True, metavar="TOPIC",
        help="The dead-letter topic WAL mode wrote to (the relay's --dead-letter-topic).")
@brokers_option
@option("--producer-config", multiple=True, metavar="KEY=VALUE",
        help="librdkafka settings (SASL/SSL), as given to the relay.")
@click.option("--id", "ids", type=click.UUID, multiple=True, metavar="UUID",
              help="An event to replay (repeatable).")
@click.option("--all", "replay_all", is_flag=True, default=False,
              help="Replay every event in the topic.")
@option("--to-original", is_flag=True, default=False,
        help="Send to the topic named in the dead letter's original_topic header instead of "
             "routing again with --topic-pattern.")
@option("--topic-pattern", default="outbox.event.{aggregate_type}", show_default=True,
        help="Topic name pattern to route with (as the relay's).")
@table_option
def replay(from_topic: str, brokers: str, producer_config: tuple[str, ...], ids: tuple[Any, ...],
           replay_all: bool, to_original: bool, topic_pattern: str, table: TableRef) -> int:
    """Produce WAL mode's dead letters again (same id, key, value, headers); the topic keeps them."""
    from cdc_relay.app.dead_letters import replay as replay_dead_letters

    if bool(ids) == replay_all:
        raise click.UsageError("give either --id UUID (repeatable) or --all")
    return replay_dead_letters(_kafka(brokers, producer_config), from_topic,
                               None if replay_all else [str(i) for i in ids],
                               to_original=to_original, topic_pattern=topic_pattern, table=table,
                               say=lambda line, error: click.echo(line, err=error))

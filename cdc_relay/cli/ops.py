"""Operator commands: ``status``, ``doctor``, ``slot drop`` - click only (issue 5).

Parse, build config, call ops.py / doctor.py, print. Registered on the group at the end of
cli.py. Options come from the cli_support frame, so each has its ``CDC_RELAY_*`` variable
and may come from the ``--config`` file like every other command's.
"""

from __future__ import annotations

import sys

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
    table_option,
)
from cdc_relay.config import KafkaConfig, TableRef, parse_producer_config
from cdc_relay.errors import ConfigError, ExitCode


@click.command()
@dsn_option
@slot_option
@table_option
@columns_option
@format_option
def status(dsn: str, slot: str, table: TableRef, columns: str | None, output_format: str) -> None:
    """Slot position and lag, WAL retained, pending outbox rows, dead letters."""
    from cdc_relay.ops.status import status as read_status

    report = read_status(dsn, slot, outbox_config(table, columns))
    click.echo(report.to_json() if output_format == "json" else "\n".join(report.lines()))


@click.command()
@dsn_option
@option("--brokers", default=None, help="Also check that a broker answers (HOST:PORT[,...]).")
@option("--producer-config", multiple=True, metavar="KEY=VALUE",
        help="librdkafka settings for the broker check (SASL/SSL), as given to the relay.")
@slot_option
@plugin_option
@publication_option
@table_option
@columns_option
@option("--mode", type=click.Choice(["wal", "poll"]), default="wal", show_default=True,
        help="Which relay mode to check for (poll skips the logical decoding checks).")
@option("--exactly-once", is_flag=True, default=False,
        help="Also check run --exactly-once: checkpoint topic, checkpoint vs slot, ACL hints.")
@option("--checkpoint-topic", default="cdc-relay.checkpoints", show_default=True,
        help="The checkpoint topic the relay uses (with --exactly-once).")
@format_option
def doctor(dsn: str, brokers: str | None, producer_config: tuple[str, ...], slot: str,
           plugin: str, publication: str, table: TableRef, columns: str | None, mode: str,
           exactly_once: bool, checkpoint_topic: str, output_format: str) -> int:
    """Check the server, role, table, slot and broker; print the fix for each failure."""
    from cdc_relay.ops.doctor.checks import DoctorOptions
    from cdc_relay.ops.doctor.gather import run_doctor
    from cdc_relay.ops.doctor.report import failed, format_checks, format_checks_json

    kafka = None
    if brokers:
        kafka = KafkaConfig(brokers=brokers, producer_config=parse_producer_config(producer_config))
    checks = run_doctor(DoctorOptions(dsn=dsn, outbox=outbox_config(table, columns), slot=slot,
                                      plugin=plugin, publication=publication, mode=mode,
                                      kafka=kafka))
    if exactly_once:
        from cdc_relay.ops.doctor.gather_exactly_once import run_exactly_once_checks

        checks += run_exactly_once_checks(dsn, slot, kafka, checkpoint_topic)
    click.echo(format_checks_json(checks) if output_format == "json" else format_checks(checks))
    return ExitCode.FAILURE if failed(checks) else ExitCode.OK


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
    from cdc_relay.config import validate_slot_name
    from cdc_relay.db import describe_dsn
    from cdc_relay.ops.status import drop_replication_slot

    validate_slot_name(slot)
    if not yes:
        if sys.stdin is None or not sys.stdin.isatty():
            raise ConfigError(f"refusing to drop replication slot {slot!r} without confirmation: "
                              "stdin is not a terminal; pass --yes")
        click.confirm(f"Drop replication slot {slot!r} on {describe_dsn(dsn)}? Events committed "
                      "while no slot exists are never relayed", abort=True, err=True)
    drop_replication_slot(dsn, slot)
    click.echo(f"dropped replication slot {slot}")

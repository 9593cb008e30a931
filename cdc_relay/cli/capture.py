"""The options of ``run --capture`` (table CDC), gathered into one CaptureConfig value.

``capture_options`` adds the flags and hands the command a single ``capture`` argument
(None unless ``--capture``); ``snapshot`` is the command that asks a running relay for an
incremental snapshot (a signal row). Every option has its ``CDC_RELAY_*`` variable and
config-file key like the others (``capture = "public.*"`` under ``[run]``). It must not
contain command logic.
"""

from __future__ import annotations

import functools
from typing import Any

import click

from cdc_relay.capture.modes import (
    BINARY_MODES,
    DECIMAL_MODES,
    HSTORE_MODES,
    INTERVAL_MODES,
    TIME_MODES,
)
from cdc_relay.capture.names import NAME_ADJUSTMENT_MODES
from cdc_relay.cli.options import F, dsn_option, option
from cdc_relay.config import UNAVAILABLE_VALUE, CaptureConfig
from cdc_relay.errors import ConfigError

# option suffix, allowed values, the Debezium property it mirrors (docs/table-cdc.md, type modes)
MODE_OPTIONS = (
    ("decimal_handling", DECIMAL_MODES, "decimal.handling.mode"),
    ("time_precision", TIME_MODES, "time.precision.mode"),
    ("interval_handling", INTERVAL_MODES, "interval.handling.mode"),
    ("binary_handling", BINARY_MODES, "binary.handling.mode"),
    ("hstore_handling", HSTORE_MODES, "hstore.handling.mode"),
)
CAPTURE_PARAMS = ("capture", "capture_prefix", "no_outbox", "capture_tombstones", "capture_placeholder",
          "capture_truncate", *(f"capture_{name}" for name, _, _ in MODE_OPTIONS),
          "capture_money_fraction_digits", "signal_table", "snapshot_chunk_size",
          "capture_schema_name_adjustment", "capture_field_name_adjustment")



def capture_options(f: F) -> F:
    """Add the capture options; the command receives ``capture=CaptureConfig|None``."""

    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in CAPTURE_PARAMS}
        kwargs["capture"] = config_from(values)
        return f(*args, **kwargs)

    decorators = [
        option("--capture", default=None, metavar="TABLE[,TABLE...]",
               help="Stream these tables' changes as Debezium's PostgreSQL change events: "
                    "schema.table or schema.* (docs/table-cdc.md). pgoutput only."),
        option("--capture-prefix", default=None,
               help="Topic prefix of captured tables (PREFIX.SCHEMA.TABLE), as Debezium's "
                    "topic.prefix; required with --capture."),
        option("--no-outbox", is_flag=True, default=False,
               help="Capture tables only: relay no outbox (needs --capture)."),
        option("--capture-tombstones/--no-capture-tombstones", default=True, show_default=True,
               help="A tombstone (key, null value) after each captured delete."),
        option("--capture-placeholder", default=UNAVAILABLE_VALUE, show_default=True,
               help="The value written for an unchanged TOASTed column."),
        option("--capture-truncate/--no-capture-truncate", default=False, show_default=True,
               help="A TRUNCATE of a captured table as an op: t event (the publication then "
                    "publishes truncates; off as in Debezium)."),
        *(option(f"--capture-{name.replace('_', '-')}", type=click.Choice(allowed),
                 default=allowed[0], show_default=True,
                 help=f"Captured tables' values as Debezium's {prop} writes them.")
          for name, allowed, prop in MODE_OPTIONS),
        option("--capture-money-fraction-digits", type=click.IntRange(0, 20), default=2,
               show_default=True, help="The scale of a money column (Debezium's "
                                       "money.fraction.digits)."),
        option("--signal-table", default=None, metavar="SCHEMA.TABLE",
               help="Incremental snapshots' signal table, as Debezium's signal.data.collection "
                    "(default: cdc_relay_signal in --table's schema; docs/table-cdc.md)."),
        option("--snapshot-chunk-size", type=int, default=1024, show_default=True,
               help="Rows per chunk of an incremental snapshot (Debezium's "
                    "incremental.snapshot.chunk.size)."),
        option("--capture-schema-name-adjustment", type=click.Choice(NAME_ADJUSTMENT_MODES),
               default="none", show_default=True,
               help="Debezium's schema.name.adjustment.mode: avro makes PREFIX.SCHEMA.TABLE "
                    "schema names Avro-legal (my-table -> my_table)."),
        option("--capture-field-name-adjustment", type=click.Choice(NAME_ADJUSTMENT_MODES),
               default="none", show_default=True,
               help="Debezium's field.name.adjustment.mode: avro makes column names "
                    "Avro-legal (order-id -> order_id, 1st -> _1st)."),
    ]
    wrapped: Any = command
    for decorator in reversed(decorators):
        wrapped = decorator(wrapped)
    return wrapped  # type: ignore[no-any-return]


def config_from(values: dict[str, Any]) -> CaptureConfig | None:
    """The CaptureConfig of the options' values; None without --capture (ConfigError for
    the options that need it)."""
    if values["capture"] is None:
        if values["capture_prefix"] is not None or values["no_outbox"]:
            raise ConfigError("--capture-prefix and --no-outbox need --capture TABLE[,TABLE...]")
        return None
    if values["capture_prefix"] is None:
        raise ConfigError("--capture needs --capture-prefix (the topics are PREFIX.SCHEMA.TABLE, "
                          "as Debezium's topic.prefix)")
    modes = {name: values[f"capture_{name}"] for name, _, _ in MODE_OPTIONS}
    return CaptureConfig(values["capture"], values["capture_prefix"], not values["no_outbox"],
                         values["capture_tombstones"], values["capture_placeholder"],
                         values["capture_truncate"], **modes,
                         money_fraction_digits=values["capture_money_fraction_digits"],
                         signal_table=values["signal_table"],
                         chunk_size=values["snapshot_chunk_size"],
                         schema_name_adjustment=values["capture_schema_name_adjustment"],
                         field_name_adjustment=values["capture_field_name_adjustment"])


@click.command("snapshot")
@dsn_option
@click.argument("tables", nargs=-1, metavar="[SCHEMA.TABLE]...")
@option("--signal-table", default="public.cdc_relay_signal", show_default=True,
        help="The running relay's signal table (run --signal-table).")
@option("--stop", is_flag=True, default=False,
        help="Write a stop-snapshot signal instead of execute-snapshot.")
def snapshot(dsn: str, tables: tuple[str, ...], signal_table: str, stop: bool) -> None:
    """Ask a running relay for an incremental snapshot of captured tables (docs/table-cdc.md).

    With --stop, the named tables' snapshots end (all of them when none is named)."""
    from cdc_relay.app.incremental import request_snapshot
    from cdc_relay.config import TableRef

    if not tables and not stop:
        raise ConfigError("snapshot needs the captured tables to snapshot: cdc-relay snapshot "
                          "--dsn DSN SCHEMA.TABLE [SCHEMA.TABLE...]")
    click.echo(request_snapshot(dsn, TableRef.parse(signal_table), list(tables), stop=stop))

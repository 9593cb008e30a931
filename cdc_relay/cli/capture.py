"""The options of ``run --capture`` (table CDC), gathered into one CaptureConfig value.

``capture_options`` adds the flags and hands the command a single ``capture`` argument
(None unless ``--capture``). Every option has its ``CDC_RELAY_*`` variable and
config-file key like the others (``capture = "public.*"`` under ``[run]``). It must not
contain command logic.
"""

from __future__ import annotations

import functools
from typing import Any

import click

from cdc_relay.capture.names import NAME_ADJUSTMENT_MODES
from cdc_relay.cli.options import F, option
from cdc_relay.config import UNAVAILABLE_VALUE, CaptureConfig
from cdc_relay.errors import ConfigError

_NAMES = ("capture", "capture_prefix", "no_outbox", "capture_tombstones", "capture_placeholder",
          "capture_truncate", "capture_schema_name_adjustment", "capture_field_name_adjustment")


def capture_options(f: F) -> F:
    """Add the capture options; the command receives ``capture=CaptureConfig|None``."""

    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in _NAMES}
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
    return CaptureConfig(values["capture"], values["capture_prefix"], not values["no_outbox"],
                         values["capture_tombstones"], values["capture_placeholder"],
                         values["capture_truncate"], values["capture_schema_name_adjustment"],
                         values["capture_field_name_adjustment"])

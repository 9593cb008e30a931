"""The start-up check of the columns the message options name (docs/messages.md).

Owns ``resolve_message_columns``: before either mode starts, read the outbox table's
columns once and

* refuse (ConfigError: one line, exit 2) a ``--header`` or ``--partition-column`` that
  names a column the table does not have, or a partition column that is not an integer
  type - a typo must not silently publish messages without the header;
* return the OutboxConfig the mode's readers need: ``extra_columns`` (what the router
  reads, in its order) and ``trace_columns`` (``traceparent`` / ``tracestate`` if the
  table has them, i.e. after ``init --with-trace-context``).

Must not: change the table, or decide what a missing *table* means (each mode's own
start-up check reports that, with its fix): with no table it returns the config as is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psycopg
from psycopg import sql

from cdc_relay.config import OutboxConfig, RouterConfig
from cdc_relay.errors import ConfigError
from cdc_relay.model import TRACE_COLUMNS
from cdc_relay.pg.db import borrowed_or_new, translate_error

_INTEGER_TYPES = ("int2", "int4", "int8")
_COLUMNS_QUERY = (
    "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
    " WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped"
)


def table_columns(dsn: str, outbox: OutboxConfig, *,
                  conn: psycopg.Connection[Any] | None = None) -> dict[str, str] | None:
    """Column name -> type name of the outbox table; None when the table does not exist.

    On ``conn`` (an open autocommit connection, left open) if given, else on a new one.
    """
    name = sql.Identifier(outbox.table.schema, outbox.table.name)
    with borrowed_or_new(dsn, conn) as conn:
        try:
            exists = conn.execute("SELECT to_regclass(%s)", (name.as_string(conn),)).fetchone()
            if exists is None or exists[0] is None:
                return None
            rows = conn.execute(_COLUMNS_QUERY, (name.as_string(conn),)).fetchall()
        except psycopg.Error as exc:
            raise translate_error(exc, f"reading the columns of {outbox.table}") from exc
    return {str(column): str(type_name) for column, type_name in rows}


def check_columns(columns: dict[str, str], outbox: OutboxConfig, router: RouterConfig) -> OutboxConfig:
    """Validate the named columns against ``columns``; return the OutboxConfig to read with."""
    for column, header in router.header_columns:
        if column not in columns:
            raise ConfigError(
                f"--header {column}:{header}: table {outbox.table} has no column {column!r} "
                f"(it has {', '.join(sorted(columns))})"
            )
    partition = router.partition_column
    if partition is not None:
        if partition not in columns:
            raise ConfigError(
                f"--partition-column {partition}: table {outbox.table} has no column "
                f"{partition!r} (it has {', '.join(sorted(columns))})"
            )
        if columns[partition] not in _INTEGER_TYPES:
            raise ConfigError(
                f"--partition-column {partition}: column {partition!r} of {outbox.table} is "
                f"{columns[partition]}, not an integer type (smallint, integer or bigint)"
            )
    trace: tuple[str, ...] = ()
    if TRACE_COLUMNS[0] in columns:
        trace = tuple(name for name in TRACE_COLUMNS if name in columns)
    return replace(outbox, extra_columns=router.extra_columns(), trace_columns=trace)


def resolve_message_columns(dsn: str, outbox: OutboxConfig, router: RouterConfig, *,
                            conn: psycopg.Connection[Any] | None = None) -> OutboxConfig:
    """Read the table's columns and ``check_columns`` them (the table as is when absent)."""
    columns = table_columns(dsn, outbox, conn=conn)
    if columns is None:
        return replace(outbox, extra_columns=router.extra_columns())
    return check_columns(columns, outbox, router)

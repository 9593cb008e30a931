"""Incremental snapshots' tables on the primary: the signal table and the progress table.

* The **signal table** (``run --capture``'s ``--signal-table``, default
  ``<outbox schema>.cdc_relay_signal``) has Debezium's ``signal.data.collection`` shape
  (``id``, ``type``, ``data``); ``ensure_tables`` creates it (``init --capture``, ``run
  --capture``), the capture publication publishes it, and ``write_signal`` is ``cdc-relay
  snapshot``'s insert.
* The **progress table** ``<signal schema>.cdc_relay_incremental``, one row per (slot,
  table): the signal that asked for it, ``state`` (``queued``, ``running``, ``done``,
  ``stopped``), the largest key when it began (``upto``), the last key of the last
  acknowledged chunk and the rows acknowledged. ``ProgressTable`` is
  capture/incremental.py's ``ProgressStore`` over it (autocommit: each write survives a
  ``kill -9``); ``read_progress`` is ``status``'s.

Must not: read chunks (chunks.py), decide what to snapshot (capture/incremental.py), or
interpolate names into SQL (every name is a quoted identifier).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
from psycopg import sql

from cdc_relay.capture.chunks import Key, TableProgress
from cdc_relay.config import TableRef
from cdc_relay.errors import SourceLost
from cdc_relay.pg.db import translate_error

PROGRESS_TABLE = "cdc_relay_incremental"
SIGNAL_TABLE = "cdc_relay_signal"


def signal_ref(option: str | None, outbox: TableRef) -> TableRef:
    """``--signal-table`` (``run``, ``init``, ``status``), or ``cdc_relay_signal`` in the
    outbox table's (``--table``'s) schema; ConfigError for a malformed name."""
    return TableRef.parse(option) if option else TableRef(outbox.schema, SIGNAL_TABLE)

_SIGNAL = """
CREATE TABLE IF NOT EXISTS {signal} (
    id   varchar(42) PRIMARY KEY,
    type varchar(32) NOT NULL,
    data varchar(2048)
)
"""

_PROGRESS = """
CREATE TABLE IF NOT EXISTS {progress} (
    slot_name   text NOT NULL,
    schema_name text NOT NULL,
    table_name  text NOT NULL,
    signal_id   text NOT NULL,
    state       text NOT NULL CHECK (state IN ('queued', 'running', 'done', 'stopped')),
    upto        text[],
    last_key    text[],
    rows_done   bigint NOT NULL DEFAULT 0,
    queued_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (slot_name, schema_name, table_name)
)
"""


def progress_table(signal: TableRef) -> sql.Identifier:
    """The progress table lives in the signal table's schema."""
    return sql.Identifier(signal.schema, PROGRESS_TABLE)


def ensure_tables(conn: psycopg.Connection[Any], signal: TableRef) -> None:
    """Create the signal and progress tables when missing (idempotent)."""
    try:
        conn.execute(sql.SQL(_SIGNAL).format(signal=sql.Identifier(signal.schema, signal.name)))
        conn.execute(sql.SQL(_PROGRESS).format(progress=progress_table(signal)))
    except psycopg.Error as exc:
        raise translate_error(exc, f"creating the signal table {signal}", conn=conn) from exc


def write_signal(conn: psycopg.Connection[Any], signal: TableRef, tables: list[str], *,
                 stop: bool = False) -> str:
    """Insert an ``execute-snapshot`` (or ``stop-snapshot``) row; its id."""
    ident = str(uuid.uuid4())
    data = json.dumps({"data-collections": tables, "type": "incremental"})
    kind = "stop-snapshot" if stop else "execute-snapshot"
    try:
        conn.execute(sql.SQL("INSERT INTO {} (id, type, data) VALUES (%s, %s, %s)").format(
            sql.Identifier(signal.schema, signal.name)), (ident, kind, data))
    except psycopg.Error as exc:
        raise translate_error(exc, f"writing a signal into {signal}", grant="INSERT",
                              conn=conn) from exc
    return ident


def read_progress(conn: psycopg.Connection[Any], signal: TableRef, slot: str
                  ) -> list[tuple[str, str, int]]:
    """(``schema.table``, state, rows acknowledged) of the slot's snapshots, oldest first;
    empty when the progress table does not exist."""
    name = progress_table(signal)
    try:
        found = conn.execute("SELECT to_regclass(%s)", (name.as_string(conn),)).fetchone()
        if found is None or found[0] is None:
            return []
        rows = conn.execute(sql.SQL(
            "SELECT schema_name || '.' || table_name, state, rows_done FROM {}"
            " WHERE slot_name = %s ORDER BY queued_at").format(name), (slot,)).fetchall()
    except psycopg.Error as exc:
        raise translate_error(exc, "reading the incremental snapshots' progress") from exc
    return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]


class ProgressTable:
    """capture/incremental.py's ProgressStore over the progress table (see the module
    docstring). ``connection()`` is the edge's shared connection (autocommit)."""

    def __init__(self, connection: Any, signal: TableRef, slot: str) -> None:
        self._connection = connection
        self._name = progress_table(signal)
        self._slot = slot

    def unfinished(self) -> list[TableProgress]:
        rows = self._execute(
            "SELECT schema_name, table_name, signal_id, last_key, upto, rows_done FROM {}"
            " WHERE slot_name = %s AND state IN ('queued', 'running') ORDER BY queued_at",
            (self._slot,)).fetchall()
        return [TableProgress(r[0], r[1], r[2], _key(r[3]), _key(r[4]), int(r[5])) for r in rows]

    def queue(self, signal_id: str, tables: list[tuple[str, str]]) -> None:
        for schema, table in tables:
            self._execute(
                "INSERT INTO {} AS p (slot_name, schema_name, table_name, signal_id, state)"
                " VALUES (%s, %s, %s, %s, 'queued') ON CONFLICT (slot_name, schema_name, table_name)"
                " DO UPDATE SET signal_id = excluded.signal_id, state = 'queued', upto = NULL,"
                " last_key = NULL, rows_done = 0, queued_at = clock_timestamp(),"
                " updated_at = now(), finished_at = NULL WHERE p.signal_id <> excluded.signal_id",
                (self._slot, schema, table, signal_id))

    def started(self, progress: TableProgress) -> None:
        self._update(progress, "state = 'running', upto = %s", list(progress.upto or ()))

    def progress(self, progress: TableProgress, last_key: Key | None) -> None:
        self._update(progress, "last_key = %s, rows_done = %s",
                     None if last_key is None else list(last_key), progress.rows)

    def finished(self, progress: TableProgress) -> None:
        self._update(progress, "state = 'done', rows_done = %s, finished_at = now()", progress.rows)

    def stopped(self, tables: list[tuple[str, str]] | None) -> None:
        query = ("UPDATE {} SET state = 'stopped', updated_at = now() WHERE slot_name = %s"
                 " AND state IN ('queued', 'running')")
        if tables is None:
            self._execute(query, (self._slot,))
            return
        for schema, table in tables:
            self._execute(query + " AND schema_name = %s AND table_name = %s",
                          (self._slot, schema, table))

    def _update(self, progress: TableProgress, assignments: str, *values: Any) -> None:
        self._execute("UPDATE {} SET " + assignments + ", updated_at = now() WHERE slot_name = %s"
                      " AND schema_name = %s AND table_name = %s AND signal_id = %s"
                      " AND state IN ('queued', 'running')",
                      (*values, self._slot, progress.schema, progress.table, progress.signal_id))

    def _execute(self, query: str, params: tuple[Any, ...]) -> psycopg.Cursor[Any]:
        conn = self._connection()
        try:
            return conn.execute(sql.SQL(query).format(self._name), params)  # type: ignore[no-any-return]
        except psycopg.OperationalError as exc:
            conn.close()
            raise SourceLost(f"lost the connection recording an incremental snapshot: {exc}") from exc
        except psycopg.Error as exc:
            raise translate_error(exc, "recording an incremental snapshot's progress") from exc


def _key(values: list[str | None] | None) -> Key | None:
    return None if values is None else tuple(values)

"""The backfill's durable, visible state: one row per slot in ``<schema>.cdc_relay_backfill``.

A row says which slot a backfill belongs to and how far it got:

* ``creating``: the relay is about to create the slot with an exported snapshot;
* ``running``: the slot exists and the pending rows are being published;
* ``done``: every row pending in the snapshot was acknowledged and marked processed.

A slot that exists with a ``creating`` or ``running`` row was left by an unfinished
backfill (a crash, a ``kill -9``, a stop mid-way): the next ``run --snapshot initial``
redoes it. A slot that exists with no row was not created by a backfill: the snapshot
is gone and ``--snapshot initial`` refuses. ``status`` and ``doctor`` read the row, and
``run --snapshot never`` warns about an unfinished one (``warn_if_unfinished``).

Only one relay backfills a slot at a time: each holds a session-level advisory lock
(``BACKFILL_LOCK``, the slot's hash) on its state connection for the whole backfill; a
crash releases it with the connection.

Must not: read or publish outbox rows (loop.py), create slots (snapshot.py), or
interpolate names into SQL (every name is a quoted identifier).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from cdc_relay.config import TableRef
from cdc_relay.model import Lsn
from cdc_relay.pg.db import translate_error

STATE_TABLE = "cdc_relay_backfill"
# pg_advisory_lock(int, int): this key, then hashtext(slot) ("cdcb" in ASCII).
BACKFILL_LOCK = 0x63646362

_CREATE = """
CREATE TABLE IF NOT EXISTS {state} (
    slot_name        text PRIMARY KEY,
    table_name       text NOT NULL,
    state            text NOT NULL CHECK (state IN ('creating', 'running', 'done')),
    consistent_point pg_lsn,
    rows_total       bigint,
    rows_done        bigint NOT NULL DEFAULT 0,
    attempt          int NOT NULL DEFAULT 1,
    started_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz
)
"""


@dataclass(frozen=True, slots=True)
class BackfillRecord:
    """One row of the state table."""

    slot: str
    table: str
    state: str
    consistent_point: Lsn | None
    rows_total: int | None
    rows_done: int
    attempt: int
    started_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        return self.state == "done"


def state_table(table: TableRef) -> sql.Identifier:
    """The state table lives in the outbox table's schema."""
    return sql.Identifier(table.schema, STATE_TABLE)


def read_record(conn: psycopg.Connection[Any], table: TableRef, slot: str) -> BackfillRecord | None:
    """The slot's row, or None (also when the state table does not exist yet)."""
    name = state_table(table)
    try:
        exists = conn.execute("SELECT to_regclass(%s)", (name.as_string(conn),)).fetchone()
        if exists is None or exists[0] is None:
            return None
        row = conn.execute(sql.SQL(
            "SELECT slot_name, table_name, state, consistent_point::text, rows_total, rows_done,"
            " attempt, started_at, updated_at, finished_at FROM {} WHERE slot_name = %s"
        ).format(name), (slot,)).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, f"reading the backfill state of slot {slot!r}") from exc
    if row is None:
        return None
    return BackfillRecord(row[0], row[1], row[2], Lsn.parse(row[3]) if row[3] else None,
                          *row[4:])


def warn_if_unfinished(conn: psycopg.Connection[Any], table: TableRef, slot: str) -> None:
    """``--snapshot never`` on a slot whose backfill did not finish: say what is left behind."""
    record = read_record(conn, table, slot)
    if record is not None and not record.finished:
        logging.getLogger("cdc_relay.backfill").warning(
            "the backfill of slot %s did not finish (%d of %s rows): with --snapshot never the "
            "rest of it is not published; start with --snapshot initial to redo it", slot,
            record.rows_done, record.rows_total, extra={"slot": slot})


def backfill_running(conn: psycopg.Connection[Any], slot: str) -> bool:
    """True while some session holds the slot's backfill lock."""
    try:
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = %s::int::oid AND objid = hashtext(%s)::oid"
            " AND objsubid = 2)", (BACKFILL_LOCK, slot)).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, "reading advisory locks") from exc
    return bool(row and row[0])


class StateStore:
    """The state connection of one backfill: holds the lock, writes the slot's row.

    Autocommit: each write is visible at once (``status`` shows progress) and survives
    a crash of the relay.
    """

    def __init__(self, conn: psycopg.Connection[Any], table: TableRef, slot: str, *,
                 reader_elsewhere: bool = False) -> None:
        """``reader_elsewhere``: the rows are read on another server (a standby), whose
        reading transaction this connection cannot see (``snapshot_age`` is None)."""
        self._conn = conn
        self._reader_elsewhere = reader_elsewhere
        self._table = table
        self._slot = slot
        self._name = state_table(table)

    def try_lock(self) -> bool:
        """Take the slot's backfill lock (session level) if no other relay holds it."""
        row = self._execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))",
                            (BACKFILL_LOCK, self._slot)).fetchone()
        return bool(row and row[0])

    def unlock(self) -> None:
        self._execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (BACKFILL_LOCK, self._slot))

    def read(self) -> BackfillRecord | None:
        return read_record(self._conn, self._table, self._slot)

    def begin(self) -> None:
        """Record that a backfill creates the slot now (a fresh row, attempt 1)."""
        self._execute(sql.SQL(_CREATE).format(state=self._name))
        self._execute(sql.SQL(
            "INSERT INTO {} (slot_name, table_name, state) VALUES (%s, %s, 'creating')"
            " ON CONFLICT (slot_name) DO UPDATE SET table_name = excluded.table_name,"
            " state = 'creating', consistent_point = NULL, rows_total = NULL, rows_done = 0,"
            " attempt = 1, started_at = now(), updated_at = now(), finished_at = NULL"
        ).format(self._name), (self._slot, str(self._table)))

    def started(self, consistent_point: Lsn | None, rows_total: int, *, redo: bool) -> None:
        """The slot exists and ``rows_total`` rows are to be published."""
        attempt = "attempt + 1" if redo else "attempt"
        point = "%s::pg_lsn" if consistent_point is not None else "consistent_point"
        params: tuple[Any, ...] = (rows_total, self._slot)
        if consistent_point is not None:
            params = (str(consistent_point), *params)
        self._execute(sql.SQL(
            "UPDATE {} SET state = 'running', consistent_point = " + point + ", rows_total = %s,"
            " rows_done = 0, attempt = " + attempt + ", updated_at = now() WHERE slot_name = %s"
        ).format(self._name), params)

    def progress(self, rows_done: int) -> None:
        self._execute(sql.SQL("UPDATE {} SET rows_done = %s, updated_at = now()"
                              " WHERE slot_name = %s").format(self._name), (rows_done, self._slot))

    def finished(self, rows_done: int) -> None:
        self._execute(sql.SQL(
            "UPDATE {} SET state = 'done', rows_done = %s, updated_at = now(), finished_at = now()"
            " WHERE slot_name = %s").format(self._name), (rows_done, self._slot))

    def snapshot_age(self, reader_pid: int) -> tuple[float, int] | None:
        """(seconds the reader's transaction is open, age of its xmin in transactions)."""
        if self._reader_elsewhere:
            return None
        row = self._execute(
            "SELECT extract(epoch FROM now() - xact_start)::float8, age(backend_xmin)"
            " FROM pg_stat_activity WHERE pid = %s", (reader_pid,)).fetchone()
        if row is None or row[0] is None:
            return None
        return float(row[0]), int(row[1] or 0)

    def _execute(self, query: Any, params: Any = None) -> psycopg.Cursor[Any]:
        try:
            return self._conn.execute(query, params)
        except psycopg.Error as exc:
            raise translate_error(exc, f"recording the backfill state of slot {self._slot!r}") \
                from exc

"""Polling mode's per-process and admin SQL: the monitor connection, dead letters, cleanup.

Owns the statements that are not part of a batch: the LISTEN/count connection every
``cdc-relay poll`` process keeps (``OutboxMonitor``: wakes the workers, refreshes the
pending and dead-letter gauges, checks the table before the workers start), and the
``dead-letters list|retry`` and ``cleanup`` commands. The statements themselves come
from ``OutboxQueries`` (polling/sql.py), so every name is a quoted identifier.

Must not: claim or settle batches (polling/claims.py), format output (app/poll.py), or
retry: a failure is a RelayError for the caller to report or retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from cdc_relay.config import OutboxConfig
from cdc_relay.errors import ConfigError, RelayError
from cdc_relay.model import BOOKKEEPING_COLUMNS, NOTIFY_TRIGGER
from cdc_relay.pg.db import (
    connect,
    translate_error,
    validated_columns,
    validated_table,
)
from cdc_relay.pg.endpoint import require_writable
from cdc_relay.polling.sql import OutboxQueries


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One row of the dead-letter state (``dead-letters list``)."""

    id: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    attempts: int
    last_error: str | None
    created_at: datetime | None
    dead_lettered_at: datetime


def _autocommit(dsn: str) -> psycopg.Connection[TupleRow]:
    return connect(dsn, autocommit=True, application_name="cdc-relay")


def count_pending(conn: psycopg.Connection[TupleRow], outbox: OutboxConfig) -> tuple[int, int]:
    """(pending rows, dead letters) of the outbox, on an autocommit connection."""
    queries = OutboxQueries(outbox)
    try:
        pending = conn.execute(queries.count_pending()).fetchone()
        dead = conn.execute(queries.count_dead_letters()).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, f"counting pending rows of {outbox.table}", conn=conn) from exc
    return (pending[0] if pending else 0), (dead[0] if dead else 0)


def list_dead_letters(dsn: str, outbox: OutboxConfig, limit: int) -> list[DeadLetter]:
    """Dead letters, oldest first, at most ``limit``."""
    queries = OutboxQueries(outbox)
    with _autocommit(dsn) as conn:
        try:
            rows = conn.execute(queries.list_dead_letters(), {"limit": limit}).fetchall()
        except psycopg.Error as exc:
            raise translate_error(exc, f"listing dead letters of {outbox.table}", grant="SELECT",
                                  conn=conn) from exc
    return [DeadLetter(*row) for row in rows]


def retry_dead_letters(dsn: str, outbox: OutboxConfig, ids: Sequence[str] | None) -> list[str]:
    """Requeue dead letters (``ids``, or all with None); return the ids requeued.

    Clears ``dead_lettered_at``, resets ``attempts`` and ``retry_after`` (``last_error``
    stays as history) and sends the table's NOTIFY in the same transaction: requeued
    rows get no trigger notification, so pollers would otherwise wait for their tick.
    """
    queries = OutboxQueries(outbox)
    with _autocommit(dsn) as conn:
        try:
            with conn.transaction():
                rows = conn.execute(queries.retry_dead_letters(all_rows=ids is None),
                                    {"ids": [str(i).lower() for i in ids or ()]}).fetchall()
                if rows:
                    conn.execute("SELECT pg_notify(%s, '')", (outbox.notify_channel,))
        except psycopg.Error as exc:
            raise translate_error(exc, f"requeueing dead letters of {outbox.table}",
                                  grant="SELECT, UPDATE", conn=conn) from exc
    return [row[0] for row in rows]


def cleanup(dsn: str, outbox: OutboxConfig, older_than: float, batch: int, *,
            wal_mode: bool = False) -> int:
    """Delete processed rows older than ``older_than`` seconds, ``batch`` rows per transaction.

    Each batch commits on its own, so no lock is held long and vacuum can follow.
    Pending and dead-lettered rows are never deleted - except that with ``wal_mode``
    (the table is relayed from the WAL, which never sets ``processed_at``) every row
    created before the cut-off goes, dead letters excepted. Returns the rows deleted.
    """
    queries = OutboxQueries(outbox)
    statement = queries.cleanup_batch(wal_mode=wal_mode)
    total = 0
    with _autocommit(dsn) as conn:
        try:
            while True:
                deleted = conn.execute(statement, {"older": older_than, "batch": batch}).rowcount
                total += max(deleted, 0)
                if deleted < batch:
                    return total
        except psycopg.Error as exc:
            raise translate_error(exc, f"cleaning up {outbox.table}", grant="SELECT, DELETE",
                                  conn=conn) from exc


class OutboxMonitor:
    """An autocommit connection that LISTENs for the insert trigger and counts the backlog.

    One per process: its notifications wake every worker (they sort out who gets which
    rows with SKIP LOCKED). Without ``listen`` it only counts.
    """

    def __init__(self, dsn: str, outbox: OutboxConfig, *, listen: bool) -> None:
        self._dsn = dsn
        self._outbox = outbox
        self._listen = listen
        self._conn: psycopg.Connection[TupleRow] | None = None

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def open(self) -> None:
        """Connect and LISTEN on the table's channel (quoted: channel names are identifiers)."""
        self.close()
        conn = connect(self._dsn, autocommit=True, application_name="cdc-relay poll monitor")
        try:
            if self._listen:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._outbox.notify_channel)))
        except psycopg.Error as exc:
            conn.close()
            raise translate_error(exc, f"listening on {self._outbox.notify_channel}") from exc
        self._conn = conn

    def check(self) -> None:
        """Raise ConfigError unless the outbox table and every column polling uses exist."""
        with _autocommit(self._dsn) as conn:
            # Polling's claims mark rows: a read-only node is the wrong endpoint, said now.
            require_writable(conn, self._dsn, "polling (its claims mark rows processed)")
            try:
                missing = _missing_columns(conn, self._outbox)
            except psycopg.Error as exc:
                raise translate_error(exc, f"checking {self._outbox.table}") from exc
        if missing is None:
            raise ConfigError(
                f"table {self._outbox.table} does not exist: create it with "
                f"`cdc-relay init --dsn ... --table {self._outbox.table} --no-slot`"
            )
        if missing:
            raise ConfigError(
                f"table {self._outbox.table} has no column(s) {', '.join(missing)}: run "
                "`cdc-relay init --no-slot` (it adds the bookkeeping columns), or map the "
                "event columns with --columns"
            )

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a notification; True if any came (all are consumed)."""
        conn = self._conn
        if conn is None or not self._listen:
            return False
        try:
            woke = any(True for _ in conn.notifies(timeout=timeout, stop_after=1))
            if woke:
                for _ in conn.notifies(timeout=0):
                    pass
        except psycopg.Error as exc:
            self.close()
            raise translate_error(exc, f"waiting for notifications on {self._outbox.notify_channel}") from exc
        return woke

    def counts(self) -> tuple[int, int]:
        """(pending rows, dead letters) now."""
        if self._conn is None:
            self.open()
        assert self._conn is not None
        try:
            return count_pending(self._conn, self._outbox)
        except RelayError:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None


def has_notify_trigger(dsn: str, outbox: OutboxConfig) -> bool:
    """Whether the table has the NOTIFY trigger ``init --mode poll`` installs."""
    table = validated_table(outbox.table)
    with _autocommit(dsn) as conn:
        try:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND "
                "tgname = %s AND NOT tgisinternal)",
                (f'"{table.schema}"."{table.name}"', NOTIFY_TRIGGER)).fetchone()
        except psycopg.Error as exc:
            raise translate_error(exc, f"checking {table} for its NOTIFY trigger",
                                  conn=conn) from exc
    return bool(row and row[0])


def _missing_columns(conn: psycopg.Connection[TupleRow], outbox: OutboxConfig) -> list[str] | None:
    """Columns polling needs that the table lacks; None if there is no such table."""
    table = validated_table(outbox.table)
    columns = validated_columns(outbox.columns)
    found = conn.execute(
        "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
        (table.schema, table.name),
    ).fetchone()
    if found is None:
        return None
    present = {row[0] for row in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
        (found[0],),
    )}
    wanted = [getattr(columns, role) for role in columns.__dataclass_fields__] + list(BOOKKEEPING_COLUMNS)
    return [name for name in wanted if name not in present]

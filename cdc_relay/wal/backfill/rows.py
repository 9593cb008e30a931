"""The backfill's database side: the pending rows of a snapshot, and marking them processed.

``SnapshotReader`` reads ``processed_at IS NULL AND dead_lettered_at IS NULL`` rows in a
``REPEATABLE READ READ ONLY`` transaction that imports the slot's exported snapshot (or,
when a crashed backfill is redone, in a fresh one), oldest first (``created_at``, then
table and heap position: an order fixed within one snapshot), through a server-side
cursor, so memory is bounded by the fetch size. Rows become OutboxEvents exactly as in
polling mode (the payload is the column's text output, the bytes WAL mode sends;
``created_at`` in epoch ms). ``RowMarker`` sets ``processed_at`` on acknowledged rows.

Must not: publish, decide anything about failures (loop.py), or touch the slot.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator
from typing import Any

import psycopg
from psycopg import sql

from cdc_relay.config import OutboxConfig, validate_identifier
from cdc_relay.errors import RelayError
from cdc_relay.model import OutboxEvent, carry
from cdc_relay.pg.db import connect, translate_error, validated_columns, validated_table

FETCH_SIZE = 2000  # rows per round trip of the server-side cursor
MARK_QUEUE = 2  # batches handed to the marker thread and not yet marked


class RowMarker:
    """Sets ``processed_at`` on acknowledged rows, on its own connection and thread.

    The UPDATEs cost the database about as much as reading and publishing the rows (measured:
    a third of the backfill's time when run inline), so they overlap with publishing. The
    queue holds at most ``MARK_QUEUE`` batches: a slow database slows the backfill down
    instead of growing memory or the window of acknowledged, unmarked rows.
    """

    def __init__(self, dsn: str, outbox: OutboxConfig) -> None:
        table = validated_table(outbox.table)
        self._sql = sql.SQL(
            "UPDATE {} SET processed_at = now() WHERE {} = ANY(%s) AND processed_at IS NULL"
        ).format(sql.Identifier(table.schema, table.name),
                 sql.Identifier(validated_columns(outbox.columns).id))
        self._conn = connect(dsn, autocommit=True, application_name="cdc-relay backfill marks")
        self._queue: queue.Queue[list[Any] | None] = queue.Queue(maxsize=MARK_QUEUE)
        self._error: RelayError | None = None
        self._thread = threading.Thread(target=self._run, name="backfill-marks", daemon=True)
        self._thread.start()

    def __call__(self, raw_ids: list[Any]) -> None:
        """Queue a batch (blocks while the queue is full); raise an earlier batch's error."""
        self._raise()
        self._queue.put(raw_ids)

    def drain(self) -> None:
        """Wait until every queued batch is marked; raise if one failed."""
        self._queue.join()
        self._raise()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(30)
        self._conn.close()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                if self._error is None:
                    self._conn.execute(self._sql, (batch,))
            except psycopg.Error as exc:
                self._error = translate_error(exc, "marking backfilled rows processed")
            finally:
                self._queue.task_done()


class SnapshotReader:
    """The reading transaction: pending rows of one snapshot, oldest first."""

    def __init__(self, dsn: str, outbox: OutboxConfig, snapshot_name: str | None, *,
                 horizon_xid: int | None = None) -> None:
        table = validated_table(outbox.table)
        cols = validated_columns(outbox.columns)
        c = {role: sql.Identifier(getattr(cols, role)) for role in cols.__dataclass_fields__}
        names: dict[str, sql.Composable] = {
            "t": sql.Identifier(table.schema, table.name),
            **{f"c_{k}": v for k, v in c.items()}, "h": sql.Literal(horizon_xid)}
        pending = "FROM {t} WHERE processed_at IS NULL AND dead_lettered_at IS NULL"
        if horizon_xid is not None:
            # A recovery (wal/recovery.py): only rows of transactions at or after the
            # horizon. age() compares 32-bit xids from one reference point, so both sides
            # are measured alike; the horizon's own age guards against wraparound.
            pending += (" AND (age(mod({h}, 4294967296)::text::xid) >= 2000000000"
                        " OR age(xmin) <= age(mod({h}, 4294967296)::text::xid))")
        self._count = sql.SQL("SELECT count(*) " + pending).format(**names)
        self._select = sql.SQL(
            "SELECT {c_id}::text, {c_aggregate_type}::text, {c_aggregate_id}::text,"
            " {c_event_type}::text, {c_payload}::text,"
            " CASE WHEN isfinite({c_created_at})"
            " THEN floor(extract(epoch FROM {c_created_at}) * 1000)::bigint END, {c_id}{carried} "
            + pending + " ORDER BY {c_created_at}, tableoid, ctid OFFSET %s").format(
                carried=_carried(outbox), **names)
        # Columns carried into the message (--header, --partition-column, trace context),
        # after the seven above, as polling reads them: the messages must be identical.
        self._extra = len(outbox.extra_columns)
        self._trace = len(outbox.trace_columns)
        self._dsn = dsn
        self._snapshot_name = snapshot_name
        self._conn: psycopg.Connection[Any] | None = None
        self._cursors = 0
        self.pid = 0
        self.snapshot_xmin: int | None = None  # the snapshot's xmin (a recovery's new horizon)

    def open(self) -> int:
        """Begin the transaction (importing the snapshot); return the number of pending rows."""
        conn = connect(self._dsn, application_name="cdc-relay backfill")
        self._conn = conn
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        try:
            if self._snapshot_name is not None:
                # The first statement of the transaction: BEGIN is sent just before it.
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(
                    sql.Literal(self._snapshot_name)))
            row = conn.execute(self._count).fetchone()
            pid = conn.execute("SELECT pg_backend_pid(),"
                               " pg_snapshot_xmin(pg_current_snapshot())::text::bigint").fetchone()
        except psycopg.Error as exc:
            self.close()
            raise translate_error(exc, "opening the backfill's snapshot") from exc
        self.pid = int(pid[0]) if pid else 0
        self.snapshot_xmin = int(pid[1]) if pid else None
        return int(row[0]) if row else 0

    def rows(self, offset: int) -> Generator[tuple[Any, OutboxEvent], None, None]:
        """(raw id, event) from the ``offset``-th pending row on, through a server-side cursor."""
        assert self._conn is not None, "rows() before open()"
        self._cursors += 1
        try:
            with self._conn.cursor(name=f"cdc_relay_backfill_{self._cursors}") as cursor:
                cursor.itersize = FETCH_SIZE
                cursor.execute(self._select, (offset,))
                for row in cursor:
                    yield row[6], self._event(row)
        except psycopg.Error as exc:
            raise translate_error(exc, "reading pending rows for the backfill") from exc

    def _event(self, row: tuple[Any, ...]) -> OutboxEvent:
        event = OutboxEvent(row[0], row[1], row[2], row[3], row[4].encode(), row[5])
        return carry(event, row[7:], self._extra, self._trace)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _carried(outbox: OutboxConfig) -> sql.Composable:
    """``, col::text, …`` for the carried columns (nothing when there are none)."""
    columns = (*outbox.extra_columns, *outbox.trace_columns)
    return sql.SQL("").join(
        sql.SQL(", {}::text").format(sql.Identifier(validate_identifier(c, "carried column")))
        for c in columns)

"""Incremental snapshots' chunk reader: capture/incremental.py's ChunkSource on PostgreSQL.

``ChunkReader.read`` runs one chunk's transaction on the edge's connection (autocommit
between chunks)::

    BEGIN ISOLATION LEVEL REPEATABLE READ
    SELECT pg_current_snapshot()            -- the snapshot, handed to ``safe``
    SELECT cols FROM t WHERE (k) > (last) AND (k) <= (upto) ORDER BY k LIMIT size
    SELECT txid_current(), pg_logical_emit_message(true, 'cdc-relay-snapshot', window)
    COMMIT

The high watermark is a *transactional* message: it reaches the slot at the chunk
transaction's commit, after every transaction the SELECT saw, and the commit flushes it
(a non-transactional message may wait unflushed on an idle server). Values are the types'
text output under the session settings of the initial snapshot (wal/backfill/tables.py),
as pgoutput sends them, so the capture codecs read a chunk's row as they read the
stream's. The table's shape is read in the chunk's transaction (its catalog of that
moment), its codec kept while the shape stays the same.

Decoding on a standby (``marker``, the primary's connection): the chunk is read on the
standby in the same REPEATABLE READ transaction, and the high watermark is written on the
primary, in a transaction of its own (autocommit), after the chunk's snapshot was taken.
It is still correct: every transaction the standby's snapshot sees was replayed there, so
its commit precedes, in the WAL, the watermark the primary writes later (no row reflects
a change after the watermark); the stream reaches no further than the standby has
replayed, so the changes already streamed were replayed before the snapshot was taken
and are visible to it (``safe`` checks this as on the primary). ``txid_current()`` is the
watermark transaction's id, as on the primary the chunk transaction's.

``EdgeConnection`` is the one autocommit connection the reader and the progress table
share, opened when first needed and again after it was lost (a lost connection is
``SourceLost``: the session reconnects and the snapshot resumes from its progress).

Must not: decide which chunk comes next or whether a snapshot is safe
(capture/incremental.py), or touch the slot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq, sql

from cdc_relay.capture.chunks import Chunk, Key, TableGone, XidSnapshot
from cdc_relay.capture.envelope import TableCodec
from cdc_relay.capture.modes import TypeModes
from cdc_relay.capture.shape import TableShape
from cdc_relay.capture.types import DEFAULT_MODES
from cdc_relay.errors import ServiceUnavailable, SourceLost
from cdc_relay.pg.catalog import lacks_select, table_shape
from cdc_relay.pg.db import connect, translate_error
from cdc_relay.wal.backfill.tables import TEXT_SESSION

MARK_PREFIX = "cdc-relay-snapshot"  # capture/decoder.py reads it back (MARK_PREFIX there)


class EdgeConnection:
    """The shared autocommit connection (see the module docstring); call it for the
    connection."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None

    def __call__(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = connect(self._dsn, autocommit=True,
                                     application_name="cdc-relay incremental snapshot")
            except ServiceUnavailable as exc:  # refused access, bad settings: raised as they are
                raise SourceLost(f"incremental snapshot: {exc}") from exc
            self.run(TEXT_SESSION)
        return self._conn

    def run(self, query: bytes, params: list[bytes | None] | None = None) -> pq.abc.PGresult:
        conn = self()
        result = (conn.pgconn.exec_(query) if params is None
                  else conn.pgconn.exec_params(query, params, result_format=0))
        if result.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
            message = (result.error_message or b"").decode(errors="replace").strip()
            if conn.pgconn.status != pq.ConnStatus.OK:
                conn.close()
                raise SourceLost(f"lost the connection reading an incremental snapshot: {message}")
            conn.pgconn.exec_(b"ROLLBACK")
            if result.error_field(pq.DiagnosticField.SQLSTATE) == b"40001":
                # On a standby, a query cancelled by a conflict with recovery: the session
                # resumes and the chunk is read again (docs/table-cdc.md, on a standby).
                raise SourceLost(f"incremental snapshot: {message}")
            raise translate_error(psycopg.Error(message), "reading an incremental snapshot's chunk")
        return result

    def rollback(self) -> None:
        """End an open transaction, if the connection is still there."""
        conn = self._conn
        if conn is not None and not conn.closed and \
                conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            conn.pgconn.exec_(b"ROLLBACK")

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class ChunkReader:
    """capture/incremental.py's ChunkSource (see the module docstring)."""

    def __init__(self, connection: EdgeConnection, *, prefix: str, schemas: bool,
                 marker: EdgeConnection | None = None,
                 placeholder: str, modes: TypeModes = DEFAULT_MODES,
                 names: tuple[str, str] = ("none", "none"),
                 clock_us: Callable[[], int] = lambda: time.time_ns() // 1000) -> None:
        self._connection = connection
        self._marker = marker  # the primary's, decoding on a standby (the module docstring)
        self._codec_args = (prefix, schemas, placeholder)
        self._modes, self._names = modes, names  # the relay's: an r row as its streamed rows
        self._clock_us = clock_us
        self._codecs: dict[TableShape, TableCodec] = {}

    def problem(self, schema: str, table: str) -> str | None:
        conn = self._connection()
        shape = table_shape(conn, schema, table)
        if shape is None:
            return "the table does not exist"
        if not shape.key:
            return ("the table has no primary key (an incremental snapshot reads it in key "
                    "order, as Debezium's: add a primary key)")
        if lacks_select(conn, schema, table):
            return f"the role may not SELECT it (GRANT SELECT ON {shape.qualified} TO <the relay's role>)"
        return None

    def upper_bound(self, schema: str, table: str) -> Key | None:
        shape = table_shape(self._connection(), schema, table)
        if shape is None or not shape.key:
            return None
        keys = _names(shape.key)
        query = sql.SQL("SELECT {} FROM {} ORDER BY {} LIMIT 1").format(
            keys, sql.Identifier(schema, table),
            sql.SQL(", ").join(sql.SQL("{} DESC").format(sql.Identifier(k)) for k in shape.key))
        result = self._connection.run(self._bytes(query), [])
        if result.ntuples == 0:
            return None
        return tuple(_text(result.get_value(0, j)) for j in range(result.nfields))

    def read(self, schema: str, table: str, after: Key | None, upto: Key, size: int,
             window: str, safe: Callable[[XidSnapshot], bool]) -> Chunk | None:
        edge = self._connection
        edge.run(b"BEGIN ISOLATION LEVEL REPEATABLE READ")
        try:
            snapshot = XidSnapshot.parse(_text(edge.run(
                b"SELECT pg_current_snapshot()::text").get_value(0, 0)) or "0:0:")
            if not safe(snapshot):
                edge.run(b"ROLLBACK")
                return None
            shape = table_shape(edge(), schema, table)
            if shape is None or not shape.key:
                raise TableGone("the table was dropped" if shape is None
                                else "the table lost its primary key")
            codec = self._codec(shape)
            result = edge.run(self._select(shape, after, size), [
                *(None if v is None else v.encode() for v in after or ()),
                *(None if v is None else v.encode() for v in upto)])
            raw = [[result.get_value(i, j) for j in range(result.nfields)]
                   for i in range(result.ntuples)]
            # On a standby the watermark is the primary's own transaction, written after
            # the chunk's snapshot was taken (the module docstring).
            marked = (self._marker or edge).run(
                b"SELECT txid_current(), pg_logical_emit_message(true, '"
                + MARK_PREFIX.encode() + b"', $1)", [window.encode()])
            xid = int(_text(marked.get_value(0, 0)) or 0) & 0xFFFFFFFF
            edge.run(b"COMMIT")
        except BaseException:
            edge.rollback()
            raise
        index = {c.name: i for i, c in enumerate(shape.columns)}
        last = None if not raw else tuple(_text(raw[-1][index[k]]) for k in shape.key)
        rows: list[list[bytes | object | None]] = [list(values) for values in raw]
        return Chunk(codec, rows, last, self._clock_us(), xid, window,
                     more=len(rows) == size and last != upto)

    def _codec(self, shape: TableShape) -> TableCodec:
        codec = self._codecs.get(shape)
        if codec is None:
            codec = TableCodec(shape, tuple(c.name for c in shape.columns), *self._codec_args,
                               modes=self._modes, names=self._names)
            self._codecs = {shape: codec}  # one table at a time
        return codec

    def _select(self, shape: TableShape, after: Key | None, size: int) -> bytes:
        keys = _names(shape.key)
        width = len(shape.key)
        params = iter(range(1, 2 * width + 1))

        def row() -> sql.Composable:
            return sql.SQL("({})").format(sql.SQL(", ").join(
                sql.SQL("$" + str(next(params))) for _ in range(width)))

        lower = sql.SQL("({}) > {} AND ").format(keys, row()) if after is not None else sql.SQL("")
        if after is None:
            params = iter(range(1, width + 1))
        query = sql.SQL("SELECT {} FROM {} WHERE {}({}) <= {} ORDER BY {} LIMIT {}").format(
            _names(tuple(c.name for c in shape.columns)), sql.Identifier(shape.schema, shape.name),
            lower, keys, row(), keys, sql.Literal(size))
        return self._bytes(query)

    def _bytes(self, query: sql.Composable) -> bytes:
        return query.as_bytes(self._connection())


def _names(names: tuple[str, ...]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()

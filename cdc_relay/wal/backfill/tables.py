"""``run --capture --snapshot initial``: the captured tables' rows as Debezium's ``op: r`` events.

``TableSnapshotReader`` reads every row of the captured tables in the slot's exported
snapshot (or, when an unfinished snapshot is redone, a fresh one) - the same point the
slot streams from, so a row is either in the snapshot or in the stream, never neither -
in one ``REPEATABLE READ`` transaction, table after table in the order given, each in
its physical order (``SELECT cols FROM table``, as Debezium reads it; with
``synchronize_seqscans`` off, so reading a table again after a producer was replaced
gives the same order). Values are the types' text output, as pgoutput sends them (the
session pins the walsender's TimeZone, DateStyle and extra_float_digits), so the capture
room's codecs read them as they read the stream's. Each row is a CapturedRow with op
``r``, the consistent point as its LSN, the snapshot transaction's id (``txid_current``,
as Debezium's; on a standby, which assigns none, its snapshot's ``xmax``) and
``source.snapshot`` as Debezium marks it: ``first`` (the very first row), ``last`` (the
very last), ``first_in_data_collection`` / ``last_in_data_collection`` (a table's first /
last), ``true`` otherwise.

``publish_tables`` runs the backfill's publishing loop (loop.py) over them: the same
engine, dead letters and producer replacement, nothing marked (tables have no
``processed_at``); each ``r`` event made is counted per table (``counts``: the relay's
``cdc_relay_captured_events_total{op="r"}``).

Must not: decide whether a snapshot is due (cutover.py), touch the slot, or write.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import pq

from cdc_relay.capture.envelope import TableCodec
from cdc_relay.capture.route import CaptureRouter
from cdc_relay.config import FlowConfig
from cdc_relay.delivery.engine import Engine
from cdc_relay.errors import DatabaseError
from cdc_relay.model import CapturedRow, Lsn, Message
from cdc_relay.pg.db import connect, translate_error
from cdc_relay.routing import Router
from cdc_relay.sink.base import DeliveryError, ErrorKind, SinkFactory
from cdc_relay.wal.backfill.loop import Backfill, BackfillStats, BackfillTimings
from cdc_relay.wal.backfill.snapshot import SlotSnapshot

FETCH_SIZE = 1000
TEXT_SESSION = (b"SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET extra_float_digits = 3;"
                b" SET IntervalStyle = 'postgres'; SET bytea_output = 'hex';"
                b" SET synchronize_seqscans = off")


def _ident(name: str) -> bytes:
    return ('"' + name.replace('"', '""') + '"').encode()


def marker(first_table: bool, last_table: bool, first_row: bool, last_row: bool) -> str:
    """``source.snapshot`` of a row, in Debezium's precedence."""
    if last_row and last_table:
        return "last"
    if first_row and first_table:
        return "first"
    if last_row:
        return "last_in_data_collection"
    return "first_in_data_collection" if first_row else "true"


# A standby (decoding there, docs/table-cdc.md) assigns no transaction id and writes no
# WAL: its snapshot's first unassigned xid (what a txid_current() would have been at
# best) and its replay position stand in.
_XID = (b"SELECT CASE WHEN pg_is_in_recovery() THEN"
        b" pg_snapshot_xmax(pg_current_snapshot())::text::bigint ELSE txid_current() END")
_POINT = (b"SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
          b" ELSE pg_current_wal_lsn() END")


class TableSnapshotReader:
    """The reading transaction (see the module docstring); ``rows`` is loop.py's RowSource."""

    def __init__(self, dsn: str, codecs: Sequence[TableCodec], snapshot_name: str | None,
                 consistent_point: Lsn | None,
                 clock_us: Callable[[], int] = lambda: time.time_ns() // 1000) -> None:
        """``consistent_point`` None (a fresh snapshot): the server's WAL position then."""
        self._dsn = dsn
        self._codecs = list(codecs)
        self._snapshot_name = snapshot_name
        self._point = consistent_point or Lsn(0)
        self._fresh = consistent_point is None
        self._clock_us = clock_us
        self._conn: psycopg.Connection[Any] | None = None
        self.pid = 0
        self.xid: int | None = None
        self.total = 0  # rows to read (``open``'s answer)

    def open(self) -> int:
        """Begin the transaction (importing the snapshot); the number of rows to read."""
        self._conn = conn = connect(self._dsn, autocommit=True,
                                    application_name="cdc-relay table snapshot")
        self.pid = conn.info.backend_pid
        self._exec(TEXT_SESSION)
        self._exec(b"BEGIN ISOLATION LEVEL REPEATABLE READ")
        if self._snapshot_name is not None:
            self._exec(b"SET TRANSACTION SNAPSHOT '" + self._snapshot_name.encode() + b"'")
        self.xid = int(self._value(_XID) or 0)
        if self._fresh:
            self._point = Lsn.parse((self._value(_POINT) or b"0/0").decode())
        return sum(int(self._value(b"SELECT count(*) FROM " + self._table(codec)) or 0)
                   for codec in self._codecs)

    def rows(self, offset: int) -> Generator[tuple[None, CapturedRow], None, None]:
        """Every row from the ``offset``-th on, in a fixed order."""
        ordinal = 0
        last_table = len(self._codecs) - 1
        for index, codec in enumerate(self._codecs):
            for first_row, last_row, values in self._table_rows(codec):
                if ordinal >= offset:
                    row = CapturedRow(codec, "r", values, None, self._point, self.xid,
                                      self._clock_us(), None,
                                      marker(index == 0, index == last_table, first_row, last_row))
                    yield None, row
                ordinal += 1

    def _table_rows(self, codec: TableCodec) -> Generator[tuple[bool, bool, list[Any]], None, None]:
        columns = b", ".join(_ident(c.name) for c in codec.shape.columns)
        self._exec(b"DECLARE cdc_relay_rows NO SCROLL CURSOR FOR SELECT " + columns + b" FROM "
                   + self._table(codec))
        try:
            previous: list[Any] | None = None
            first = True
            while True:
                result = self._exec(b"FETCH " + str(FETCH_SIZE).encode() + b" FROM cdc_relay_rows")
                if result.ntuples == 0:
                    break
                for i in range(result.ntuples):
                    values = [result.get_value(i, j) for j in range(result.nfields)]
                    if previous is not None:
                        yield first, False, previous
                        first = False
                    previous = values
            if previous is not None:
                yield first, True, previous
        finally:
            if self._conn is not None and not self._conn.closed:
                self._exec(b"CLOSE cdc_relay_rows")

    @staticmethod
    def _table(codec: TableCodec) -> bytes:
        return _ident(codec.shape.schema) + b"." + _ident(codec.shape.name)

    def _value(self, query: bytes) -> bytes | None:
        result = self._exec(query)
        return result.get_value(0, 0)

    def _exec(self, query: bytes) -> pq.abc.PGresult:
        assert self._conn is not None
        result = self._conn.pgconn.exec_(query)
        if result.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
            message = (result.error_message or b"").decode(errors="replace").strip()
            raise translate_error(psycopg.Error(message), "reading the captured tables' snapshot")
        return result

    def close(self) -> None:
        """End the transaction (nothing was written) and the connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


@dataclass(frozen=True, slots=True)
class TableSnapshot:
    """What the cut-over needs to snapshot the captured tables (app/run.py builds it):
    their codecs in order (the catalog's shapes), the router of captured rows, the
    backfill's publishing parts. (The tables are in the publication before the slot is
    made: app/run.py sees to that first.)"""

    codecs: Sequence[TableCodec]
    capture: CaptureRouter
    router: Router
    sink_factory: SinkFactory
    flow: FlowConfig
    stats: BackfillStats
    with_outbox: bool = True  # False (--no-outbox): no outbox rows to backfill first
    timings: BackfillTimings = field(default_factory=BackfillTimings)
    # ``r`` events made, by (table, "r"): the relay's per-table counts (RelayStats.captured)
    counts: dict[tuple[str, str], int] = field(default_factory=dict)

    def open(self, snapshot: SlotSnapshot | None, dsn: str) -> TableSnapshotReader:
        """The reader, its transaction begun (the export imported, when ``snapshot``)."""
        reader = TableSnapshotReader(dsn, self.codecs,
                                     None if snapshot is None else snapshot.snapshot_name,
                                     None if snapshot is None else snapshot.consistent_point)
        try:
            reader.total = reader.open()
        except BaseException:
            reader.close()
            raise
        return reader

    def publish(self, reader: TableSnapshotReader, stop: threading.Event) -> bool:
        """Every row as an ``op: r`` event; True once all are acknowledged."""
        self.stats.rows_total, self.stats.rows_done = reader.total, 0
        return publish_tables(reader, capture=self.capture, router=self.router,
                              sink_factory=self.sink_factory, flow=self.flow, stats=self.stats,
                              stop=stop, timings=self.timings, counts=self.counts)


class _NoProgress:
    """The tables' snapshot keeps no progress of its own: the backfill's record says done."""

    def progress(self, rows_done: int) -> None:
        pass

    def snapshot_age(self, reader_pid: int) -> tuple[float, int] | None:
        return None


class _NoMarks:
    def __call__(self, raw_ids: list[Any]) -> None:
        pass

    def drain(self) -> None:
        pass


def _send(capture: CaptureRouter, counts: dict[tuple[str, str], int]
          ) -> Callable[[Engine, int, Any], None]:
    def send(engine: Engine, token: int, row: CapturedRow) -> None:
        routed = capture.route(row)
        [message] = routed.messages  # a snapshot row is one event
        engine.inflight[token] = message
        engine.inflight_bytes += len(message.payload)
        out: Message = message
        if routed.problem is not None:
            out = engine.dead_letter(token, DeliveryError(ErrorKind.PERMANENT, routed.problem))
        else:  # counted as a streamed change's event is: made, handed to the producer
            name = (message.aggregate_id, "r")
            counts[name] = counts.get(name, 0) + 1
        engine.produce(token, out)
    return send


def publish_tables(reader: TableSnapshotReader, *, capture: CaptureRouter, router: Router,
                   sink_factory: SinkFactory, flow: FlowConfig, stats: BackfillStats,
                   stop: threading.Event, timings: BackfillTimings,
                   counts: dict[tuple[str, str], int] | None = None) -> bool:
    """Publish every row of the open ``reader``; True once all are acknowledged. ``counts``:
    the ``r`` events made, by (table, "r")."""
    try:
        return Backfill(reader=reader, store=_NoProgress(), mark=_NoMarks(), router=router,
                        sink_factory=sink_factory, flow=flow, timings=timings, stats=stats,
                        send=_send(capture, {} if counts is None else counts)).run(stop)
    except psycopg.Error as exc:
        raise DatabaseError(f"reading the captured tables' snapshot: {exc}") from exc

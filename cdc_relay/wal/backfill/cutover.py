"""``run --snapshot initial``: decide whether a backfill is needed, run it, then let streaming start.

The decision, under the slot's backfill lock (one relay at a time; the others stand by):

* no slot → create it with an exported snapshot (snapshot.py), publish the rows pending
  in that snapshot (loop.py), then stream from the slot's consistent point: no gap,
  no overlap;
* the slot exists with a finished backfill record → nothing to do (a restart);
* the slot exists with an unfinished record (a crash or stop mid-backfill) → redo the
  backfill in a fresh snapshot: the exported one died with the process. Rows the first
  attempt marked processed are skipped; what may be published twice is documented in
  docs/migration.md;
* the slot exists with no record → refuse: its snapshot was never taken, and starting to
  stream would leave the pending rows behind.

Before any of that the table must have the bookkeeping columns the backfill reads and
writes (``processed_at``, ``dead_lettered_at``): otherwise a ConfigError, nothing touched.

Decoding on a standby (``repl.primary_dsn``, PostgreSQL 16+): the slot, its exported
snapshot and the reads are on the standby (``repl.dsn``); the lock, the state, the
publication, the record and the rows' marks on the primary (``writer_dsn``).

Must not: stream, publish (loop.py does), or read the environment.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import psycopg

from cdc_relay.config import FlowConfig, OutboxConfig, ReplicationConfig
from cdc_relay.errors import ConfigError
from cdc_relay.pg.db import connect, describe_dsn, translate_error, validated_table
from cdc_relay.pg.slots import slot_info
from cdc_relay.routing import Router
from cdc_relay.sink.base import SinkFactory
from cdc_relay.wal.backfill.loop import Backfill, BackfillStats, BackfillTimings
from cdc_relay.wal.backfill.rows import RowMarker, SnapshotReader
from cdc_relay.wal.backfill.snapshot import (
    ExportedSlot,
    SlotSnapshot,
    create_slot_exporting_snapshot,
)
from cdc_relay.wal.backfill.state import StateStore, read_record
from cdc_relay.wal.backfill.tables import TableSnapshot
from cdc_relay.wal.slot import continuity
from cdc_relay.wal.slot.lifecycle import standby_snapshots
from cdc_relay.wal.slot.publication import ensure_publication

log = logging.getLogger("cdc_relay.backfill")

SNAPSHOT_MODES = ("initial", "never")
NEEDED_COLUMNS = ("processed_at", "dead_lettered_at")
LOCK_RETRY = 2.0


def check_backfill_table(conn: psycopg.Connection[Any], dsn: str, outbox: OutboxConfig) -> None:
    """ConfigError unless the table exists and has the columns the backfill uses."""
    table = validated_table(outbox.table)
    try:
        row = conn.execute(
            "SELECT ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid"
            " AND a.attnum > 0 AND NOT a.attisdropped) FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (table.schema, table.name)).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, f"looking up {table}") from exc
    if row is None:
        raise ConfigError(f"outbox table {table} does not exist in {describe_dsn(dsn)}: run "
                          "`cdc-relay init --no-slot` first, or pass the right --table / --dsn")
    missing = [c for c in NEEDED_COLUMNS if c not in row[0]]
    if missing:
        raise ConfigError(
            f"--snapshot initial needs the columns {', '.join(NEEDED_COLUMNS)} on {table} "
            f"(it publishes rows where both are NULL and sets processed_at), but "
            f"{', '.join(missing)} is missing: run `cdc-relay init --no-slot --table {table}` "
            "(with the same --columns) to add them, or use --snapshot never")


def precheck(repl: ReplicationConfig, outbox: OutboxConfig, *, outbox_rows: bool = True) -> None:
    """The refusals, before anything is touched or logged: columns (``outbox_rows`` False:
    ``--no-outbox``, no table to check), a slot with no record.

    The decision itself is taken again under the lock (``backfill_before_streaming``).
    """
    with connect(writer_dsn(repl), autocommit=True,
                 application_name="cdc-relay backfill") as conn, \
            slot_server(repl, "cdc-relay backfill") as slot_conn:
        if outbox_rows:
            check_backfill_table(conn, writer_dsn(repl), outbox)
        if slot_info(slot_conn or conn, repl.slot) is not None:
            record = read_record(conn, outbox.table, repl.slot)
            if record is None or record.table != str(outbox.table):
                raise _refusal(repl.slot, str(outbox.table))


def _refusal(slot: str, table: str) -> ConfigError:
    return ConfigError(
        f"replication slot {slot!r} already exists, and --snapshot initial takes its snapshot "
        f"only when the relay creates the slot: rows pending in {table} would not be "
        f"published. Fix: stop the relays on it, `cdc-relay slot drop --slot {slot}`, and run "
        "--snapshot initial again (docs/migration.md); or pass --snapshot never")


def backfill_before_streaming(*, repl: ReplicationConfig, outbox: OutboxConfig, router: Router,
                              sink_factory: SinkFactory, flow: FlowConfig, stats: BackfillStats,
                              stop: threading.Event,
                              timings: BackfillTimings | None = None,
                              tables: TableSnapshot | None = None) -> bool:
    """Run the backfill if one is due (see the module docstring).

    ``tables`` (``--capture``): the captured tables' rows are published as ``op: r`` events
    in the same snapshot, after the outbox's rows (none with ``--no-outbox``:
    ``tables.with_outbox`` False) and before the record says done (the tables must be in
    the publication already).
    True when streaming may start; False when ``stop`` was set first (the backfill stays
    unfinished and the next start redoes it).
    """
    timings = timings or BackfillTimings()
    outbox_rows = tables is None or tables.with_outbox
    with connect(writer_dsn(repl), autocommit=True,
                 application_name="cdc-relay backfill") as conn, \
            slot_server(repl, "cdc-relay backfill") as slot_conn:
        if outbox_rows:
            check_backfill_table(conn, writer_dsn(repl), outbox)
        store = StateStore(conn, outbox.table, repl.slot,
                           reader_elsewhere=repl.primary_dsn is not None)
        if not wait_for_lock(store, repl.slot, stop):
            return False
        slot = slot_info(slot_conn or conn, repl.slot)
        record = store.read()
        if slot is not None:
            if record is None or record.table != str(outbox.table):
                raise _refusal(repl.slot, str(outbox.table))
            if slot.plugin != repl.plugin:
                raise ConfigError(f"replication slot {repl.slot!r} uses plugin {slot.plugin!r}, "
                                  f"not {repl.plugin!r}: pass --plugin {slot.plugin}")
            if record.finished:
                log.info("backfill of slot %s finished at %s (%d rows); streaming", repl.slot,
                         record.finished_at, record.rows_done)
                stats.finished = True
                stats.rows_total = stats.rows_done = record.rows_done
                return True
            log.warning(
                "the backfill of slot %s did not finish (state %s, %d of %s rows, attempt %d): "
                "redoing it in a fresh snapshot; rows committed since the slot's consistent "
                "point %s and rows published but not yet marked may be published twice",
                repl.slot, record.state, record.rows_done, record.rows_total, record.attempt,
                record.consistent_point)
            return run_backfill(store, None, repl=repl, outbox=outbox, router=router,
                             sink_factory=sink_factory, flow=flow, stats=stats, stop=stop,
                             timings=timings, tables=tables, marks_dsn=writer_dsn(repl))
        loss = continuity.loss_reason(None, continuity.read_record(
            conn, outbox.table.schema, repl.slot), continuity.identity(conn)[0])
        if loss is not None:  # the slot existed: a backfill would not cover what it lost
            raise continuity.slot_lost(loss, continuity.read_record(
                conn, outbox.table.schema, repl.slot))
        if repl.plugin == "pgoutput" and outbox_rows:
            ensure_publication(conn, outbox.table, repl.publication)  # before the slot exists
        store.begin()
        horizon = continuity.oldest_running(conn)
        exported = create_slot_exporting_snapshot_at(repl)
        continuity.record_creation(
            conn, schema=outbox.table.schema, slot=repl.slot, plugin=repl.plugin,
            table=str(outbox.table), created_lsn=exported.snapshot.consistent_point,
            failover=exported.snapshot.failover, horizon_xid=horizon)
        return run_backfill(store, exported.snapshot, exported_close=exported.close, repl=repl,
                         outbox=outbox, router=router, sink_factory=sink_factory, flow=flow,
                         stats=stats, stop=stop, timings=timings, tables=tables,
                         marks_dsn=writer_dsn(repl))


def writer_dsn(repl: ReplicationConfig) -> str:
    """Where the backfill and the recovery write: the primary when decoding on a standby."""
    return repl.primary_dsn or repl.dsn


@contextmanager
def slot_server(repl: ReplicationConfig, name: str
                ) -> Iterator[psycopg.Connection[Any] | None]:
    """A connection to the standby that holds the slot (decoding on a standby), else None:
    the slot is on the writer's server."""
    if repl.primary_dsn is None:
        yield None
        return
    with connect(repl.dsn, autocommit=True, application_name=name) as conn:
        yield conn


def create_slot_exporting_snapshot_at(repl: ReplicationConfig) -> ExportedSlot:
    """The slot and its exported snapshot on ``repl.dsn``; on a standby (PostgreSQL 16+
    exports there) never a failover slot, which PostgreSQL refuses there, and sped up by
    ``pg_log_standby_snapshot()`` on the primary (wal/slot/lifecycle.py)."""
    if repl.primary_dsn is None:
        return create_slot_exporting_snapshot(repl)
    with standby_snapshots(repl.primary_dsn, repl.slot):
        return create_slot_exporting_snapshot(replace(repl, failover_slot=False))


def wait_for_lock(store: StateStore, slot: str, stop: threading.Event, *,
                  doing: str = "backfilling") -> bool:
    """Take the slot's backfill lock, standing by while another relay holds it (that relay is
    ``doing`` the slot); False when ``stop`` was set first. The recovery takes it too."""
    told = False
    while not store.try_lock():
        if not told:
            log.info("another relay is %s slot %s; standing by", doing, slot)
            told = True
        if stop.wait(LOCK_RETRY):
            return False
    return True


def run_backfill(store: StateStore, snapshot: SlotSnapshot | None, *, repl: ReplicationConfig,
                 outbox: OutboxConfig, router: Router, sink_factory: SinkFactory,
                 flow: FlowConfig, stats: BackfillStats, stop: threading.Event,
                 timings: BackfillTimings, exported_close: Any = None,
                 horizon_xid: int | None = None, tables: TableSnapshot | None = None,
                 marks_dsn: str | None = None) -> bool:
    """Publish the pending rows of ``snapshot`` (a fresh snapshot when None) and mark them;
    with ``horizon_xid``, only those of transactions at or after it (a recovery); then the
    captured ``tables``' rows, read in the same snapshot (imported before the export ends).
    ``marks_dsn``: where the marks are written when the rows are read on a standby
    (``repl.dsn``): its primary."""
    reader = SnapshotReader(repl.dsn, outbox, snapshot.snapshot_name if snapshot else None,
                            horizon_xid=horizon_xid)
    outbox_rows = tables is None or tables.with_outbox
    table_reader = None
    try:
        try:
            if tables is not None:
                table_reader = tables.open(snapshot, repl.dsn)
            total = reader.open() if outbox_rows else 0
        finally:
            if exported_close is not None:
                exported_close()  # imported (or failed): the export is no longer needed
        store.started(snapshot.consistent_point if snapshot else None, total,
                      redo=snapshot is None)
        stats.rows_total = total
        stats.snapshot_xmin = reader.snapshot_xmin
        where = f"the slot's snapshot at {snapshot.consistent_point}" if snapshot else \
            "a fresh snapshot"
        if outbox_rows:
            log.info("backfill: %d pending rows of %s in %s; streaming starts once all are "
                     "acknowledged", total, outbox.table, where,
                     extra={"rows_total": total, "slot": repl.slot})
        marker = RowMarker(marks_dsn or repl.dsn, outbox) if outbox_rows else None
        try:
            done = marker is None or Backfill(
                reader=reader, store=store, mark=marker, router=router, sink_factory=sink_factory,
                flow=flow, timings=timings, stats=stats).run(stop)
        finally:
            if marker is not None:
                marker.close()
        outbox_done = stats.rows_done
        if done and table_reader is not None and tables is not None:
            reader.close()  # the outbox's snapshot is no longer needed
            done = tables.publish(table_reader, stop)
            stats.rows_done = outbox_done  # the record counts the outbox's rows
    finally:
        reader.close()
        if table_reader is not None:
            table_reader.close()
    if not done:
        log.warning("backfill stopped at %d of %d rows; the next start with --snapshot initial "
                    "redoes it", stats.rows_done, stats.rows_total)
        return False
    store.finished(stats.rows_done)
    log.info("backfill finished: %d rows published and marked processed (%d dead-lettered)",
             stats.rows_done, stats.dead_lettered, extra={"rows_done": stats.rows_done})
    return True

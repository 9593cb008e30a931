"""Recovering from a slot loss with no event lost (docs/design.md, continuity).

Run by ``cdc-relay run --on-slot-loss recover``: the command a slot loss's exit line
names, and the setting that lets a supervisor's restart recover with no operator.
Under the slot's backfill lock (one relay at a time; the others stand by):

1. the loss is confirmed again (another relay may have recovered meanwhile: then there
   is nothing to do); an invalidated slot is dropped, since its name is wanted again;
2. a new slot is created with an exported snapshot (a failover slot on 17+) and recorded,
   marked ``recovering``, with the old horizon kept;
3. every retained outbox row of a transaction at or after the horizon (wal/slot/continuity.py)
   that the snapshot sees is published - at least once: rows already relayed before the
   loss are among them, counted in the log, and consumers deduplicate them by event id -
   and marked processed, as a backfill does (wal/backfill/loop.py);
4. the record gets the snapshot's xmin as its new horizon, and streaming starts from the
   slot's consistent point: the snapshot sees exactly what committed before it, the slot
   streams exactly what committed after it - no gap.

A recovery stopped half-way (a crash, a stop) is redone by the next start whatever
``--on-slot-loss`` says: the record still says ``recovering``. Rows that may have been
unrelayed but are no longer in the table (cleanup, insert-then-delete) cannot be
republished: the relay says so loudly, with the window it cannot vouch for.

Decoding on a standby (``repl.primary_dsn``): the slot and the snapshot's reads are on the
standby (``repl.dsn``; PostgreSQL 16+ exports a snapshot there), every write - the lock,
the state, the record, the publication, the rows' marks - on the primary.

Must not: stream, or decide about a loss anywhere but here and in wal/slot/continuity.py.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from cdc_relay.config import FlowConfig, OutboxConfig, ReplicationConfig
from cdc_relay.pg.db import connect, translate_error, validated_table
from cdc_relay.pg.slots import slot_info
from cdc_relay.routing import Router
from cdc_relay.sink.base import SinkFactory
from cdc_relay.wal.backfill.cutover import (
    check_backfill_table,
    create_slot_exporting_snapshot_at,
    run_backfill,
    slot_server,
    wait_for_lock,
    writer_dsn,
)
from cdc_relay.wal.backfill.loop import BackfillStats, BackfillTimings
from cdc_relay.wal.backfill.state import StateStore
from cdc_relay.wal.slot import continuity
from cdc_relay.wal.slot.publication import ensure_publication
from cdc_relay.wal.slot.setup import PLUGINS

log = logging.getLogger("cdc_relay.recovery")


@dataclass(frozen=True, slots=True)
class Retention:
    """What the outbox table still holds, against the time a recovery must cover."""

    oldest: datetime | None  # the oldest retained row's created_at; None: the table is empty
    rows: int
    deletes: bool  # rows were deleted from the table (as far as the server's statistics know)


def unvouched_window(covered_at: datetime | None, retention: Retention,
                     now: datetime) -> tuple[datetime, datetime] | None:
    """The window whose deleted rows nobody can republish, or None when retention covers it.

    Rows are deleted oldest first (cleanup) or right after the insert: if nothing was
    deleted, or a row created before the last covered moment is still there, nothing after
    that moment was deleted by age; otherwise rows of [covered_at, oldest retained row) may
    have been (pure). The server's delete count restarts with the server (a promoted
    standby's starts at zero), so the docs ask for retention longer than any outage.
    """
    if covered_at is None or not retention.deletes:
        return None
    if retention.oldest is not None and retention.oldest <= covered_at:
        return None
    return covered_at, retention.oldest or now


def recover(*, repl: ReplicationConfig, outbox: OutboxConfig, router: Router,
            sink_factory: SinkFactory, flow: FlowConfig, stats: BackfillStats,
            stop: threading.Event, timings: BackfillTimings | None = None) -> bool:
    """Recover the slot if it is lost or a recovery is unfinished (see the module docstring).

    True when streaming may start; False when ``stop`` was set first.
    """
    timings = timings or BackfillTimings()
    schema = validated_table(outbox.table).schema
    writes = writer_dsn(repl)  # decoding on a standby: the primary
    with connect(writes, autocommit=True, application_name="cdc-relay recovery") as conn, \
            slot_server(repl, "cdc-relay recovery") as on_standby:
        slot_conn = on_standby or conn
        check_backfill_table(conn, writes, outbox)
        store = StateStore(conn, outbox.table, repl.slot,
                           reader_elsewhere=repl.primary_dsn is not None)
        if not wait_for_lock(store, repl.slot, stop, doing="recovering"):
            return False
        status = slot_info(slot_conn, repl.slot)
        record = continuity.read_record(conn, schema, repl.slot)
        reason = continuity.loss_reason(status, record, continuity.identity(conn)[0])
        horizon = record.horizon_xid if record is not None else None
        if repl.plugin_from_slot and record is not None and record.plugin in PLUGINS:
            repl = replace(repl, plugin=record.plugin)  # no --plugin: the lost slot's plugin
        if reason is None and not (record is not None and record.recovering):
            log.info("slot %s is in place: nothing to recover", repl.slot)
            return True
        if reason is not None:
            log.warning("recovering from a slot loss: %s", reason, extra={"slot": repl.slot})
            _warn_unvouched(conn, outbox, record)
            if status is not None:
                _drop(slot_conn, repl.slot)
            if repl.plugin == "pgoutput":
                ensure_publication(conn, outbox.table, repl.publication)
            store.begin()
            exported = create_slot_exporting_snapshot_at(repl)
            continuity.record_creation(
                conn, schema=schema, slot=repl.slot, plugin=repl.plugin, table=str(outbox.table),
                created_lsn=exported.snapshot.consistent_point,
                failover=exported.snapshot.failover, horizon_xid=horizon, recovering=True)
            snapshot, close = exported.snapshot, exported.close
        else:
            log.warning("the recovery of slot %s did not finish: redoing it in a fresh snapshot "
                        "(rows committed since the slot was created may be published twice)",
                        repl.slot)
            snapshot, close = None, None
        done = run_backfill(store, snapshot, exported_close=close, repl=repl, outbox=outbox,
                            router=router, sink_factory=sink_factory, flow=flow, stats=stats,
                            stop=stop, timings=timings, horizon_xid=horizon,
                            marks_dsn=writes)
        if not done:
            return False
        store.finished(stats.rows_done)
        assert stats.snapshot_xmin is not None
        continuity.recovered(conn, schema, repl.slot, stats.snapshot_xmin)
    log.warning("recovered slot %s: %d retained rows that may have been unrelayed were "
                "republished at least once (%d dead-lettered); those relayed before the loss "
                "are duplicates, which consumers drop by event id; streaming from the new slot",
                repl.slot, stats.rows_done, stats.dead_lettered,
                extra={"slot": repl.slot, "republished": stats.rows_done})
    return True


def _drop(conn: psycopg.Connection[Any], slot: str) -> None:
    try:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    except psycopg.errors.UndefinedObject:
        return
    except psycopg.Error as exc:
        raise translate_error(exc, f"dropping the invalidated slot {slot!r}") from exc
    log.info("dropped the invalidated slot %s", slot)


def _warn_unvouched(conn: psycopg.Connection[Any], outbox: OutboxConfig,
                    record: continuity.SlotRecord | None) -> None:
    table = validated_table(outbox.table)
    created_at = sql.Identifier(outbox.columns.created_at)
    quoted = sql.Identifier(table.schema, table.name).as_string(conn)
    try:
        row = conn.execute(sql.SQL(
            "SELECT min({}), count(*), now(), (SELECT coalesce(sum(n_tup_del), 0) > 0"
            " FROM pg_stat_all_tables WHERE relid = %s::regclass OR relid IN (SELECT inhrelid"
            " FROM pg_inherits WHERE inhparent = %s::regclass)) FROM {}").format(
            created_at, sql.Identifier(table.schema, table.name)),
            (quoted, quoted)).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, f"reading {table}") from exc
    assert row is not None
    window = unvouched_window(record.covered_at if record else None,
                              Retention(row[0], int(row[1]), bool(row[3])), row[2])
    if record is None:
        log.error("no record of slot %s's history: every retained row is republished, and "
                  "events whose rows were deleted cannot be vouched for", outbox.table)
    elif window is not None:
        log.error(
            "CANNOT VOUCH for events committed between %s and %s: the relay had not confirmed "
            "them, and %s keeps no row that old (cleanup or insert-then-delete removed what "
            "was there). Check the consumers for gaps in that window; keep rows longer than "
            "the longest outage you must survive (docs/high-availability.md, retention)",
            f"{window[0]:%Y-%m-%d %H:%M:%S %Z}", f"{window[1]:%Y-%m-%d %H:%M:%S %Z}", table,
            extra={"unvouched_from": window[0].isoformat(), "unvouched_to": window[1].isoformat()})

"""``cdc-relay run``'s checks before streaming (the publication and slot made or checked,
the message columns resolved, ``--capture``'s tables prepared, decoding on a standby paired
with its primary), on one connection that the first stream then reads the slot's position
on. app/run.py calls ``startup_checks_retried``; this module starts nothing and imports the
PostgreSQL side only inside its functions (tests/unit/test_purity.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from cdc_relay.app.incremental import signal_table
from cdc_relay.app.wal_settings import WalSettings
from cdc_relay.config import ReplicationConfig, TableRef

if TYPE_CHECKING:
    import psycopg

    from cdc_relay.app.capture import CaptureSetup

log = logging.getLogger("cdc_relay")


@contextmanager
def writer_connection(repl: ReplicationConfig) -> Iterator[psycopg.Connection[Any] | None]:
    """An autocommit connection to ``--primary-dsn`` (decoding on a standby), else None."""
    if repl.primary_dsn is None:
        yield None
        return
    from cdc_relay.pg.db import connect

    with connect(repl.primary_dsn, autocommit=True) as conn:
        yield conn


def standby_pair(conn: psycopg.Connection[Any], repl: ReplicationConfig
                  ) -> psycopg.Connection[Any]:
    """Decoding on a standby: ``conn`` (``--dsn``) must be a standby of 16+, the primary
    writable; returns an open autocommit connection to the primary (the caller closes it)."""
    from cdc_relay.pg.db import connect
    from cdc_relay.pg.endpoint import require_standby, require_writable

    assert repl.primary_dsn is not None
    require_standby(conn, repl.dsn)
    writer = connect(repl.primary_dsn, autocommit=True)
    try:
        require_writable(writer, repl.primary_dsn, "--primary-dsn (the slot's continuity "
                         "record, heartbeats)", option="--primary-dsn")
    except BaseException:
        writer.close()
        raise
    return writer


def startup_checks_retried(settings: WalSettings, stop: threading.Event
                            ) -> Checked | None:
    """``startup_checks``, retried with backoff while PostgreSQL cannot be reached (as a
    lost connection is mid-run); what a retry cannot fix is raised at once. None: stopped."""
    from cdc_relay.startup import until_reachable

    return until_reachable(lambda: startup_checks(settings), stop,
                           maximum=settings.replication.reconnect_max)


Checked = tuple[WalSettings, bool, "psycopg.Connection[Any]", bool, "CaptureSetup | None"]


def startup_checks(settings: WalSettings) -> Checked:
    """The checks before streaming, on one connection: (settings to stream with, partitioned,
    that connection, still open: the first stream reads the slot's position on it, whether
    a recovery is unfinished, what ``--capture``'s checks found).

    --header / --partition-column must name real columns (a typo is one line, exit 2); the
    publication and the slot are created if missing (a lost one raises SlotLost); an
    unfinished backfill is a warning.
    """
    from cdc_relay.pg.db import connect
    from cdc_relay.pg.endpoint import require_writable
    from cdc_relay.pg.message_columns import resolve_message_columns
    from cdc_relay.wal.backfill.state import warn_if_unfinished
    from cdc_relay.wal.slot.continuity import read_record
    from cdc_relay.wal.slot.setup import ensure_replication, plugin_for_slot

    repl = settings.replication
    conn = connect(repl.dsn, autocommit=True)
    writer = None
    try:
        if repl.primary_dsn is None:
            # The slot's continuity record and horizon are written: a read-only node is the
            # wrong endpoint, said now (pg/endpoint.py).
            require_writable(conn, repl.dsn, "the relay (the slot's continuity record)",
                             standby_alternative=True)
        else:  # decoding on a standby: the slot here, every write on the primary
            writer = standby_pair(conn, repl)
        if repl.plugin_from_slot:
            plugin, note = plugin_for_slot(conn, repl.slot)
            if note:
                log.info("%s", note, extra={"slot": repl.slot, "plugin": plugin})
            repl = replace(repl, plugin=plugin, plugin_from_slot=False)
            settings = replace(settings, replication=repl)
        captured = None
        if settings.capture is not None:  # the publication first: pgoutput needs it at the slot's start
            from cdc_relay.app.capture import prepare_capture

            captured = prepare_capture(conn, settings.capture.tables, repl.publication,
                                       repl.plugin, truncate=settings.capture.truncate,
                                       signal=signal_table(settings.capture, settings.outbox.table),
                                       outbox=relayed_outbox(settings), writer=writer)
            for problem in captured.problems:
                log.warning("%s", problem)
        outbox = settings.outbox
        partitioned = False
        if settings.capture is None or settings.capture.outbox:
            outbox = resolve_message_columns(repl.dsn, outbox, settings.router, conn=conn)
            partitioned = ensure_replication(repl.dsn, outbox, slot=repl.slot, plugin=repl.plugin,
                                             publication=repl.publication, conn=conn,
                                             failover=repl.failover_slot, writer=writer,
                                             primary_dsn=repl.primary_dsn).partitioned
        else:
            from cdc_relay.wal.slot.setup import ensure_slot

            ensure_slot(conn, repl.slot, repl.plugin, outbox.table, repl.failover_slot,
                        writer=writer, primary_dsn=repl.primary_dsn)
        record = read_record(writer or conn, outbox.table.schema, repl.slot)
        recovering = record is not None and record.recovering
        if not recovering:
            warn_if_unfinished(writer or conn, outbox.table, repl.slot)
    except BaseException:
        conn.close()
        raise
    finally:
        if writer is not None:
            writer.close()
    return replace(settings, outbox=outbox), partitioned, conn, recovering, captured


def relayed_outbox(settings: WalSettings) -> TableRef | None:
    """The outbox table when the relay relays it (not ``--no-outbox``): no ``--capture``
    pattern takes it (capture/selection.py)."""
    capture = settings.capture
    return settings.outbox.table if capture is None or capture.outbox else None

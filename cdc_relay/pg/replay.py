"""Decoding on a standby: waiting until the standby has replayed what the relay wrote on
the primary.

Owns ``wait_replayed``: the primary's WAL write position after the relay's own changes
there (the captured tables' publication, the signal table), then the standby's replay
position polled until it has passed it - the check PostgreSQL's own replication tests
make. Without it the relay could look up, on a standby that lags, a table or a
publication membership the primary already has (docs/table-cdc.md, on a standby).

Must not: write anything (it only reads the two positions), or wait without end: a
standby that does not catch up within ``timeout`` is one ``DatabaseError`` naming what
to check.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from cdc_relay.errors import DatabaseError
from cdc_relay.pg.db import translate_error

log = logging.getLogger("cdc_relay.setup")

POLL = 0.05  # seconds between two reads of the standby's replay position
TOLD_AFTER = 2.0  # seconds before the wait is said in the log


def wait_replayed(standby: psycopg.Connection[Any], primary: psycopg.Connection[Any],
                  doing: str, *, timeout: float = 120.0) -> None:
    """Until ``standby`` has replayed the WAL ``primary`` has written so far (autocommit
    connections); ``doing`` names what waits, for the log and the error."""
    try:
        row = primary.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        target = str(row[0])
        started = time.monotonic()
        told = False
        while True:
            done = standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                   (target,)).fetchone()
            if done is not None and done[0]:
                return
            waited = time.monotonic() - started
            if waited > timeout:
                raise DatabaseError(
                    f"the standby has not replayed the primary's WAL up to {target} after "
                    f"{timeout:.0f} s ({doing}). Fix: check that it streams from the primary "
                    "(pg_stat_replication on the primary) and that its replay is not paused "
                    "(SELECT pg_is_wal_replay_paused() on the standby)")
            if waited > TOLD_AFTER and not told:
                log.info("waiting for the standby to replay the primary's WAL up to %s (%s)",
                         target, doing)
                told = True
            time.sleep(POLL)
    except psycopg.Error as exc:
        raise translate_error(exc, f"waiting for the standby's replay ({doing})") from exc

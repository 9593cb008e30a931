"""The replication slots as the catalog shows them: the one slot query and the idle-slot query.

Owns reading ``pg_replication_slots`` (with the walsender's ``flush_lag`` from
``pg_stat_replication``) into ``model.SlotStatus``: ``query_slot_status`` is the one slot
query every command shares (init, start-up, ``slot drop``, ``status``, ``doctor``, the
metrics probe), ``idle_logical_slots`` the one list of inactive logical slots (``init``,
``doctor`` and ``poll`` warn about them: they keep WAL until the disk is full).

Must not create, change or drop a slot (wal/slot/lifecycle.py does, wal/backfill/snapshot.py
creates one with a snapshot) or know which mode reads the slot.
"""

from __future__ import annotations

from typing import Any

import psycopg

from cdc_relay.config import validate_slot_name
from cdc_relay.model import Lsn, SlotStatus
from cdc_relay.pg.db import borrowed_or_new, translate_error

# Every inactive logical slot of this database, read on a primary (what ``poll``, ``init``
# and ``doctor`` warn about).
_IDLE_SLOTS_SQL = """
SELECT s.slot_name FROM pg_replication_slots AS s
WHERE s.database = current_database() AND s.slot_type = 'logical' AND NOT s.active
  AND NOT pg_is_in_recovery()
ORDER BY s.slot_name
"""

# One row always: the server's position, then the slot's columns (NULL without a slot).
# flush_lag is NULL once the walsender has caught up and gone idle: that reads as 0.
_SLOT_STATUS_SQL = """
SELECT w.lsn::text, s.slot_name, s.plugin, s.slot_type, s.database, s.active, s.active_pid,
       s.confirmed_flush_lsn::text, s.restart_lsn::text,
       greatest(pg_wal_lsn_diff(w.lsn, s.confirmed_flush_lsn), 0)::bigint,
       greatest(pg_wal_lsn_diff(w.lsn, s.restart_lsn), 0)::bigint,
       s.wal_status, s.safe_wal_size,
       CASE WHEN r.pid IS NULL THEN NULL
            ELSE coalesce(extract(epoch FROM r.flush_lag), 0)::float8 END,
       {failover}, {since}
FROM (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                  ELSE pg_current_wal_lsn() END AS lsn) AS w
LEFT JOIN pg_replication_slots AS s ON s.slot_name = %s
LEFT JOIN pg_stat_replication AS r ON r.pid = s.active_pid
"""


def _lsn(text: str | None) -> Lsn | None:
    return Lsn.parse(text) if text else None


def query_slot_status(conn: psycopg.Connection[Any], slot: str) -> tuple[Lsn, SlotStatus | None]:
    """(the server's WAL position, the slot's status or None when there is no such slot).

    The one query of ``pg_replication_slots`` every command shares (init, start-up,
    ``slot drop``, ``status``, ``doctor``, the metrics probe). psycopg errors pass through.
    """
    # failover / synced exist from PostgreSQL 17 on (failover slots).
    version = conn.info.server_version
    columns = ("s.failover, s.synced" if version >= 170000 else "NULL::boolean, NULL::boolean")
    # invalidation_reason and inactive_since from 17 on; idle_replication_slot_timeout from 18.
    since = ("s.invalidation_reason, extract(epoch FROM now() - s.inactive_since)::float8"
             if version >= 170000 else "NULL::text, NULL::float8")
    since += (", (SELECT setting::float8 FROM pg_settings"
              " WHERE name = 'idle_replication_slot_timeout')"  # unit: s
              if version >= 180000 else ", NULL::float8")
    row = conn.execute(_SLOT_STATUS_SQL.replace("{failover}", columns).replace("{since}", since),
                       (slot,)).fetchone()
    assert row is not None
    current = Lsn.parse(row[0]) if row[0] else Lsn(0)
    if row[1] is None:
        return current, None
    return current, SlotStatus(
        name=row[1], plugin=row[2], slot_type=row[3], database=row[4], active=bool(row[5]),
        active_pid=row[6], confirmed_flush_lsn=_lsn(row[7]), restart_lsn=_lsn(row[8]),
        lag_bytes=row[9], lag_seconds=row[13], retained_bytes=row[10], wal_status=row[11],
        safe_wal_size=row[12], failover=row[14], synced=row[15],
        invalidation_reason=row[16], inactive_seconds=row[17], idle_timeout=row[18],
    )


def slot_status(conn: psycopg.Connection[Any], slot: str) -> SlotStatus | None:
    """The slot's status, or None when there is no such slot (psycopg errors pass through)."""
    return query_slot_status(conn, slot)[1]


def read_slot_status(conn: psycopg.Connection[Any], slot: str) -> tuple[Lsn, SlotStatus | None]:
    """``query_slot_status`` with a psycopg error translated (a RelayError naming the fix)."""
    try:
        return query_slot_status(conn, slot)
    except psycopg.Error as exc:
        raise translate_error(exc, f"reading replication slot {slot!r}") from exc


def idle_logical_slots(conn: psycopg.Connection[Any]) -> list[SlotStatus]:
    """Inactive logical slots of the current database, each with the WAL it retains.

    Nothing reads such a slot, yet the server keeps every WAL segment since its restart
    LSN: the disk fills unless someone streams from it or drops it. On a standby there are
    none (its inactive slots are failover copies of the primary's: they must stay).
    """
    try:
        names = [row[0] for row in conn.execute(_IDLE_SLOTS_SQL).fetchall()]
    except psycopg.Error as exc:
        raise translate_error(exc, "listing replication slots") from exc
    found = (read_slot_status(conn, name)[1] for name in names)
    return [slot for slot in found if slot is not None and not slot.active]


def slot_info(conninfo: str | psycopg.Connection[Any], slot: str) -> SlotStatus | None:
    """The slot's status (its row of ``pg_replication_slots``), or None if there is no such slot.

    ``conninfo`` is a DSN (a connection is opened and closed) or an open connection.
    """
    validate_slot_name(slot)
    with borrowed_or_new(conninfo) as conn:
        try:
            return slot_status(conn, slot)
        except psycopg.Error as exc:
            raise translate_error(exc, f"reading replication slot {slot!r}") from exc


def slot_exists(conninfo: str | psycopg.Connection[Any], slot: str) -> bool:
    """True if a replication slot of that name exists (in any database)."""
    return slot_info(conninfo, slot) is not None

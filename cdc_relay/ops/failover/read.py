"""Reads the failover facts (ops/failover/facts.py) from the primary and a standby.

Owns the catalog queries: ``pg_replication_slots`` (the slot's ``failover`` flag on the
primary, its synced copy on the standby, the physical slots the primary waits for) and
the settings involved (``synchronized_standby_slots``, ``sync_replication_slots``,
``hot_standby_feedback``, ``primary_slot_name``, ``primary_conninfo``, which only a
superuser or a member of pg_read_all_settings may read: otherwise it is left unknown).
``FailoverReader`` keeps its two connections for the metrics probe.

Must not write anything, or let ``primary_conninfo`` (it may hold a password) leave this
module: only whether it names a database does.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import errors as pgerrors

from cdc_relay.errors import RelayError
from cdc_relay.ops.failover.facts import (
    FAILOVER_SLOTS_SINCE,
    FailoverStatus,
    PrimaryFacts,
    SlotCopy,
    StandbyFacts,
    conninfo_has_dbname,
    failover_status,
    parse_slot_list,
)
from cdc_relay.pg.db import connect, translate_error

_PRIMARY_SQL = """
SELECT current_setting('server_version_num')::int,
       current_setting('synchronized_standby_slots', true),
       EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = %s),
       (SELECT count(*) FROM pg_stat_replication AS r WHERE NOT EXISTS (
            SELECT FROM pg_replication_slots AS s
            WHERE s.active_pid = r.pid AND s.slot_type = 'logical'))::int
"""
_SLOT_FAILOVER_SQL = "SELECT failover FROM pg_replication_slots WHERE slot_name = %s"
_PHYSICAL_SQL = """
SELECT slot_name::text, active FROM pg_replication_slots
WHERE slot_type = 'physical' AND slot_name = ANY(%s)
"""
_STANDBY_SQL = """
SELECT pg_is_in_recovery(), current_setting('server_version_num')::int,
       current_setting('sync_replication_slots', true) = 'on',
       current_setting('hot_standby_feedback') = 'on', current_setting('primary_slot_name')
"""
_COPY_SQL = """
SELECT synced, temporary, invalidation_reason FROM pg_replication_slots WHERE slot_name = %s
"""
_COPY_SQL_OLD = "SELECT false, temporary, NULL FROM pg_replication_slots WHERE slot_name = %s"


def read_primary(conn: psycopg.Connection[Any], slot: str) -> PrimaryFacts:
    """The primary's side: version, the slot's failover flag, synchronized_standby_slots."""
    try:
        row = conn.execute(_PRIMARY_SQL, (slot,)).fetchone()
        assert row is not None
        version, synchronized, exists, senders = row
        if version < FAILOVER_SLOTS_SINCE:
            return PrimaryFacts(version, slot_exists=exists, physical_senders=senders)
        names = parse_slot_list(synchronized)
        flag = conn.execute(_SLOT_FAILOVER_SQL, (slot,)).fetchone()
        physical = dict(conn.execute(_PHYSICAL_SQL, (list(names),)).fetchall())
    except psycopg.Error as exc:
        raise translate_error(exc, "reading the primary's failover settings") from exc
    return PrimaryFacts(version, exists, bool(flag[0]) if flag else None, names, physical,
                        senders)


def read_standby(conn: psycopg.Connection[Any], slot: str) -> StandbyFacts:
    """The standby's side: recovery, the slot sync settings and its copy of ``slot``."""
    try:
        row = conn.execute(_STANDBY_SQL).fetchone()
        assert row is not None
        in_recovery, version, sync_slots, feedback, slot_name = row
        copy_sql = _COPY_SQL if version >= FAILOVER_SLOTS_SINCE else _COPY_SQL_OLD
        copy = conn.execute(copy_sql, (slot,)).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, "reading the standby's slot synchronisation") from exc
    return StandbyFacts(in_recovery, version, sync_slots if version >= FAILOVER_SLOTS_SINCE
                        else None, feedback, slot_name, _conninfo_dbname(conn),
                        SlotCopy(*copy) if copy else None)


def _conninfo_dbname(conn: psycopg.Connection[Any]) -> bool | None:
    try:
        row = conn.execute("SELECT current_setting('primary_conninfo')").fetchone()
    except pgerrors.InsufficientPrivilege:
        return None
    except psycopg.Error as exc:
        raise translate_error(exc, "reading the standby's primary_conninfo") from exc
    return conninfo_has_dbname(row[0]) if row and row[0] else False


def gather_failover(conn: psycopg.Connection[Any], standby_dsn: str | None, slot: str, *,
                    application_name: str = "cdc-relay doctor"
                    ) -> tuple[PrimaryFacts, StandbyFacts | None, str | None]:
    """(the primary's facts, read on ``conn``; the standby's, on a connection of its own,
    None without ``standby_dsn`` or when it could not be read; why it could not be read)."""
    primary = read_primary(conn, slot)
    if standby_dsn is None:
        return primary, None, None
    try:
        with connect(standby_dsn, autocommit=True, application_name=application_name) as other:
            return primary, read_standby(other, slot), None
    except RelayError as exc:
        return primary, None, str(exc)


def read_failover(conn: psycopg.Connection[Any], standby_dsn: str | None,
                  slot: str) -> FailoverStatus:
    """The verdict ``status`` shows (the primary read on ``conn``)."""
    primary, standby, error = gather_failover(conn, standby_dsn, slot,
                                              application_name="cdc-relay status")
    return failover_status(primary, standby, slot, standby_error=error)


class FailoverReader:
    """The metrics probe's reader: two reconnecting connections, one verdict per ``read``.

    A failure on the primary raises RelayError (the probe reports unknown); one on the
    standby is part of the verdict (not ready, with the reason).
    """

    def __init__(self, dsn: str, standby_dsn: str, slot: str) -> None:
        self._dsns = {"primary": dsn, "standby": standby_dsn}
        self._slot = slot
        self._conns: dict[str, psycopg.Connection[Any]] = {}

    def _conn(self, which: str) -> psycopg.Connection[Any]:
        conn = self._conns.get(which)
        if conn is None or conn.closed:
            conn = connect(self._dsns[which], autocommit=True, connect_timeout=5,
                           application_name="cdc-relay metrics")
            conn.execute("SET statement_timeout = '5s'")
            self._conns[which] = conn
        return conn

    def read(self) -> FailoverStatus:
        try:
            primary = read_primary(self._conn("primary"), self._slot)
        except RelayError:
            self._drop("primary")
            raise
        try:
            standby = read_standby(self._conn("standby"), self._slot)
        except RelayError as exc:
            self._drop("standby")
            return failover_status(primary, None, self._slot, standby_error=str(exc))
        return failover_status(primary, standby, self._slot)

    def _drop(self, which: str) -> None:
        conn = self._conns.pop(which, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for which in list(self._conns):
            self._drop(which)

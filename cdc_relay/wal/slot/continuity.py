"""The slot's history: what the relay records about its slot, and how it tells a slot loss.

When the relay (or ``init``) creates a slot it writes one row into
``<outbox schema>.cdc_relay_slots``: the slot's name, plugin, database, the cluster's
system identifier and timeline, where and when it was created, whether it is a failover
slot. The row is an ordinary table row, so it reaches streaming standbys with everything
else. A later start (or reconnect) that finds the slot missing or invalidated
(``wal_status = 'lost'``) while the row says it existed on this system is a **slot
loss** (``SlotLost``): the slot is never silently replaced, since events committed after
its last confirmed position would never be relayed (docs/design.md, continuity).

The row also carries the **horizon**: a transaction id such that every outbox row of an
older transaction is known to be relayed. ``HorizonRecorder`` moves it forward while the
relay streams: it notes the server's WAL insert position and the oldest running
transaction (``pg_current_snapshot()``'s xmin) at a moment T, and once the slot's
confirmed position has passed that WAL position, everything committed before T - every
transaction older than that xmin - has been acknowledged by the broker, so that xmin is
the new horizon. A recovery (wal/recovery.py) republishes exactly the retained rows of
transactions at or after the horizon: no time margin to guess, nothing older repeated.

Decoding on a standby (``run --primary-dsn``), the record lives on the primary (the
standby cannot write), ``HorizonRecorder`` runs there too and, every wake-up, also writes
a heartbeat (``pg_logical_emit_message``) so that the standby's slot has something to
decode and confirm on a quiet database.

Must not: create or drop slots (wal/slot/lifecycle.py, wal/backfill/snapshot.py, recovery.py do), publish, or
interpolate names into SQL (every name is a quoted identifier).
"""

from __future__ import annotations

import logging
import shlex
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from cdc_relay.errors import AccessRefused, RelayError, SlotLost, mask_secrets
from cdc_relay.model import Lsn, SlotStatus, invalidation_cause
from cdc_relay.pg.db import connect, translate_error

log = logging.getLogger("cdc_relay.continuity")

SLOTS_TABLE = "cdc_relay_slots"
RECORD_INTERVAL = 10.0  # seconds between two horizon updates while streaming
HEARTBEAT_PREFIX = "cdc-relay-heartbeat"  # decoding on a standby: HorizonRecorder's heartbeat

_CREATE = """
CREATE TABLE IF NOT EXISTS {table} (
    slot_name         text PRIMARY KEY,
    plugin            text NOT NULL,
    database          text NOT NULL,
    table_name        text NOT NULL,
    system_identifier text,
    timeline          int,
    created_lsn       pg_lsn,
    created_at        timestamptz NOT NULL DEFAULT now(),
    failover          boolean NOT NULL DEFAULT false,
    horizon_xid       bigint,
    covered_at        timestamptz,
    confirmed_lsn     pg_lsn,
    recovering        boolean NOT NULL DEFAULT false,
    updated_at        timestamptz NOT NULL DEFAULT now()
)
"""
_COLUMNS = ("slot_name, plugin, database, table_name, system_identifier, timeline,"
            " created_lsn::text, created_at, failover, horizon_xid, covered_at,"
            " confirmed_lsn::text, recovering")
# The cluster's identity as a plain connection can read it (NULLs where the role may not).
_IDENTITY = ("SELECT (SELECT system_identifier::text FROM pg_control_system()),"
             " (SELECT timeline_id FROM pg_control_checkpoint())")
# Every transaction older than this one has ended: the horizon candidate, with where
# the WAL stands and when.
_MARK = ("SELECT pg_current_wal_insert_lsn()::text,"
         " pg_snapshot_xmin(pg_current_snapshot())::text::bigint, now()")


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """One row of ``cdc_relay_slots``: a slot the relay created, and its horizon."""

    slot: str
    plugin: str
    database: str
    table: str
    system_identifier: str | None
    timeline: int | None
    created_lsn: Lsn | None
    created_at: datetime
    failover: bool
    horizon_xid: int | None  # rows of transactions at or after it may be unrelayed
    covered_at: datetime | None  # when everything committed was relayed, as last recorded
    confirmed_lsn: Lsn | None
    recovering: bool = False  # a recovery created this slot and has not finished yet


@dataclass(frozen=True, slots=True)
class HorizonMark:
    """A horizon candidate: it holds once the slot has confirmed ``wal_lsn``."""

    wal_lsn: Lsn
    xmin: int
    at: datetime


def slots_table(schema: str) -> sql.Composable:
    """The quoted ``<schema>.cdc_relay_slots``."""
    return sql.Identifier(schema, SLOTS_TABLE)


def _record(row: Sequence[Any]) -> SlotRecord:
    return SlotRecord(
        slot=row[0], plugin=row[1], database=row[2], table=row[3], system_identifier=row[4],
        timeline=row[5], created_lsn=Lsn.parse(row[6]) if row[6] else None, created_at=row[7],
        failover=bool(row[8]), horizon_xid=row[9], covered_at=row[10],
        confirmed_lsn=Lsn.parse(row[11]) if row[11] else None, recovering=bool(row[12]))


def read_record(conn: psycopg.Connection[Any], schema: str, slot: str) -> SlotRecord | None:
    """The slot's record, or None (no record, or no records table in ``schema`` yet)."""
    try:
        exists = conn.execute("SELECT to_regclass(%s)",
                              (slots_table(schema).as_string(conn),)).fetchone()
        if exists is None or exists[0] is None:
            return None
        row = conn.execute(sql.SQL("SELECT " + _COLUMNS + " FROM {} WHERE slot_name = %s").format(
            slots_table(schema)), (slot,)).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, f"reading the record of slot {slot!r}") from exc
    return None if row is None else _record(row)


def ensure_records_table(conn: psycopg.Connection[Any], schema: str) -> None:
    """Create ``cdc_relay_slots`` if missing; AccessRefused (with the fix) if not allowed."""
    table = slots_table(schema)
    try:
        exists = conn.execute("SELECT to_regclass(%s)", (table.as_string(conn),)).fetchone()
        if exists is not None and exists[0] is not None:
            return
        conn.execute(sql.SQL(_CREATE).format(table=table))
    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable,
            psycopg.errors.DuplicateObject):
        return  # a concurrent init or relay created it between the look-up and CREATE
    except psycopg.errors.InsufficientPrivilege as exc:
        raise AccessRefused(
            f"cannot create {schema}.{SLOTS_TABLE}, where the relay records its slot so that a "
            f"lost slot is noticed: {mask_secrets(str(exc).strip())}. Fix: run `cdc-relay init` "
            "once as the outbox table's owner (it creates the table), then GRANT SELECT, INSERT, "
            f"UPDATE, DELETE ON {schema}.{SLOTS_TABLE} TO the relay's role") from exc
    except psycopg.Error as exc:
        raise translate_error(exc, f"creating {schema}.{SLOTS_TABLE}") from exc


def identity(conn: psycopg.Connection[Any]) -> tuple[str | None, int | None]:
    """(system identifier, timeline), each None where the role may not read it."""
    try:
        with conn.transaction():
            row = conn.execute(_IDENTITY).fetchone()
    except psycopg.Error:
        return None, None
    return (None, None) if row is None else (row[0], row[1])


def record_creation(conn: psycopg.Connection[Any], *, schema: str, slot: str, plugin: str,
                    table: str, created_lsn: Lsn | None, failover: bool,
                    horizon_xid: int | None = None, recovering: bool = False) -> None:
    """Write (or replace) the record of a slot, on an autocommit connection.

    ``horizon_xid`` is ``oldest_running(conn)`` taken *before* the slot was created (rows
    of transactions that ended before were never the slot's to relay), the kept horizon
    of a recovery, or None where it is unknown (a slot found without a record): a
    recovery then republishes every retained row until the recorder moves it forward.
    """
    ensure_records_table(conn, schema)
    system_id, timeline = identity(conn)
    try:
        conn.execute(sql.SQL(
            "INSERT INTO {} (slot_name, plugin, database, table_name, system_identifier, timeline,"
            " created_lsn, failover, horizon_xid, covered_at, confirmed_lsn, recovering)"
            " VALUES (%s, %s, current_database(), %s, %s, %s, %s::pg_lsn, %s, %s, now(),"
            " %s::pg_lsn, %s)"
            " ON CONFLICT (slot_name) DO UPDATE SET plugin = excluded.plugin,"
            " database = excluded.database, table_name = excluded.table_name,"
            " system_identifier = excluded.system_identifier, timeline = excluded.timeline,"
            " created_lsn = excluded.created_lsn, created_at = now(),"
            " failover = excluded.failover, horizon_xid = excluded.horizon_xid,"
            " covered_at = excluded.covered_at, confirmed_lsn = excluded.confirmed_lsn,"
            " recovering = excluded.recovering, updated_at = now()").format(slots_table(schema)),
            (slot, plugin, table, system_id, timeline,
             str(created_lsn) if created_lsn is not None else None, failover, horizon_xid,
             str(created_lsn) if created_lsn is not None else None, recovering))
    except psycopg.Error as exc:
        raise translate_error(exc, f"recording slot {slot!r}") from exc
    log.info("recorded slot %s in %s.%s (created at %s%s)", slot, schema, SLOTS_TABLE,
             created_lsn or "?", ", failover" if failover else "",
             extra={"slot": slot, "failover": failover})


def oldest_running(conn: psycopg.Connection[Any]) -> int:
    """The oldest transaction running now (every older one has ended): a new slot's horizon,
    taken before the slot is created."""
    try:
        row = conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
                           ).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, "reading the oldest running transaction") from exc
    assert row is not None
    return int(row[0])


def recovered(conn: psycopg.Connection[Any], schema: str, slot: str, horizon_xid: int) -> None:
    """A recovery finished: the new baseline horizon, and no recovery pending any more."""
    try:
        conn.execute(sql.SQL(
            "UPDATE {} SET horizon_xid = %s, covered_at = now(), recovering = false,"
            " updated_at = now() WHERE slot_name = %s").format(slots_table(schema)),
            (horizon_xid, slot))
    except psycopg.Error as exc:
        raise translate_error(exc, f"recording the recovery of slot {slot!r}") from exc


def forget(conn: psycopg.Connection[Any], slot: str) -> int:
    """Delete the slot's records in every schema (``slot drop``: a slot dropped on purpose
    is no loss); the number of records deleted."""
    try:
        schemas = [row[0] for row in conn.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relname = %s AND c.relkind = 'r'", (SLOTS_TABLE,))]
        deleted = 0
        for schema in schemas:
            deleted += max(conn.execute(sql.SQL("DELETE FROM {} WHERE slot_name = %s").format(
                slots_table(schema)), (slot,)).rowcount, 0)
    except psycopg.Error as exc:
        raise translate_error(exc, f"deleting the record of slot {slot!r}") from exc
    return deleted


# -- telling a slot loss ------------------------------------------------------------

def loss_reason(status: SlotStatus | None, record: SlotRecord | None,
                system_identifier: str | None) -> str | None:
    """Why this is a slot loss, or None when it is not (pure).

    A listed slot is lost only when PostgreSQL invalidated it. A missing slot is lost when
    a record says the relay created it on this system (a record of another system - a
    database restored elsewhere - says nothing about this one); without a record the slot
    simply has not been created yet.
    """
    if status is not None:
        if status.invalidated:
            why, fix = invalidation_cause(status.invalidation_reason)
            return (f"replication slot {status.name!r} was invalidated by PostgreSQL "
                    f"(invalidation_reason {status.invalidation_reason or 'wal_removed'}: {why}; "
                    f"to keep it from happening again, {fix})")
        return None
    if record is None:
        return None
    if (record.system_identifier and system_identifier
            and record.system_identifier != system_identifier):
        return None
    return (f"replication slot {record.slot!r} no longer exists on this server, though the "
            f"relay created it at {record.created_lsn or '?'} on {record.created_at:%Y-%m-%d %H:%M:%S %Z} "
            "(a failover to a standby without a copy of the slot, or a dropped slot)")


def recovery_command(argv: Sequence[str] | None = None) -> str:
    """The command line that recovers: this one, with ``--on-slot-loss recover``."""
    args = list(sys.argv if argv is None else argv)
    if args and (args[0].endswith("cdc-relay") or args[0].endswith("__main__.py")):
        args[0] = "cdc-relay"
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--on-slot-loss":
            skip = True
            continue
        if arg.startswith("--on-slot-loss="):
            continue
        kept.append(arg)
    return shlex.join([mask_secrets(arg) for arg in (*kept, "--on-slot-loss", "recover")])


def slot_lost(reason: str, record: SlotRecord | None, *, argv: Sequence[str] | None = None
              ) -> SlotLost:
    """The one line a slot loss stops with: what happened, what is at stake, the command."""
    since = ""
    if record is not None and record.covered_at is not None:
        since = (f"; events committed since {record.covered_at:%Y-%m-%d %H:%M:%S %Z} may not "
                 "have been relayed")
    return SlotLost(f"{reason}{since}. Nothing was replaced. Recover (creates a new slot and "
                    "republishes every retained outbox row that may be unrelayed, at least "
                    f"once): {recovery_command(argv)} (docs/high-availability.md)")


# -- moving the horizon forward -------------------------------------------------------

def take_mark(conn: psycopg.Connection[Any]) -> HorizonMark:
    """A horizon candidate as of now."""
    row = conn.execute(_MARK).fetchone()
    assert row is not None
    return HorizonMark(Lsn.parse(row[0]), int(row[1]), row[2])


def advance(conn: psycopg.Connection[Any], schema: str, slot: str, mark: HorizonMark,
            confirmed: Lsn) -> bool:
    """Make ``mark`` the horizon if the slot confirmed past it; False if not yet (no write)."""
    if confirmed < mark.wal_lsn:
        return False
    conn.execute(sql.SQL(
        "UPDATE {} SET horizon_xid = greatest(horizon_xid, %s), covered_at = %s,"
        " confirmed_lsn = %s::pg_lsn, updated_at = now() WHERE slot_name = %s").format(
            slots_table(schema)), (mark.xmin, mark.at, str(confirmed), slot))
    return True


def heartbeat(conn: psycopg.Connection[Any]) -> None:
    """One non-transactional logical decoding message (prefix ``HEARTBEAT_PREFIX``) on the
    primary: WAL the standby replays and its slot decodes, so that a relay decoding on a
    standby of a quiet database still sees the stream move and confirms past it. Decoders
    drop the prefix (only ``cdc-relay`` is an outbox event)."""
    try:
        conn.execute("SELECT pg_logical_emit_message(false, %s, '')", (HEARTBEAT_PREFIX,))
    except psycopg.Error as exc:
        raise translate_error(exc, "writing a heartbeat on the primary") from exc


class HorizonRecorder:
    """Moves the slot's horizon forward while the relay streams (see the module docstring).

    A daemon thread with its own connection, waking every ``interval`` seconds: it reads
    the confirmed LSN the loop publishes (``confirmed()``), and never touches the stream.
    A failing database is retried at the next wake-up; the horizon only ever lags, which
    makes a recovery republish more, never less.
    """

    def __init__(self, dsn: str, schema: str, slot: str, confirmed: Callable[[], int], *,
                 interval: float = RECORD_INTERVAL, heartbeat: bool = False) -> None:
        """``heartbeat``: also write a heartbeat every wake-up (decoding on a standby)."""
        self._dsn, self._schema, self._slot = dsn, schema, slot
        self._heartbeat = heartbeat
        self._confirmed = confirmed
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cdc-relay-horizon", daemon=True)
        self._failing = False

    def start(self) -> HorizonRecorder:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def __enter__(self) -> HorizonRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        mark: HorizonMark | None = None
        while not self._stop.wait(self._interval):
            try:
                if conn is None or conn.closed:
                    conn = connect(self._dsn, autocommit=True,
                                   application_name="cdc-relay horizon")
                    mark = None
                if self._heartbeat:
                    heartbeat(conn)
                if mark is None or advance(conn, self._schema, self._slot, mark,
                                           Lsn(self._confirmed())):
                    mark = take_mark(conn)
                if self._failing:
                    log.info("recording the slot's horizon again")
                self._failing = False
            except (psycopg.Error, RelayError) as exc:
                if not self._failing:
                    log.warning("cannot record the slot's horizon (%s); retrying every %.0fs - "
                                "a recovery would republish more meanwhile, never less",
                                mask_secrets(str(exc).strip().splitlines()[0] if str(exc).strip()
                                             else type(exc).__name__), self._interval)
                self._failing = True
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

"""WAL mode's logical replication slot: created if missing, checked if there, dropped on request.

Owns creating the slot (a failover slot on PostgreSQL 17+; on a standby, with the
primary nudged for the running-transactions record the creation waits for), recording
its creation (wal/slot/continuity.py), refusing a lost slot (SlotLost) instead of
silently replacing it, checking that an existing slot fits (logical, this database, this
plugin) and ``drop_slot``. The slot is created outside any transaction (PostgreSQL
refuses to create a logical slot in a transaction that has written anything), and losing
that race to a concurrent run just means finding the slot already there.

Must not: create publications (wal/slot/publication.py), change server settings (it
only says which to change), drop a slot anyone streams from, interpolate user text into
SQL, or read or write outbox rows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pgerrors

from cdc_relay.config import TableRef, validate_slot_name
from cdc_relay.errors import AccessRefused, ConfigError, DatabaseError, RelayError, SlotBusy, mask_secrets
from cdc_relay.model import SlotStatus
from cdc_relay.pg.db import borrowed_or_new, connect, translate_error
from cdc_relay.pg.endpoint import replication_fix
from cdc_relay.pg.schema import Outcome
from cdc_relay.pg.slots import slot_status
from cdc_relay.wal.slot import continuity

STANDBY_SNAPSHOT_INTERVAL = 0.2  # seconds between two pg_log_standby_snapshot() calls

log = logging.getLogger("cdc_relay.setup")


def create_or_check_slot(conn: psycopg.Connection[Any], slot: str, plugin: str, table: TableRef,
                         failover: bool, before_create: Callable[[], None] | None = None, *,
                         writer: psycopg.Connection[Any] | None = None,
                         primary_dsn: str | None = None) -> Outcome:
    """The slot on ``conn``; its record on ``writer`` (the primary) when decoding on a standby."""
    rec = writer or conn
    info = slot_status(conn, slot)
    record = continuity.read_record(rec, table.schema, slot)
    system_id = continuity.identity(rec)[0] if record is not None else None
    reason = continuity.loss_reason(info, record, system_id)
    if reason is not None:
        raise continuity.slot_lost(reason, record)
    if info is None:
        _check_wal_level(conn)
        if before_create is not None:
            before_create()
        failover = failover and supports_failover_slots(conn) and writer is None
        horizon = continuity.oldest_running(rec)
        try:
            with standby_snapshots(primary_dsn if writer is not None else None, slot):
                conn.execute(
                    "SELECT pg_create_logical_replication_slot(%s, %s, false, false, true)"
                    if failover else "SELECT pg_create_logical_replication_slot(%s, %s)",
                    (slot, plugin))
        except pgerrors.DuplicateObject:
            info = slot_status(conn, slot)  # a concurrent init won the race
        except psycopg.Error as exc:
            raise _slot_error(exc, slot, plugin) from exc
        else:
            created = slot_status(conn, slot)
            continuity.record_creation(
                rec, schema=table.schema, slot=slot, plugin=plugin, table=str(table),
                created_lsn=created.confirmed_flush_lsn if created else None, failover=failover,
                horizon_xid=horizon)
            return Outcome.CREATED
    info = _settled_slot_info(conn, slot, info)
    if info is None:  # created and dropped again between two statements: give up
        raise DatabaseError(f"replication slot {slot!r} vanished while init was creating it")
    _check_slot_matches(conn, info, plugin)
    if record is None or (record.system_identifier and system_id
                          and record.system_identifier != system_id):
        # A slot from before records existed (or of a restored database): record it now,
        # so that losing it from here on is noticed; its horizon is unknown until the
        # relay streams (a recovery meanwhile republishes every retained row).
        continuity.record_creation(
            rec, schema=table.schema, slot=slot, plugin=plugin, table=str(table),
            created_lsn=info.confirmed_flush_lsn, failover=bool(info.failover))
    return Outcome.EXISTED


@contextmanager
def standby_snapshots(primary_dsn: str | None, slot: str) -> Iterator[None]:
    """While the body creates a slot on a standby: ask the primary for a running-transactions
    record every ``STANDBY_SNAPSHOT_INTERVAL`` (``pg_log_standby_snapshot()``), which the
    creation waits for. Without the right to call it the creation still finishes, at the
    primary's next such record (up to 15 s when it writes at all): said once, not an error.
    """
    if primary_dsn is None:
        yield
        return
    done = threading.Event()

    def nudge() -> None:
        try:
            with connect(primary_dsn, autocommit=True,
                         application_name="cdc-relay standby snapshot") as primary:
                while True:
                    primary.execute("SELECT pg_log_standby_snapshot()")
                    if done.wait(STANDBY_SNAPSHOT_INTERVAL):
                        return
        except (psycopg.Error, RelayError) as exc:
            log.warning("cannot call pg_log_standby_snapshot() on the primary (%s): creating "
                        "slot %s on the standby waits for the primary's next running-"
                        "transactions record instead. Fix (faster set-up): GRANT EXECUTE ON "
                        "FUNCTION pg_log_standby_snapshot() TO <the relay's role>",
                        mask_secrets(str(exc).strip().splitlines()[0] if str(exc).strip()
                                     else type(exc).__name__), slot)

    thread = threading.Thread(target=nudge, name="cdc-relay standby snapshot", daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5.0)
    log.info("created slot %s on the standby in %.2fs", slot, time.monotonic() - started,
             extra={"slot": slot})


def supports_failover_slots(conn: psycopg.Connection[Any]) -> bool:
    """PostgreSQL 17+ can create failover slots (synchronized to standbys)."""
    return conn.info.server_version >= 170000


def _settled_slot_info(conn: psycopg.Connection[Any], slot: str,
                       info: SlotStatus | None, timeout: float = 60.0) -> SlotStatus | None:
    """Wait while a concurrent session is still creating the slot.

    During pg_create_logical_replication_slot (which waits for running transactions)
    the slot is already listed, with an empty plugin; judging it then would report a
    plugin mismatch that is not there.
    """
    deadline = time.monotonic() + timeout
    while info is not None and not info.plugin and time.monotonic() < deadline:
        time.sleep(0.05)
        info = slot_status(conn, slot)
    return info


def _check_wal_level(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SELECT current_setting('wal_level')").fetchone()
    level = row[0] if row else "unknown"
    if level != "logical":
        raise DatabaseError(
            f"wal_level is {level!r}, WAL mode needs 'logical'. Fix: run ALTER SYSTEM SET "
            "wal_level = logical; then restart PostgreSQL (a reload is not enough). "
            "Or use polling mode (cdc-relay poll), which needs no slot"
        )


def _slot_error(exc: psycopg.Error, slot: str, plugin: str) -> RelayError:
    message = mask_secrets(" ".join((exc.diag.message_primary or str(exc)).split()))
    if exc.sqlstate == "58P01" or "could not access file" in message:
        return DatabaseError(
            f"cannot create slot {slot!r}: output plugin {plugin!r} is not installed "
            f"({message}). Fix: install postgresql-<version>-{plugin} on the database "
            "server (e.g. apt-get install postgresql-15-wal2json), or use --plugin pgoutput"
        )
    if "may not be used as an output plugin" in message:
        return DatabaseError(
            f"cannot create slot {slot!r}: {message}. Fix: allow the plugin on the server: "
            "ALTER SYSTEM SET output_plugin_libraries = 'pgoutput', 'test_decoding', "
            f"'{plugin}'; SELECT pg_reload_conf(); — or use --plugin pgoutput"
        )
    if exc.sqlstate == "42501":
        return AccessRefused(
            f"cannot create slot {slot!r}: {message}. Fix: {replication_fix(None)} (or "
            "create the slot once as a superuser with `cdc-relay init`)")
    error = translate_error(exc, f"creating replication slot {slot!r}")
    return error if isinstance(error, DatabaseError) else DatabaseError(str(error))


def _check_slot_matches(conn: psycopg.Connection[Any], info: SlotStatus, plugin: str) -> None:
    drop_hint = (
        f"or drop it with `cdc-relay slot drop --slot {info.name}` (or SELECT "
        f"pg_drop_replication_slot('{info.name}')); dropping loses its position, events "
        "committed while no slot exists are not relayed"
    )
    if info.slot_type != "logical":
        raise ConfigError(
            f"replication slot {info.name!r} is a {info.slot_type} slot, not a logical one: "
            f"choose another --slot, {drop_hint}"
        )
    row = conn.execute("SELECT current_database()").fetchone()
    current = row[0] if row else None
    if info.database != current:
        raise ConfigError(
            f"replication slot {info.name!r} belongs to database {info.database!r}, not "
            f"{current!r}: choose another --slot, {drop_hint}"
        )
    if info.plugin != plugin:
        raise ConfigError(
            f"replication slot {info.name!r} exists with plugin {info.plugin!r}, not "
            f"{plugin!r}: run with --plugin {info.plugin}, choose another --slot, {drop_hint}"
        )


def drop_slot(conninfo: str | psycopg.Connection[Any], slot: str) -> bool:
    """Drop an inactive replication slot; False if it did not exist.

    Refuses (SlotBusy) while a relay or another client streams from it: stop that
    process first. Dropping loses the slot's position.
    """
    validate_slot_name(slot)
    with borrowed_or_new(conninfo) as conn:
        try:
            info = slot_status(conn, slot)
            if info is None:
                return False
            if info.active:
                raise SlotBusy(_busy_message(slot, info.active_pid))
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            continuity.forget(conn, slot)  # dropped on purpose: no loss to report later
        except pgerrors.UndefinedObject:
            return False  # dropped by someone else in between
        except pgerrors.ObjectInUse as exc:
            raise SlotBusy(_busy_message(slot, None)) from exc
        except psycopg.Error as exc:
            raise translate_error(exc, f"dropping replication slot {slot!r}") from exc
    return True


def _busy_message(slot: str, pid: int | None) -> str:
    who = f"process {pid}" if pid else "another process"
    return (
        f"replication slot {slot!r} is active ({who} is streaming from it): stop that "
        "relay (or pg_recvlogical) first, then drop the slot"
    )

"""WAL mode's database objects: the pgoutput publication and the logical replication slot.

Owns creating them if missing (``ensure_replication`` at relay start-up, and
``ensure_publication_and_slot`` for ``cdc-relay init`` in schema.py), checking that an
existing slot fits (logical, this database, this plugin), and the small slot helpers
other commands reuse (``slot_info``, ``slot_exists``, ``drop_slot``). Also the
vocabulary both it and schema.py report in (``Outcome``) and the advisory lock every
``init`` and start-up check takes (``ADVISORY_LOCK_KEY``).

The publication is changed in a transaction under that lock, so concurrent starts are
safe; the slot is created outside any transaction (PostgreSQL refuses to create a
logical slot in a transaction that has written anything), and losing that race to a
concurrent run just means finding the slot already there.

Must not: apply migrations or touch the outbox table (schema.py does), interpolate user
text into SQL, change server settings (it only says which to change), drop a slot
anyone streams from, or read or write outbox rows.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql

from cdc_relay.config import OutboxConfig, TableRef, validate_identifier, validate_slot_name
from cdc_relay.db import (
    connect,
    describe_dsn,
    translate_error,
    validated_columns,
    validated_table,
)
from cdc_relay.errors import ConfigError, DatabaseError, SlotBusy, mask_secrets
from cdc_relay.model import Lsn

PLUGINS = ("wal2json", "pgoutput")
# One lock for every init in a database ("cdc_rela" in ASCII): DDL is rare, serialising
# it is cheaper than reasoning about concurrent CREATE ... IF NOT EXISTS races.
ADVISORY_LOCK_KEY = 0x6364635F72656C61


class Outcome(enum.Enum):
    """What init (or the start-up check) did to one object."""

    CREATED = "created"
    EXISTED = "existed"
    UPDATED = "updated"  # e.g. the outbox table added to an existing publication
    DROPPED = "dropped"  # the NOTIFY trigger with notify_trigger=False
    ABSENT = "absent"  # not wanted and not there
    SKIPPED = "skipped"  # not needed in this configuration

    @property
    def changed(self) -> bool:
        """True if the run changed the object (created, updated or dropped it)."""
        return self in (Outcome.CREATED, Outcome.UPDATED, Outcome.DROPPED)


@dataclass(frozen=True, slots=True)
class ReplicationReport:
    """What ``ensure_replication`` found and changed."""

    publication: Outcome
    slot: Outcome

    @property
    def changed(self) -> bool:
        """False when publication and slot were already in place."""
        return self.publication.changed or self.slot.changed


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """A row of ``pg_replication_slots``."""

    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    active: bool
    active_pid: int | None
    confirmed_flush_lsn: Lsn | None
    restart_lsn: Lsn | None


def validate_wal_options(slot: str | None, plugin: str, publication: str) -> None:
    """ConfigError for an invalid slot name, an unknown plugin or an invalid publication."""
    if slot is not None:
        validate_slot_name(slot)
    if plugin not in PLUGINS:
        raise ConfigError(f"unknown plugin {plugin!r}: use wal2json or pgoutput")
    validate_identifier(publication, "publication name")


def ensure_replication(
    dsn: str,
    outbox: OutboxConfig,
    *,
    slot: str,
    plugin: str = "wal2json",
    publication: str = "cdc_relay_outbox",
) -> ReplicationReport:
    """WAL mode's start-up check: the publication (pgoutput) and the slot, created if missing.

    Applies no migrations: the outbox table must exist (``cdc-relay init``), else
    ConfigError. Safe when several relays start at once (same lock as init). An existing
    slot with another plugin, or of another database, is a ConfigError naming the fix.
    """
    # Every name is validated before any I/O, the same checks init makes.
    table = validated_table(outbox.table)
    validated_columns(outbox.columns)
    validate_wal_options(slot, plugin, publication)
    with connect(dsn, autocommit=True) as conn:
        try:
            row = conn.execute(
                "SELECT to_regclass(%s)", (_table_identifier(table).as_string(conn),)
            ).fetchone()
        except psycopg.Error as exc:
            raise translate_error(exc, f"looking up {table}") from exc
        if row is None or row[0] is None:
            raise ConfigError(
                f"outbox table {table} does not exist in {describe_dsn(dsn)}: run "
                "`cdc-relay init` first, or pass the right --table / --dsn"
            )
        return ensure_publication_and_slot(
            conn, table, slot=slot, plugin=plugin, publication=publication
        )


def ensure_publication_and_slot(
    conn: psycopg.Connection[Any],
    table: TableRef,
    *,
    slot: str,
    plugin: str,
    publication: str,
) -> ReplicationReport:
    """On an autocommit connection: the publication (pgoutput only), then the slot.

    Names must already be validated (``validate_wal_options``, ``validated_table``).
    """
    pub = Outcome.SKIPPED
    if plugin == "pgoutput":
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
                pub = _ensure_publication(conn, publication, table)
        except psycopg.Error as exc:
            raise translate_error(exc, f"creating publication {publication!r}") from exc
    try:
        slot_outcome = _ensure_slot(conn, slot, plugin)
    except psycopg.Error as exc:
        raise translate_error(exc, f"checking replication slot {slot!r}") from exc
    return ReplicationReport(pub, slot_outcome)


def _table_identifier(table: TableRef) -> sql.Identifier:
    return sql.Identifier(table.schema, table.name)


def _ensure_publication(
    conn: psycopg.Connection[Any],
    publication: str,
    table: TableRef,
) -> Outcome:
    row = conn.execute(
        "SELECT puballtables, pubinsert FROM pg_publication WHERE pubname = %s",
        (publication,),
    ).fetchone()
    pub = sql.Identifier(publication)
    if row is None:
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert')").format(
                pub, _table_identifier(table)
            )
        )
        return Outcome.CREATED
    all_tables, publishes_inserts = row
    if not publishes_inserts:
        raise ConfigError(
            f"publication {publication!r} does not publish inserts: run ALTER PUBLICATION "
            f"{publication} SET (publish = 'insert'), or pass another --publication"
        )
    if all_tables:
        return Outcome.EXISTED
    member = conn.execute(
        "SELECT 1 FROM pg_publication_tables "
        "WHERE pubname = %s AND schemaname = %s AND tablename = %s",
        (publication, table.schema, table.name),
    ).fetchone()
    if member is not None:
        return Outcome.EXISTED
    conn.execute(
        sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, _table_identifier(table))
    )
    return Outcome.UPDATED


def _ensure_slot(conn: psycopg.Connection[Any], slot: str, plugin: str) -> Outcome:
    info = _slot_info(conn, slot)
    if info is None:
        _check_wal_level(conn)
        try:
            conn.execute(
                "SELECT pg_create_logical_replication_slot(%s, %s)", (slot, plugin)
            )
        except pgerrors.DuplicateObject:
            info = _slot_info(conn, slot)  # a concurrent init won the race
        except psycopg.Error as exc:
            raise _slot_error(exc, slot, plugin) from exc
        else:
            return Outcome.CREATED
    info = _settled_slot_info(conn, slot, info)
    if info is None:  # created and dropped again between two statements: give up
        raise DatabaseError(f"replication slot {slot!r} vanished while init was creating it")
    _check_slot_matches(conn, info, plugin)
    return Outcome.EXISTED


def _settled_slot_info(conn: psycopg.Connection[Any], slot: str,
                       info: SlotInfo | None, timeout: float = 60.0) -> SlotInfo | None:
    """Wait while a concurrent session is still creating the slot.

    During pg_create_logical_replication_slot (which waits for running transactions)
    the slot is already listed, with an empty plugin; judging it then would report a
    plugin mismatch that is not there.
    """
    deadline = time.monotonic() + timeout
    while info is not None and not info.plugin and time.monotonic() < deadline:
        time.sleep(0.05)
        info = _slot_info(conn, slot)
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


def _slot_error(exc: psycopg.Error, slot: str, plugin: str) -> DatabaseError:
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
    error = translate_error(exc, f"creating replication slot {slot!r}")
    return error if isinstance(error, DatabaseError) else DatabaseError(str(error))


def _check_slot_matches(conn: psycopg.Connection[Any], info: SlotInfo, plugin: str) -> None:
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


_SLOT_QUERY = (
    "SELECT slot_name, plugin, slot_type, database, active, active_pid, "
    "confirmed_flush_lsn::text, restart_lsn::text "
    "FROM pg_replication_slots WHERE slot_name = %s"
)


def _slot_info(conn: psycopg.Connection[Any], slot: str) -> SlotInfo | None:
    row = conn.execute(_SLOT_QUERY, (slot,)).fetchone()
    if row is None:
        return None
    name, plugin, slot_type, database, active, pid, confirmed, restart = row
    return SlotInfo(
        name=name,
        plugin=plugin,
        slot_type=slot_type,
        database=database,
        active=bool(active),
        active_pid=pid,
        confirmed_flush_lsn=Lsn.parse(confirmed) if confirmed else None,
        restart_lsn=Lsn.parse(restart) if restart else None,
    )


@contextmanager
def _borrow(conninfo: str | psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    if isinstance(conninfo, psycopg.Connection):
        yield conninfo
        return
    with connect(conninfo, autocommit=True) as conn:
        yield conn


def slot_info(conninfo: str | psycopg.Connection[Any], slot: str) -> SlotInfo | None:
    """The slot's row of ``pg_replication_slots``, or None if there is no such slot.

    ``conninfo`` is a DSN (a connection is opened and closed) or an open connection.
    """
    validate_slot_name(slot)
    with _borrow(conninfo) as conn:
        try:
            return _slot_info(conn, slot)
        except psycopg.Error as exc:
            raise translate_error(exc, f"reading replication slot {slot!r}") from exc


def slot_exists(conninfo: str | psycopg.Connection[Any], slot: str) -> bool:
    """True if a replication slot of that name exists (in any database)."""
    return slot_info(conninfo, slot) is not None


def drop_slot(conninfo: str | psycopg.Connection[Any], slot: str) -> bool:
    """Drop an inactive replication slot; False if it did not exist.

    Refuses (SlotBusy) while a relay or another client streams from it: stop that
    process first. Dropping loses the slot's position.
    """
    validate_slot_name(slot)
    with _borrow(conninfo) as conn:
        try:
            info = _slot_info(conn, slot)
            if info is None:
                return False
            if info.active:
                raise SlotBusy(_busy_message(slot, info.active_pid))
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
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


def ensure_publication(conn: psycopg.Connection[Any], table: TableRef, publication: str) -> Outcome:
    """The pgoutput publication alone, on an autocommit connection (the backfill's start).

    ``run --snapshot initial`` creates the slot itself (with an exported snapshot), and
    pgoutput needs the publication to exist before the slot does.
    """
    table = validated_table(table)
    validate_identifier(publication, "publication name")
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
            return _ensure_publication(conn, publication, table)
    except psycopg.Error as exc:
        raise translate_error(exc, f"creating publication {publication!r}") from exc

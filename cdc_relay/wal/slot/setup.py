"""WAL mode's database objects: the pgoutput publication and the logical replication slot.

Owns creating them if missing (``ensure_replication`` at relay start-up, and
``ensure_publication_and_slot`` for ``cdc-relay init`` in app/init.py), checking that an
existing slot fits (logical, this database, this plugin), and the small slot helpers
other commands reuse (``drop_slot``; the slot queries are cdc_relay/pg/slots.py's). The
advisory lock every ``init`` and start-up check takes (``ADVISORY_LOCK_KEY``) and the
vocabulary they report in (``Outcome``) are pg/schema.py's.

The publication is changed in a transaction under that lock, so concurrent starts are
safe; the slot is created outside any transaction (PostgreSQL refuses to create a
logical slot in a transaction that has written anything), and losing that race to a
concurrent run just means finding the slot already there.

Decoding on a standby (``primary_dsn``; docs/design.md, continuity; PostgreSQL 16+): the
slot is created on the standby (never a failover slot: PostgreSQL refuses that there),
while the publication and the slot's record are written on the primary. A standby's slot
creation waits for the next running-transactions record from the primary; a helper
thread asks the primary for one (``pg_log_standby_snapshot()``) until the creation
returns, instead of waiting up to the primary's 15 s (bgwriter) for it.

Must not: apply migrations or touch the outbox table (pg/schema.py does), interpolate user
text into SQL, change server settings (it only says which to change), drop a slot
anyone streams from, or read or write outbox rows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql

from cdc_relay.config import OutboxConfig, TableRef, validate_identifier, validate_slot_name
from cdc_relay.errors import (
    AccessRefused,
    ConfigError,
    DatabaseError,
    RelayError,
    SlotBusy,
    mask_secrets,
)
from cdc_relay.model import SlotStatus
from cdc_relay.pg.db import (
    borrowed_or_new,
    connect,
    describe_dsn,
    translate_error,
    validated_columns,
    validated_table,
)
from cdc_relay.pg.endpoint import refuse_pooler, replication_fix
from cdc_relay.pg.schema import ADVISORY_LOCK_KEY, Outcome
from cdc_relay.pg.slots import slot_status
from cdc_relay.wal.slot import continuity

PLUGINS = ("wal2json", "pgoutput")
# pgoutput is built into PostgreSQL (managed services included) and allowed by a stock
# server's output_plugin_libraries; wal2json is an option (docs/wal-mode.md).
DEFAULT_PLUGIN = "pgoutput"
STANDBY_SNAPSHOT_INTERVAL = 0.2  # seconds between two pg_log_standby_snapshot() calls

log = logging.getLogger("cdc_relay.setup")


@dataclass(frozen=True, slots=True)
class ReplicationReport:
    """What ``ensure_replication`` found and changed."""

    publication: Outcome
    slot: Outcome
    partitioned: bool = False  # the outbox is a partitioned table

    @property
    def changed(self) -> bool:
        """False when publication and slot were already in place."""
        return self.publication.changed or self.slot.changed


def validate_wal_options(slot: str | None, plugin: str, publication: str) -> None:
    """ConfigError for an invalid slot name, an unknown plugin or an invalid publication."""
    if slot is not None:
        validate_slot_name(slot)
    if plugin not in PLUGINS:
        raise ConfigError(f"unknown plugin {plugin!r}: use wal2json or pgoutput")
    validate_identifier(publication, "publication name")


def plugin_for_slot(conn: psycopg.Connection[Any], slot: str) -> tuple[str, str | None]:
    """The plugin to use when none was given: an existing slot's, else DEFAULT_PLUGIN.

    Returns (plugin, note): the note says why the slot's plugin was taken (a slot made
    by an earlier version, whose default was wal2json); None for the default.
    """
    try:
        info = slot_status(conn, slot)
    except psycopg.Error as exc:
        raise translate_error(exc, f"looking up replication slot {slot!r}") from exc
    if info is not None and info.plugin in PLUGINS and info.plugin != DEFAULT_PLUGIN:
        return info.plugin, (f"replication slot {slot!r} exists with plugin {info.plugin!r}: "
                             f"using it (pass --plugin to choose; the default is "
                             f"{DEFAULT_PLUGIN})")
    return DEFAULT_PLUGIN, None


def ensure_replication(
    dsn: str,
    outbox: OutboxConfig,
    *,
    slot: str,
    plugin: str = DEFAULT_PLUGIN,
    publication: str = "cdc_relay_outbox",
    conn: psycopg.Connection[Any] | None = None,
    failover: bool = True,
    writer: psycopg.Connection[Any] | None = None,
    primary_dsn: str | None = None,
) -> ReplicationReport:
    """WAL mode's start-up check: the publication (pgoutput) and the slot, created if missing.

    Decoding on a standby: ``dsn``/``conn`` is the standby (the slot), ``writer`` an open
    autocommit connection to the primary at ``primary_dsn`` (the publication, the record).

    Applies no migrations: the outbox table must exist (``cdc-relay init``), else
    ConfigError. Safe when several relays start at once (same lock as init). An existing
    slot with another plugin, or of another database, is a ConfigError naming the fix.
    Runs on ``conn`` (an open autocommit connection, left open) if given.
    """
    # Every name is validated before any I/O, the same checks init makes.
    table = validated_table(outbox.table)
    validated_columns(outbox.columns)
    validate_wal_options(slot, plugin, publication)
    with borrowed_or_new(dsn, conn) as conn:
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
            conn, table, slot=slot, plugin=plugin, publication=publication, failover=failover,
            before_create=lambda: refuse_pooler(dsn), writer=writer, primary_dsn=primary_dsn)


def ensure_publication_and_slot(
    conn: psycopg.Connection[Any],
    table: TableRef,
    *,
    slot: str,
    plugin: str,
    publication: str,
    failover: bool = True,
    before_create: Callable[[], None] | None = None,
    writer: psycopg.Connection[Any] | None = None,
    primary_dsn: str | None = None,
) -> ReplicationReport:
    """On an autocommit connection: the publication (pgoutput only), then the slot.

    ``before_create`` runs just before a slot is created (not when it exists): the check
    that this endpoint can stream from it at all (pg/endpoint.py: not a pooler).

    Names must already be validated (``validate_wal_options``, ``validated_table``).
    A slot created here is recorded (wal/slot/continuity.py) and, on PostgreSQL 17+, is a
    failover slot unless ``failover`` is False. A slot the record says existed and that is
    missing or invalidated now raises SlotLost: it is never silently replaced.
    """
    pub = Outcome.SKIPPED
    try:
        partitioned = is_partitioned(conn, _table_identifier(table).as_string(conn))
    except psycopg.Error as exc:
        raise translate_error(exc, f"looking up {table}") from exc
    if plugin == "pgoutput":
        pub = _publication_in_place(writer or conn, publication, table, partitioned)
    try:
        slot_outcome = _ensure_slot(conn, slot, plugin, table, failover, before_create,
                                    writer=writer, primary_dsn=primary_dsn)
    except psycopg.Error as exc:
        raise translate_error(exc, f"checking replication slot {slot!r}") from exc
    return ReplicationReport(pub, slot_outcome, partitioned)


def _table_identifier(table: TableRef) -> sql.Identifier:
    return sql.Identifier(table.schema, table.name)


def _publication_in_place(conn: psycopg.Connection[Any], publication: str, table: TableRef,
                          partitioned: bool) -> Outcome:
    """``_ensure_publication``, on an autocommit connection: first read-only, without a
    transaction or the lock - what every restart finds, a publication already in place,
    costs two queries instead of six (docs/design.md, start-up) - then, only if something
    has to change, again under the advisory lock that init and other relays take.
    """
    try:
        outcome = _ensure_publication(conn, publication, table, partitioned, may_change=False)
        if outcome is not None:
            return outcome
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
            outcome = _ensure_publication(conn, publication, table, partitioned)
    except psycopg.Error as exc:
        raise translate_error(exc, f"creating publication {publication!r}") from exc
    assert outcome is not None
    return outcome


def _ensure_publication(
    conn: psycopg.Connection[Any],
    publication: str,
    table: TableRef,
    partitioned: bool,
    *,
    may_change: bool = True,
) -> Outcome | None:
    """The publication exists, publishes inserts, includes the table, and - for a
    partitioned outbox - publishes via the partition root.

    Rows of a partitioned table are logged under their partition; without
    ``publish_via_partition_root`` pgoutput sends them under the partition's name and
    the decoder (which knows only the outbox's name) would never see an event. With
    ``may_change`` False it only reads: None when something would have to change.
    """
    ident = _table_identifier(table).as_string(conn)
    row = conn.execute(
        "SELECT oid, puballtables, pubinsert, pubviaroot FROM pg_publication WHERE pubname = %s",
        (publication,),
    ).fetchone()
    pub = sql.Identifier(publication)
    if row is None:
        if not may_change:
            return None
        options = "publish = 'insert'" + (", publish_via_partition_root = true" if partitioned else "")
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (" + options + ")").format(
                pub, _table_identifier(table)
            )
        )
        return Outcome.CREATED
    pub_oid, all_tables, publishes_inserts, via_root = row
    if not publishes_inserts:
        raise ConfigError(
            f"publication {publication!r} does not publish inserts: run ALTER PUBLICATION "
            f"{publication} SET (publish = 'insert'), or pass another --publication"
        )
    outcome = Outcome.EXISTED
    if partitioned and not via_root:
        if not may_change:
            return None
        # Only the named parameter changes; the publish list stays as it was.
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(pub)
        )
        outcome = Outcome.UPDATED
    if all_tables or _publication_includes(conn, pub_oid, publication, table, ident):
        return outcome
    if not may_change:
        return None
    conn.execute(
        sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, _table_identifier(table))
    )
    return Outcome.UPDATED


def is_partitioned(conn: psycopg.Connection[Any], table_ident: str) -> bool:
    """True if the (quoted, qualified) table is a partitioned table (relkind 'p')."""
    row = conn.execute(
        "SELECT relkind = 'p' FROM pg_class WHERE oid = %s::regclass", (table_ident,)
    ).fetchone()
    return bool(row and row[0])


def _publication_includes(conn: psycopg.Connection[Any], pub_oid: int, publication: str,
                          table: TableRef, table_ident: str) -> bool:
    # pg_publication_rel: the table itself was added (for a partitioned table without
    # publish_via_partition_root, pg_publication_tables lists only its partitions, and
    # adding it again fails with "already member of publication").
    # pg_publication_tables: it is included some other way (FOR TABLES IN SCHEMA).
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_publication_rel WHERE prpubid = %s"
        " AND prrelid = %s::regclass) OR EXISTS (SELECT 1 FROM pg_publication_tables"
        " WHERE pubname = %s AND schemaname = %s AND tablename = %s)",
        (pub_oid, table_ident, publication, table.schema, table.name),
    ).fetchone()
    return bool(row and row[0])


def _ensure_slot(conn: psycopg.Connection[Any], slot: str, plugin: str, table: TableRef,
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


def ensure_publication(conn: psycopg.Connection[Any], table: TableRef, publication: str) -> Outcome:
    """The pgoutput publication alone, on an autocommit connection (the backfill's start).

    ``run --snapshot initial`` creates the slot itself (with an exported snapshot), and
    pgoutput needs the publication to exist before the slot does.
    """
    table = validated_table(table)
    validate_identifier(publication, "publication name")
    try:
        partitioned = is_partitioned(conn, _table_identifier(table).as_string(conn))
    except psycopg.Error as exc:
        raise translate_error(exc, f"looking up {table}") from exc
    return _publication_in_place(conn, publication, table, partitioned)


_CAPTURE_PUBLISH = "insert, update, delete"


def ensure_capture_publication(conn: psycopg.Connection[Any], publication: str,
                               tables: list[tuple[str, str]], *, truncate: bool = False) -> Outcome:
    """``run --capture`` / ``init --capture``: the publication publishes inserts, updates and
    deletes (and truncates with ``truncate``: ``run --capture-truncate``; one that already
    publishes them keeps doing so) and includes every captured table (created with them if
    missing), on an autocommit connection, under the advisory lock ``init`` takes. Call it
    before the slot is created: pgoutput needs the publication at the slot's start.

    Publishing updates and deletes applies to the whole publication, so the outbox's own
    deletes (a retention job's) arrive too; the decoder ignores them (docs/table-cdc.md).
    """
    validate_identifier(publication, "publication name")
    pub = sql.Identifier(publication)
    idents = [sql.Identifier(schema, table) for schema, table in tables]
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
            row = conn.execute("SELECT oid, puballtables, pubinsert AND pubupdate AND pubdelete,"
                               " pubtruncate FROM pg_publication WHERE pubname = %s",
                               (publication,)).fetchone()
            publish = _CAPTURE_PUBLISH + (", truncate" if truncate or (row and row[3]) else "")
            if row is None:
                conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = '"
                                     + publish + "')").format(pub, sql.SQL(", ").join(idents)))
                return Outcome.CREATED
            outcome = Outcome.EXISTED
            if not row[2] or (truncate and not row[3]):
                conn.execute(sql.SQL("ALTER PUBLICATION {} SET (publish = '" + publish
                                     + "')").format(pub))
                outcome = Outcome.UPDATED
            for (schema, table), ident in zip(tables, idents, strict=True):
                if row[1] or _publication_includes(conn, row[0], publication,
                                                   TableRef(schema, table), ident.as_string(conn)):
                    continue
                conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, ident))
                outcome = Outcome.UPDATED
            return outcome
    except psycopg.Error as exc:
        raise translate_error(exc, f"adding the captured tables to publication {publication!r}") from exc


def ensure_slot(conn: psycopg.Connection[Any], slot: str, plugin: str, records: TableRef,
                failover: bool = True, *, writer: psycopg.Connection[Any] | None = None,
                primary_dsn: str | None = None) -> Outcome:
    """The slot alone (``run --capture --no-outbox``: no outbox table to check); its record
    goes to ``records``' schema, naming that table (on ``writer``, the primary at
    ``primary_dsn``, when decoding on a standby)."""
    validate_wal_options(slot, plugin, "cdc_relay_outbox")
    try:
        return _ensure_slot(conn, slot, plugin, records, failover, writer=writer,
                            primary_dsn=primary_dsn)
    except psycopg.Error as exc:
        raise translate_error(exc, f"checking replication slot {slot!r}") from exc

"""``cdc-relay init``: apply the sql/ migrations, then the WAL-mode publication and slot.

Owns the database objects the relay needs (SPEC §3): the outbox table, its indexes, the
dead-letter view, the NOTIFY trigger, ``processed_events``, the migration bookkeeping
table, the pgoutput publication and the logical replication slot; plus the small slot
helpers other commands reuse (``slot_info``, ``slot_exists``, ``drop_slot``).

How: the numbered templates in ``sql/`` (package ``cdc_relay.sql``) are filled only with
``psycopg.sql.Identifier`` names and applied in one transaction under a transaction-level
advisory lock, each once per outbox table (``cdc_relay_schema_migrations``), so two
concurrent ``init`` runs are safe and a second run changes nothing. The slot is created
afterwards, outside that transaction: PostgreSQL refuses to create a logical slot in a
transaction that has written anything.

Must not: interpolate user text into SQL, change server settings (it only says which
to change), or read or write outbox rows.
"""

from __future__ import annotations

import enum
import functools
import importlib.resources
import re
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
    derived_name,
    describe_dsn,
    translate_error,
    validated_columns,
    validated_table,
)
from cdc_relay.errors import ConfigError, DatabaseError, SlotBusy, mask_secrets
from cdc_relay.model import Lsn

PLUGINS = ("wal2json", "pgoutput")
MIGRATIONS_TABLE = "cdc_relay_schema_migrations"
PROCESSED_EVENTS_TABLE = "processed_events"
NOTIFY_FUNCTION = "cdc_relay_notify"
NOTIFY_TRIGGER = "cdc_relay_notify"  # trigger names are per table: no need to derive
# One lock for every init in a database ("cdc_rela" in ASCII): DDL is rare, serialising
# it is cheaper than reasoning about concurrent CREATE ... IF NOT EXISTS races.
ADVISORY_LOCK_KEY = 0x6364635F72656C61
# Waiting for the outbox's ACCESS EXCLUSIVE lock (ALTER TABLE) queues every insert
# behind us; give up instead of stalling the application behind a long transaction.
LOCK_TIMEOUT = "30s"

_MIGRATION_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


class Outcome(enum.Enum):
    """What init did to one object."""

    CREATED = "created"
    EXISTED = "existed"
    UPDATED = "updated"  # e.g. the outbox table added to an existing publication
    DROPPED = "dropped"  # the NOTIFY trigger with notify_trigger=False
    ABSENT = "absent"  # not wanted and not there
    SKIPPED = "skipped"  # not needed in this configuration


_CHANGES = (Outcome.CREATED, Outcome.UPDATED, Outcome.DROPPED)


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered template from sql/."""

    version: int
    name: str
    template: str


@dataclass(frozen=True, slots=True)
class InitReport:
    """What one ``init_database`` run found and changed."""

    table: TableRef
    migrations_applied: tuple[int, ...]
    schema_version: int
    trigger: Outcome
    publication: Outcome
    slot: Outcome
    slot_name: str | None = None
    publication_name: str | None = None
    plugin: str | None = None

    @property
    def changed(self) -> bool:
        """False when the run was a no-op (everything already in place)."""
        return bool(self.migrations_applied) or any(
            outcome in _CHANGES for outcome in (self.trigger, self.publication, self.slot)
        )

    def lines(self) -> list[str]:
        """Human-readable summary, one line per object (for the CLI)."""
        if self.migrations_applied:
            applied = ", ".join(f"{v:04d}" for v in self.migrations_applied)
            schema = f"applied migrations {applied} (schema version {self.schema_version})"
        else:
            schema = f"schema up to date (version {self.schema_version})"
        lines = [f"outbox {self.table}: {schema}", f"notify trigger: {self.trigger.value}"]
        if self.publication is not Outcome.SKIPPED:
            lines.append(f"publication {self.publication_name}: {self.publication.value}")
        if self.slot is Outcome.SKIPPED:
            lines.append("replication slot: skipped (no slot requested)")
        else:
            lines.append(f"replication slot {self.slot_name} ({self.plugin}): {self.slot.value}")
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())


@dataclass(frozen=True, slots=True)
class ReplicationReport:
    """What ``ensure_replication`` found and changed."""

    publication: Outcome
    slot: Outcome

    @property
    def changed(self) -> bool:
        """False when publication and slot were already in place."""
        return self.publication in _CHANGES or self.slot in _CHANGES


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


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """The numbered templates of ``cdc_relay.sql``, in version order."""
    found: dict[int, Migration] = {}
    for entry in importlib.resources.files("cdc_relay.sql").iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match is None:
            continue
        version = int(match.group(1))
        if version in found:
            raise RuntimeError(f"two migrations with version {version}: {entry.name}")
        found[version] = Migration(version, entry.name, entry.read_text(encoding="utf-8"))
    return tuple(found[v] for v in sorted(found))


@functools.cache
def _support_template(name: str) -> str:
    return importlib.resources.files("cdc_relay.sql").joinpath(name).read_text(encoding="utf-8")


def template_names(outbox: OutboxConfig) -> dict[str, sql.Composable]:
    """The placeholder values of the sql/ templates: quoted identifiers only.

    Validates every name first, so an invalid one is a ConfigError before any I/O.
    """
    table = validated_table(outbox.table)
    cols = validated_columns(outbox.columns)
    schema = table.schema
    return {
        "schema": sql.Identifier(schema),
        "table": sql.Identifier(schema, table.name),
        "col_id": sql.Identifier(cols.id),
        "col_aggregate_type": sql.Identifier(cols.aggregate_type),
        "col_aggregate_id": sql.Identifier(cols.aggregate_id),
        "col_event_type": sql.Identifier(cols.event_type),
        "col_payload": sql.Identifier(cols.payload),
        "col_created_at": sql.Identifier(cols.created_at),
        "pending_index": sql.Identifier(derived_name(table.name, "_pending_idx")),
        "dead_letter_index": sql.Identifier(derived_name(table.name, "_dead_idx")),
        "dead_letter_view": sql.Identifier(schema, dead_letter_view_name(table)),
        "notify_function": sql.Identifier(schema, NOTIFY_FUNCTION),
        "processed_events": sql.Identifier(schema, PROCESSED_EVENTS_TABLE),
        "migrations": sql.Identifier(schema, MIGRATIONS_TABLE),
    }


def dead_letter_view_name(table: TableRef) -> str:
    """The name (in the table's schema) of the table's dead-letter view."""
    return derived_name(table.name, "_dead_letters")


def render(template: str, names: dict[str, sql.Composable]) -> sql.Composed:
    """Fill a sql/ template's ``{placeholders}``; an unknown one is a KeyError."""
    return sql.SQL(template).format(**names)


def _validate_wal_options(slot: str | None, plugin: str, publication: str) -> None:
    if slot is not None:
        validate_slot_name(slot)
    if plugin not in PLUGINS:
        raise ConfigError(f"unknown plugin {plugin!r}: use wal2json or pgoutput")
    validate_identifier(publication, "publication name")


def init_database(
    dsn: str,
    outbox: OutboxConfig,
    *,
    slot: str | None,
    plugin: str = "wal2json",
    publication: str = "cdc_relay_outbox",
    notify_trigger: bool = True,
) -> InitReport:
    """Apply pending migrations; for WAL mode create the publication and the slot.

    Idempotent: a second run changes nothing and its report says so (``changed``).
    ``slot=None`` skips the slot and the publication (polling-only users). The
    publication is only needed, and only created, for ``plugin="pgoutput"``.
    ``notify_trigger=False`` makes sure the NOTIFY trigger is absent (WAL mode does not
    need it). Creating a slot waits for transactions already running in the database.
    Raises ConfigError for invalid names (before connecting), ServiceUnavailable /
    DatabaseError for PostgreSQL trouble, with the fix in the message.
    """
    names = template_names(outbox)
    _validate_wal_options(slot, plugin, publication)
    table = validated_table(outbox.table)
    with connect(dsn, autocommit=True) as conn:
        try:
            applied, version, trigger = _apply_schema(
                conn, outbox, names, notify_trigger=notify_trigger
            )
        except psycopg.Error as exc:
            raise translate_error(exc, f"initialising {table}") from exc
        replication = ReplicationReport(Outcome.SKIPPED, Outcome.SKIPPED)
        if slot is not None:
            replication = _ensure_replication(conn, table, names, slot, plugin, publication)
    return InitReport(
        table=table,
        migrations_applied=applied,
        schema_version=version,
        trigger=trigger,
        publication=replication.publication,
        slot=replication.slot,
        slot_name=slot,
        publication_name=publication if replication.publication is not Outcome.SKIPPED else None,
        plugin=plugin if slot is not None else None,
    )


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
    names = template_names(outbox)
    _validate_wal_options(slot, plugin, publication)
    table = validated_table(outbox.table)
    with connect(dsn, autocommit=True) as conn:
        try:
            row = conn.execute(
                "SELECT to_regclass(%s)", (names["table"].as_string(conn),)
            ).fetchone()
        except psycopg.Error as exc:
            raise translate_error(exc, f"looking up {table}") from exc
        if row is None or row[0] is None:
            raise ConfigError(
                f"outbox table {table} does not exist in {describe_dsn(dsn)}: run "
                "`cdc-relay init` first, or pass the right --table / --dsn"
            )
        return _ensure_replication(conn, table, names, slot, plugin, publication)


def _ensure_replication(
    conn: psycopg.Connection[Any],
    table: TableRef,
    names: dict[str, sql.Composable],
    slot: str,
    plugin: str,
    publication: str,
) -> ReplicationReport:
    pub = Outcome.SKIPPED
    if plugin == "pgoutput":
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
                pub = _ensure_publication(conn, publication, table, names)
        except psycopg.Error as exc:
            raise translate_error(exc, f"creating publication {publication!r}") from exc
    try:
        slot_outcome = _ensure_slot(conn, slot, plugin)
    except psycopg.Error as exc:
        raise translate_error(exc, f"checking replication slot {slot!r}") from exc
    return ReplicationReport(pub, slot_outcome)


def _apply_schema(
    conn: psycopg.Connection[Any],
    outbox: OutboxConfig,
    names: dict[str, sql.Composable],
    *,
    notify_trigger: bool,
) -> tuple[tuple[int, ...], int, Outcome]:
    table = str(outbox.table)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
        conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
        _ensure_schema(conn, outbox.table.schema)
        conn.execute(render(_support_template("schema_migrations.sql"), names))
        rows = conn.execute(
            sql.SQL("SELECT version FROM {} WHERE table_name = %s").format(names["migrations"]),
            (table,),
        ).fetchall()
        done = {row[0] for row in rows}
        applied: list[int] = []
        for migration in migrations():
            if migration.version in done:
                continue
            conn.execute(render(migration.template, names))
            conn.execute(
                sql.SQL("INSERT INTO {} (table_name, version) VALUES (%s, %s)").format(
                    names["migrations"]
                ),
                (table, migration.version),
            )
            applied.append(migration.version)
        _check_columns(conn, outbox)
        trigger = _ensure_trigger(conn, outbox, names, wanted=notify_trigger)
    version = max(done | set(applied), default=0)
    return tuple(applied), version, trigger


def _ensure_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    # Checked first: CREATE SCHEMA IF NOT EXISTS demands CREATE on the database even
    # when the schema exists, which a least-privilege role may lack.
    found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    if found is None:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))


def _check_columns(conn: psycopg.Connection[Any], outbox: OutboxConfig) -> None:
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
        "AND attnum > 0 AND NOT attisdropped",
        (sql.Identifier(outbox.table.schema, outbox.table.name).as_string(conn),),
    ).fetchall()
    present = {row[0] for row in rows}
    for role in type(outbox.columns).__dataclass_fields__:
        column = getattr(outbox.columns, role)
        if column not in present:
            raise ConfigError(
                f"table {outbox.table} has no column {column!r} (for {role}): map the "
                "columns to the existing table, e.g. --columns debezium or "
                f"--columns {role}=<column>"
            )


def _ensure_trigger(
    conn: psycopg.Connection[Any],
    outbox: OutboxConfig,
    names: dict[str, sql.Composable],
    *,
    wanted: bool,
) -> Outcome:
    exists = conn.execute(
        "SELECT 1 FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname = %s "
        "AND NOT tgisinternal",
        (names["table"].as_string(conn), NOTIFY_TRIGGER),
    ).fetchone() is not None
    if wanted and not exists:
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER {trigger} AFTER INSERT ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION {function}({channel})"
            ).format(
                trigger=sql.Identifier(NOTIFY_TRIGGER),
                table=names["table"],
                function=names["notify_function"],
                channel=sql.Literal(outbox.notify_channel),
            )
        )
        return Outcome.CREATED
    if not wanted and exists:
        conn.execute(
            sql.SQL("DROP TRIGGER {} ON {}").format(
                sql.Identifier(NOTIFY_TRIGGER), names["table"]
            )
        )
        return Outcome.DROPPED
    return Outcome.EXISTED if exists else Outcome.ABSENT


def _ensure_publication(
    conn: psycopg.Connection[Any],
    publication: str,
    table: TableRef,
    names: dict[str, sql.Composable],
) -> Outcome:
    row = conn.execute(
        "SELECT puballtables, pubinsert FROM pg_publication WHERE pubname = %s",
        (publication,),
    ).fetchone()
    pub = sql.Identifier(publication)
    if row is None:
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert')").format(
                pub, names["table"]
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
    conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, names["table"]))
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
    if info is None:  # created and dropped again between two statements: give up
        raise DatabaseError(f"replication slot {slot!r} vanished while init was creating it")
    _check_slot_matches(conn, info, plugin)
    return Outcome.EXISTED


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

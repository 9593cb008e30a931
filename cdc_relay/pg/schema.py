"""The outbox's own database objects: the sql/ migrations and the NOTIFY trigger.

Owns the outbox table, its indexes, the dead-letter view, the NOTIFY trigger,
``processed_events`` and the migration bookkeeping table (docs/design.md, the outbox
table): the numbered templates in ``sql/`` (package ``cdc_relay.sql``), filled only with
``psycopg.sql.Identifier`` names and applied in one transaction under a
transaction-level advisory lock (``ADVISORY_LOCK_KEY``, which WAL mode's set-up takes
too), each once per outbox table (``cdc_relay_schema_migrations``), so two concurrent
runs are safe and a second run changes nothing. Also the vocabulary init and the
start-up checks report in (``Outcome``).

Used by ``cdc-relay init`` (app/init.py, which adds what the relay mode uses) and by the
application side (integrations/: the Django migration runs ``apply_migrations``, the
SQLAlchemy and Django helpers name ``processed_events``).

Must not: interpolate user text into SQL, create publications or slots (wal/slot/),
or read or write outbox rows.
"""

from __future__ import annotations

import enum
import functools
import importlib.resources
import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from cdc_relay.config import OutboxConfig, TableRef
from cdc_relay.errors import ConfigError
from cdc_relay.model import NOTIFY_TRIGGER
from cdc_relay.pg.db import derived_name, validated_columns, validated_table

# One lock for every init in a database ("cdc_rela" in ASCII): DDL is rare, serialising
# it is cheaper than reasoning about concurrent CREATE ... IF NOT EXISTS races.
ADVISORY_LOCK_KEY = 0x6364635F72656C61
MIGRATIONS_TABLE = "cdc_relay_schema_migrations"
PROCESSED_EVENTS_TABLE = "processed_events"
NOTIFY_FUNCTION = "cdc_relay_notify"
# Waiting for the outbox's ACCESS EXCLUSIVE lock (ALTER TABLE) queues every insert
# behind us; give up instead of stalling the application behind a long transaction.
LOCK_TIMEOUT = "30s"

_MIGRATION_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
# Migrations applied only when init is asked for the feature (then recorded as usual, so
# asking again changes nothing): version -> init_database keyword.
OPTIONAL_MIGRATIONS = {5: "trace_context"}


class Outcome(enum.Enum):
    """What init (or the start-up check) did to one object."""

    CREATED = "created"
    EXISTED = "existed"
    UPDATED = "updated"  # e.g. the outbox table added to an existing publication, or
    # an existing publication set to publish a partitioned outbox via its root
    DROPPED = "dropped"  # the NOTIFY trigger with notify_trigger=False
    ABSENT = "absent"  # not wanted and not there
    SKIPPED = "skipped"  # not needed in this configuration

    @property
    def changed(self) -> bool:
        """True if the run changed the object (created, updated or dropped it)."""
        return self in (Outcome.CREATED, Outcome.UPDATED, Outcome.DROPPED)


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered template from sql/."""

    version: int
    name: str
    template: str


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


def apply_schema(
    conn: psycopg.Connection[Any],
    outbox: OutboxConfig,
    names: dict[str, sql.Composable],
    *,
    notify_trigger: bool,
    features: frozenset[str] = frozenset(),
) -> tuple[tuple[int, ...], int, Outcome]:
    """The pending migrations, then the NOTIFY trigger as ``notify_trigger`` wants it, in one
    transaction: (versions applied, schema version, what happened to the trigger)."""
    with conn.transaction():
        applied, version = _apply_migrations(conn, outbox, names, features)
        trigger = _ensure_trigger(conn, outbox, names, wanted=notify_trigger)
    return applied, version, trigger


def apply_migrations(conn: psycopg.Connection[Any], outbox: OutboxConfig, *,
                     trace_context: bool = False) -> tuple[int, ...]:
    """Apply the pending sql/ migrations of ``outbox`` on ``conn``; return their versions.

    What ``init`` does before the mode's objects (trigger, slot, publication), in a
    transaction of its own or as a savepoint of the caller's: the Django app's migration
    runs it on Django's connection, so its tables are exactly init's (and a later
    ``init`` finds them recorded).
    """
    names = template_names(outbox)
    features = frozenset({"trace_context"} if trace_context else ())
    with conn.transaction():
        applied, _ = _apply_migrations(conn, outbox, names, features)
    return applied


def _apply_migrations(conn: psycopg.Connection[Any], outbox: OutboxConfig,
                      names: dict[str, sql.Composable], features: frozenset[str],
                      ) -> tuple[tuple[int, ...], int]:
    table = str(outbox.table)
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
        feature = OPTIONAL_MIGRATIONS.get(migration.version)
        if feature is not None and feature not in features:
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
    return tuple(applied), max(done | set(applied), default=0)


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

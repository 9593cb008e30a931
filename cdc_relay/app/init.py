"""``cdc-relay init``: apply the sql/ migrations, then what the chosen relay mode uses.

Owns the outbox's own database objects (docs/design.md, the outbox table): the outbox table, its indexes, the
dead-letter view, the NOTIFY trigger, ``processed_events`` and the migration
bookkeeping table; and ``init_database``, which also asks wal/setup.py for the
pgoutput publication and the logical replication slot (that module owns those, and
the slot helpers other commands reuse).

Each mode installs only what it uses (``mode``): WAL mode gets the slot (and, for
pgoutput, the publication) and no NOTIFY trigger - an existing one is dropped, since it
costs every insert and makes ``PREPARE TRANSACTION`` fail; polling mode gets the trigger
and no slot - an existing inactive logical slot is reported (``idle_slots``), never
dropped: dropping loses a position someone may still need.

How: the numbered templates in ``sql/`` (package ``cdc_relay.sql``) are filled only with
``psycopg.sql.Identifier`` names and applied in one transaction under a transaction-level
advisory lock, each once per outbox table (``cdc_relay_schema_migrations``), so two
concurrent ``init`` runs are safe and a second run changes nothing. The slot is created
afterwards, outside that transaction: PostgreSQL refuses to create a logical slot in a
transaction that has written anything.

Must not: interpolate user text into SQL, change server settings (it only says which
to change), create or drop publications and slots itself, or read or write outbox rows.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from cdc_relay.config import OutboxConfig, TableRef
from cdc_relay.errors import ConfigError, RelayError
from cdc_relay.model import NOTIFY_TRIGGER, SlotStatus, human_bytes
from cdc_relay.pg.db import (
    connect,
    derived_name,
    translate_error,
    validated_columns,
    validated_table,
)
from cdc_relay.pg.slots import idle_logical_slots
from cdc_relay.wal.setup import (
    ADVISORY_LOCK_KEY,
    DEFAULT_PLUGIN,
    Outcome,
    ReplicationReport,
    ensure_publication_and_slot,
    plugin_for_slot,
    validate_wal_options,
)

MODES = ("wal", "poll")
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
    mode: str = "wal"
    idle_slots: tuple[SlotStatus, ...] = ()
    plugin_note: str | None = None  # why an existing slot's plugin was used

    @property
    def changed(self) -> bool:
        """False when the run was a no-op (everything already in place)."""
        return bool(self.migrations_applied) or any(
            outcome.changed for outcome in (self.trigger, self.publication, self.slot)
        )

    def lines(self) -> list[str]:
        """Human-readable summary, one line per object (for the CLI)."""
        if self.migrations_applied:
            applied = ", ".join(f"{v:04d}" for v in self.migrations_applied)
            schema = f"applied migrations {applied} (schema version {self.schema_version})"
        else:
            schema = f"schema up to date (version {self.schema_version})"
        lines = [f"outbox {self.table}: {schema}", f"mode: {self.mode}",
                 f"notify trigger: {self.trigger.value}"
                 + _TRIGGER_NOTES.get((self.mode, self.trigger), "")]
        if self.publication is not Outcome.SKIPPED:
            lines.append(f"publication {self.publication_name}: {self.publication.value}")
        if self.slot is Outcome.SKIPPED:
            lines.append("replication slot: none (polling mode does not use one)")
        else:
            lines.append(f"replication slot {self.slot_name} ({self.plugin}): {self.slot.value}")
        if self.plugin_note:
            lines.append(self.plugin_note)
        lines += [idle_slot_warning(slot) for slot in self.idle_slots]
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())


_TRIGGER_NOTES: dict[tuple[str, Outcome], str] = {
    ("wal", Outcome.DROPPED): " (WAL mode does not use it; it slowed every insert and made "
                              "PREPARE TRANSACTION fail. Pollers of this table: init --mode poll)",
    ("wal", Outcome.ABSENT): " (WAL mode does not use it)",
}


def idle_slot_warning(slot: SlotStatus) -> str:
    """The warning line for an inactive logical slot that polling mode leaves unread."""
    retained = "an unknown amount of" if slot.retained_bytes is None else human_bytes(
        slot.retained_bytes)
    return (f"warning: replication slot {slot.name} ({slot.plugin}) is inactive and retains "
            f"{retained} WAL, more with every write until the disk is full: polling mode does "
            f"not read it. Drop it (cdc-relay slot drop --slot {slot.name}) unless a WAL-mode "
            "relay will use it")


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


def init_database(
    dsn: str,
    outbox: OutboxConfig,
    *,
    slot: str | None,
    plugin: str | None = None,
    publication: str = "cdc_relay_outbox",
    notify_trigger: bool | None = None,
    mode: str | None = None,
    trace_context: bool = False,
    failover: bool = True,
) -> InitReport:
    """Apply pending migrations, then install what ``mode`` uses (see the module docstring).

    ``plugin`` None: an existing slot's plugin, else pgoutput (``plugin_for_slot``).
    When the slot cannot be made (e.g. the server does not allow the plugin), the error
    says that the schema was applied and what was not.
    ``mode`` is ``"wal"`` (the slot named ``slot`` and, for pgoutput, the publication;
    no NOTIFY trigger) or ``"poll"`` (the trigger; no slot, no publication); by default
    ``"poll"`` when ``slot`` is None, else ``"wal"``. ``notify_trigger`` overrides the
    mode's choice of trigger. ``trace_context=True`` also applies the optional migration
    0005 (the ``traceparent`` / ``tracestate`` columns); without it that migration stays
    pending and is not reported. Idempotent: a second run changes nothing and its report
    says so (``changed``). Creating a slot waits for transactions already running in
    the database. Raises ConfigError for invalid names or options (before connecting),
    ServiceUnavailable / DatabaseError for PostgreSQL trouble, with the fix in the message.
    """
    mode = mode or ("poll" if slot is None else "wal")
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}: use wal or poll")
    if mode == "wal" and slot is None:
        raise ConfigError("WAL mode needs a replication slot name (--slot)")
    names = template_names(outbox)
    validate_wal_options(slot, plugin or DEFAULT_PLUGIN, publication)
    table = validated_table(outbox.table)
    wanted_trigger = (mode == "poll") if notify_trigger is None else notify_trigger
    with connect(dsn, autocommit=True) as conn:
        try:
            features = frozenset({"trace_context"} if trace_context else ())
            applied, version, trigger = _apply_schema(
                conn, outbox, names, notify_trigger=wanted_trigger, features=features
            )
        except psycopg.Error as exc:
            raise translate_error(exc, f"initialising {table}") from exc
        replication = ReplicationReport(Outcome.SKIPPED, Outcome.SKIPPED)
        idle: tuple[SlotStatus, ...] = ()
        note = None
        if mode == "wal" and slot is not None:
            if plugin is None:
                plugin, note = plugin_for_slot(conn, slot)
            replication = _replication_or_partial(conn, table, slot, plugin, publication,
                                                  applied, version, failover=failover)
        else:
            slot = None
            idle = tuple(idle_logical_slots(conn))
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
        mode=mode,
        idle_slots=idle,
        plugin_note=note,
    )


def _replication_or_partial(conn: psycopg.Connection[Any], table: TableRef, slot: str,
                            plugin: str, publication: str, applied: tuple[int, ...],
                            version: int, *, failover: bool = True) -> ReplicationReport:
    """The publication and slot; if the server refuses them, an error of the same kind
    that also says what this run did apply (the schema) and what it did not."""
    try:
        return ensure_publication_and_slot(conn, table, slot=slot, plugin=plugin,
                                           publication=publication, failover=failover)
    except RelayError as exc:
        done = (f"applied migrations {', '.join(f'{v:04d}' for v in applied)}" if applied
                else "schema already up to date")
        partial = _same_kind(exc, f"init applied the outbox schema to {table} ({done}, version "
                            f"{version}) but NOT WAL mode's replication slot {slot!r} "
                            f"({plugin}): {exc}")
        raise partial from exc


def _same_kind(exc: RelayError, message: str) -> RelayError:
    """A RelayError with ``message`` and the exit code of ``exc`` (its class if it can)."""
    try:
        return type(exc)(message)
    except TypeError:
        other = RelayError(message)
        other.exit_code = exc.exit_code
        return other


def _apply_schema(
    conn: psycopg.Connection[Any],
    outbox: OutboxConfig,
    names: dict[str, sql.Composable],
    *,
    notify_trigger: bool,
    features: frozenset[str] = frozenset(),
) -> tuple[tuple[int, ...], int, Outcome]:
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

"""WAL mode's database objects at start-up and ``init``: the publication, then the slot.

Owns the sequence: validating the names before any I/O, checking the outbox table exists,
the pgoutput publication (wal/slot/publication.py), then the logical replication slot
(wal/slot/lifecycle.py) - ``ensure_replication`` at relay start-up,
``ensure_publication_and_slot`` for ``cdc-relay init`` in app/init.py, ``ensure_slot``
alone for ``run --capture --no-outbox`` - and which plugin to use when none was given
(an existing slot's). The advisory lock every ``init`` and start-up check takes
(``ADVISORY_LOCK_KEY``) and the vocabulary they report in (``Outcome``) are pg/schema.py's.

Decoding on a standby (``primary_dsn``; docs/design.md, continuity; PostgreSQL 16+): the
slot is created on the standby (never a failover slot: PostgreSQL refuses that there),
while the publication and the slot's record are written on the primary.

Must not: apply migrations or touch the outbox table (pg/schema.py does), interpolate user
text into SQL, change server settings (it only says which to change), drop a slot
anyone streams from, or read or write outbox rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc_relay.config import OutboxConfig, TableRef, validate_identifier, validate_slot_name
from cdc_relay.errors import ConfigError
from cdc_relay.pg.db import (
    borrowed_or_new,
    describe_dsn,
    translate_error,
    validated_columns,
    validated_table,
)
from cdc_relay.pg.endpoint import refuse_pooler
from cdc_relay.pg.schema import Outcome
from cdc_relay.pg.slots import slot_status
from cdc_relay.wal.slot.lifecycle import create_or_check_slot

# Re-exported: the table-CDC roots import it from here.
from cdc_relay.wal.slot.publication import ensure_capture_publication as ensure_capture_publication
from cdc_relay.wal.slot.publication import is_partitioned, publication_in_place, table_identifier

PLUGINS = ("wal2json", "pgoutput")
# pgoutput is built into PostgreSQL (managed services included) and allowed by a stock
# server's output_plugin_libraries; wal2json is an option (docs/wal-mode.md).
DEFAULT_PLUGIN = "pgoutput"


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
                "SELECT to_regclass(%s)", (table_identifier(table).as_string(conn),)
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
        partitioned = is_partitioned(conn, table_identifier(table).as_string(conn))
    except psycopg.Error as exc:
        raise translate_error(exc, f"looking up {table}") from exc
    if plugin == "pgoutput":
        pub = publication_in_place(writer or conn, publication, table, partitioned)
    try:
        slot_outcome = create_or_check_slot(conn, slot, plugin, table, failover, before_create,
                                            writer=writer, primary_dsn=primary_dsn)
    except psycopg.Error as exc:
        raise translate_error(exc, f"checking replication slot {slot!r}") from exc
    return ReplicationReport(pub, slot_outcome, partitioned)

def ensure_slot(conn: psycopg.Connection[Any], slot: str, plugin: str, records: TableRef,
                failover: bool = True, *, writer: psycopg.Connection[Any] | None = None,
                primary_dsn: str | None = None) -> Outcome:
    """The slot alone (``run --capture --no-outbox``: no outbox table to check); its record
    goes to ``records``' schema, naming that table (on ``writer``, the primary at
    ``primary_dsn``, when decoding on a standby)."""
    validate_wal_options(slot, plugin, "cdc_relay_outbox")
    try:
        return create_or_check_slot(conn, slot, plugin, records, failover, writer=writer,
                                    primary_dsn=primary_dsn)
    except psycopg.Error as exc:
        raise translate_error(exc, f"checking replication slot {slot!r}") from exc

"""``cdc-relay init``: apply the sql/ migrations, then what the chosen relay mode uses.

The root of ``init`` (``init_database``): the outbox's own database objects come from
pg/schema.py (the migrations, the NOTIFY trigger), the pgoutput publication and the
logical replication slot from wal/slot/setup.py; with ``--capture`` the captured tables
join the publication first (their truncates too with ``--capture-truncate``) and their
problems are reported (app/capture.py); ``--capture --no-outbox`` installs only that and
the slot, no outbox schema.

Each mode installs only what it uses (``mode``): WAL mode gets the slot (and, for
pgoutput, the publication) and no NOTIFY trigger - an existing one is dropped, since it
costs every insert and makes ``PREPARE TRANSACTION`` fail; polling mode gets the trigger
and no slot - an existing inactive logical slot is reported (``idle_slots``), never
dropped: dropping loses a position someone may still need.

How: the migrations are applied in one transaction under an advisory lock, so two
concurrent ``init`` runs are safe and a second run changes nothing (pg/schema.py). The
slot is created afterwards, outside that transaction: PostgreSQL refuses to create a logical slot in a
transaction that has written anything.

Must not: interpolate user text into SQL, change server settings (it only says which
to change), create or drop publications and slots itself, or read or write outbox rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from cdc_relay.app.capture import CaptureSetup, prepare_capture
from cdc_relay.config import OutboxConfig, TableRef
from cdc_relay.errors import ConfigError, RelayError
from cdc_relay.model import SlotStatus, human_bytes
from cdc_relay.pg.db import (
    connect,
    translate_error,
    validated_table,
)
from cdc_relay.pg.endpoint import INIT_STANDBY_ALTERNATIVE, refuse_pooler, require_writable
from cdc_relay.pg.schema import Outcome, apply_schema, template_names
from cdc_relay.pg.slots import idle_logical_slots
from cdc_relay.wal.incremental.state import signal_ref
from cdc_relay.wal.slot.setup import (
    DEFAULT_PLUGIN,
    ReplicationReport,
    ensure_publication_and_slot,
    ensure_slot,
    plugin_for_slot,
    validate_wal_options,
)

MODES = ("wal", "poll")

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
    captured: tuple[str, ...] = ()  # init --capture: the tables added to the publication
    capture_problems: tuple[str, ...] = ()  # their replica identity / SELECT problems
    outbox: bool = True  # False: init --capture --no-outbox installed no outbox schema
    truncates: bool = False  # the publication publishes truncates (init --capture-truncate)

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
        if not self.outbox:
            lines = [f"outbox: none (--no-outbox: no outbox schema in {self.table.schema}, only "
                     "what the captured tables need)", f"mode: {self.mode}"]
        if self.publication is not Outcome.SKIPPED:
            lines.append(f"publication {self.publication_name}: {self.publication.value}")
        if self.slot is Outcome.SKIPPED:
            lines.append("replication slot: none (polling mode does not use one)")
        else:
            lines.append(f"replication slot {self.slot_name} ({self.plugin}): {self.slot.value}")
        if self.plugin_note:
            lines.append(self.plugin_note)
        if self.captured:
            published = "inserts, updates, deletes and truncates" if self.truncates \
                else "inserts, updates and deletes"
            how = ("named in the slot's add-tables when the relay streams" if self.plugin ==
                   "wal2json" else f"{published} published")
            lines.append(f"captured tables ({len(self.captured)}, {how}): "
                         f"{', '.join(self.captured)}")
        lines += [f"warning: {problem}" for problem in self.capture_problems]
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
    capture: str | None = None,
    no_outbox: bool = False,
    capture_truncate: bool = False,
    signal_table: str | None = None,
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
    pending and is not reported. ``capture`` (``--capture``'s tables, WAL mode with
    pgoutput): the tables are added to the publication, which then publishes updates and
    deletes, before the slot is made; their replica identity and SELECT problems are
    reported (app/capture.py); with ``capture_truncate`` the publication publishes their
    truncates too; ``signal_table`` (``--signal-table``, with ``capture`` and pgoutput): the
    incremental snapshots' signal table to create, by default ``cdc_relay_signal`` in the
    outbox table's schema. ``no_outbox`` (with ``capture``): no outbox schema, only the publication
    of the captured tables and the slot (its record in ``outbox.table``'s schema).
    Idempotent: a second run changes nothing and its report
    says so (``changed``). Creating a slot waits for transactions already running in
    the database. Raises ConfigError for invalid names or options (before connecting),
    ServiceUnavailable / DatabaseError for PostgreSQL trouble, with the fix in the message.
    """
    mode = mode or ("poll" if slot is None else "wal")
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}: use wal or poll")
    if mode == "wal" and slot is None:
        raise ConfigError("WAL mode needs a replication slot name (--slot)")
    if capture is not None and mode != "wal":
        raise ConfigError("--capture needs WAL mode (init --mode wal): table CDC reads the slot")
    if capture is None and (no_outbox or capture_truncate or signal_table):
        raise ConfigError("--no-outbox, --capture-truncate and --signal-table need --capture "
                          "TABLE[,TABLE...]")
    names = template_names(outbox)
    validate_wal_options(slot, plugin or DEFAULT_PLUGIN, publication)
    table = validated_table(outbox.table)
    signal = signal_ref(signal_table, table)
    wanted_trigger = (mode == "poll") if notify_trigger is None else notify_trigger
    if mode == "wal":
        refuse_pooler(dsn)  # before anything is made through an endpoint that cannot stream
    with connect(dsn, autocommit=True) as conn:
        require_writable(conn, dsn, "init", standby_alternative=INIT_STANDBY_ALTERNATIVE)
        if no_outbox:
            assert slot is not None and capture is not None
            return _capture_only(conn, table, slot, plugin, publication, capture, signal,
                                 truncate=capture_truncate, failover=failover)
        try:
            features = frozenset({"trace_context"} if trace_context else ())
            applied, version, trigger = apply_schema(
                conn, outbox, names, notify_trigger=wanted_trigger, features=features
            )
        except psycopg.Error as exc:
            raise translate_error(exc, f"initialising {table}") from exc
        replication = ReplicationReport(Outcome.SKIPPED, Outcome.SKIPPED)
        idle: tuple[SlotStatus, ...] = ()
        note = None
        captured = CaptureSetup({})
        if mode == "wal" and slot is not None:
            if plugin is None:
                plugin, note = plugin_for_slot(conn, slot)
            if capture is not None:  # before the slot: pgoutput needs the publication then
                captured = prepare_capture(conn, capture, publication, plugin,
                                           truncate=capture_truncate,
                                           signal=signal, outbox=table)
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
        captured=tuple(f"{schema}.{table}" for schema, table in sorted(captured.shapes)),
        capture_problems=captured.problems,
        truncates=capture_truncate,
    )


def _capture_only(conn: psycopg.Connection[Any], table: TableRef, slot: str, plugin: str | None,
                  publication: str, capture: str, signal: TableRef, *, truncate: bool,
                  failover: bool) -> InitReport:
    """``init --capture --no-outbox``: the captured tables' publication, then the slot (its
    record in ``table``'s schema, as ``run --no-outbox`` keeps it); no outbox schema."""
    note = None
    if plugin is None:
        plugin, note = plugin_for_slot(conn, slot)
    captured = prepare_capture(conn, capture, publication, plugin, truncate=truncate,
                               signal=signal)
    slot_outcome = ensure_slot(conn, slot, plugin, table, failover)
    return InitReport(
        table=table, migrations_applied=(), schema_version=0, trigger=Outcome.SKIPPED,
        publication=captured.publication or Outcome.EXISTED, slot=slot_outcome,
        slot_name=slot, publication_name=publication, plugin=plugin, plugin_note=note,
        captured=tuple(f"{schema}.{name}" for schema, name in sorted(captured.shapes)),
        capture_problems=captured.problems, outbox=False, truncates=truncate)


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

"""What ``cdc-relay status`` and ``slot drop`` know; ``cdc_relay.ops.doctor`` is the third.

Owns the read-only queries an operator runs against a live deployment - the slot's
position and lag (``pg_replication_slots``, ``pg_current_wal_lsn()``, the walsender's
``flush_lag`` in ``pg_stat_replication``), its failover readiness (read by
``cdc_relay.ops.failover.read``) and the outbox backlog - and the report
``status`` prints (table or JSON). The slot queries themselves are the PostgreSQL
edge's (``cdc_relay.pg.slots``: one query, one ``model.SlotStatus`` for every command).
The metrics lag probe reuses ``SlotReader``.

Must not write anything except ``drop_replication_slot``, which the user confirmed, or
hold a connection beyond one command (``SlotReader`` is the probe's own).
``cdc_relay.cli.ops`` only prints what this returns.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import orjson
import psycopg

from cdc_relay.config import OutboxConfig, TableRef, validate_slot_name
from cdc_relay.errors import AccessRefused, ConfigError, RelayError
from cdc_relay.model import (
    Lsn,
    SlotStatus,
    human_bytes,
    idle_timeout_warning,
    invalidation_cause,
    seconds_text,
)
from cdc_relay.ops.failover.facts import HA_DOCS, FailoverStatus
from cdc_relay.ops.failover.read import read_failover
from cdc_relay.pg.db import connect, describe_dsn, translate_error, validated_table
from cdc_relay.pg.slots import read_slot_status
from cdc_relay.polling.admin import count_pending
from cdc_relay.wal.backfill.state import BackfillRecord, backfill_running, read_record
from cdc_relay.wal.incremental.state import read_progress, signal_ref
from cdc_relay.wal.slot.lifecycle import drop_slot


class SlotReader:
    """A reconnecting ordinary connection that reads one slot's status (the metrics probe).

    Failures (server down, timeout) raise RelayError and close the connection; the next
    ``read`` reconnects.
    """

    def __init__(self, dsn: str, slot: str, *, application_name: str = "cdc-relay metrics") -> None:
        self._dsn = dsn
        self._slot = validate_slot_name(slot)
        self._application_name = application_name
        self._conn: psycopg.Connection[Any] | None = None

    def read(self) -> SlotStatus | None:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._dsn, autocommit=True,
                                 application_name=self._application_name, connect_timeout=5)
        try:
            self._conn.execute("SET statement_timeout = '5s'")
            return read_slot_status(self._conn, self._slot)[1]
        except (psycopg.Error, RelayError) as exc:
            self.close()
            if isinstance(exc, RelayError):
                raise
            raise translate_error(exc, "reading the slot's lag") from exc

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None


# ---------------------------------------------------------------- status

@dataclass(frozen=True, slots=True)
class StatusReport:
    """What ``cdc-relay status`` shows."""

    slot_name: str
    current_lsn: Lsn
    slot: SlotStatus | None
    table: TableRef
    pending: int | None  # None: the table has no polling bookkeeping columns
    dead_letters: int | None
    partitions: tuple[str, ...] | None = None  # None: not a partitioned table
    backfill: BackfillRecord | None = None  # run --snapshot initial's record for the slot
    backfill_running: bool = False
    failover: FailoverStatus | None = None  # PostgreSQL 17+ failover slots (ops/failover)
    # run --capture's incremental snapshots of the slot: (schema.table, state, rows acked)
    incremental: tuple[tuple[str, str, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain values (LSNs as text) for JSON."""
        slot: dict[str, Any] | None = None
        if self.slot is not None:
            slot = asdict(self.slot)
            for key in ("confirmed_flush_lsn", "restart_lsn"):
                slot[key] = str(slot[key]) if slot[key] is not None else None
        return {
            "slot_name": self.slot_name,
            "slot_exists": self.slot is not None,
            "slot": slot,
            "current_wal_lsn": str(self.current_lsn),
            "outbox": {"table": str(self.table), "pending": self.pending,
                       "dead_letters": self.dead_letters,
                       "partitioned": self.partitions is not None,
                       "partitions": list(self.partitions) if self.partitions is not None else None},
            "backfill": _backfill_dict(self.backfill, self.backfill_running),
            "failover": self.failover.to_dict() if self.failover is not None else None,
            "incremental_snapshots": [{"table": t, "state": s, "rows_done": n}
                                      for t, s, n in self.incremental],
        }

    def to_json(self) -> str:
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2).decode()

    def lines(self) -> list[str]:
        """Aligned ``key  value`` lines for people."""
        rows = [("slot", self.slot_name)]
        rows += _slot_rows(self.slot) if self.slot else [("  state", "does not exist")]
        rows += _failover_rows(self.failover)
        rows += [
            ("server WAL position", str(self.current_lsn)),
            ("outbox", str(self.table)),
            *_partition_rows(self.partitions),
            ("  pending rows", _count(self.pending) + _pending_meaning(self.slot, self.pending)),
            ("  dead letters", _count(self.dead_letters)),
            *_backfill_rows(self.backfill, self.backfill_running),
            *[("incremental snapshot", f"{t}: {s}, {n} rows acknowledged")
              for t, s, n in self.incremental],
        ]
        width = max(len(key) for key, _ in rows)
        return [f"{key.ljust(width)}  {value}" for key, value in rows]


def _failover_rows(failover: FailoverStatus | None) -> list[tuple[str, str]]:
    """One verdict line, then one line per reason it is not ready."""
    if failover is None:
        return []
    if not failover.available:
        verdict = (f"unavailable: {failover.problems[0]}; a promotion loses the slot and the "
                   f"relay stops with the recovery command ({HA_DOCS})")
        return [("  failover", verdict)]
    flag = {True: "failover = true", False: "failover = false", None: "no slot"}
    if failover.ready is None:
        verdict = f"{flag[failover.slot_failover]}; standby not checked (pass --standby-dsn)"
    elif failover.ready:
        verdict = "ready: the standby holds a synced, persistent copy of the slot"
    else:
        verdict = "NOT ready: a promotion now would lose the slot"
    return [("  failover", verdict), *(("    problem", problem) for problem in failover.problems)]


def _partition_rows(partitions: tuple[str, ...] | None) -> list[tuple[str, str]]:
    if partitions is None:
        return []
    shown = ", ".join(partitions[:6]) + (", ..." if len(partitions) > 6 else "")
    return [("  partitioned", f"{len(partitions)} partitions" + (f" ({shown})" if shown else ""))]


def _backfill_dict(record: BackfillRecord | None, running: bool) -> dict[str, Any] | None:
    if record is None:
        return None
    return {"state": record.state, "running": running, "rows_done": record.rows_done,
            "rows_total": record.rows_total, "attempt": record.attempt,
            "consistent_point": str(record.consistent_point) if record.consistent_point else None,
            "started_at": record.started_at.isoformat(), "updated_at": record.updated_at.isoformat(),
            "finished_at": record.finished_at.isoformat() if record.finished_at else None}


def _backfill_rows(record: BackfillRecord | None, running: bool) -> list[tuple[str, str]]:
    """``run --snapshot initial``'s progress, when the slot has a backfill record."""
    if record is None:
        return []
    total = "?" if record.rows_total is None else str(record.rows_total)
    if record.finished:
        state = f"done at {record.finished_at:%Y-%m-%d %H:%M:%S%z}"
    elif running:
        state = f"running (attempt {record.attempt}, updated {record.updated_at:%H:%M:%S%z})"
    else:
        state = (f"unfinished, not running ({record.state}): the next `run --snapshot initial` "
                 "redoes it")
    return [("backfill", state), ("  rows", f"{record.rows_done} of {total} published"),
            ("  consistent point", str(record.consistent_point or "-"))]


def _pending_meaning(slot: SlotStatus | None, pending: int | None) -> str:
    """What the rows with processed_at NULL are: polling mode's backlog, unless a slot reads
    the table - WAL mode publishes rows without marking them, so there they are no backlog
    (the slot's lag is WAL mode's)."""
    if pending is None:
        return ""
    if slot is None:
        return " (polling mode's backlog)"
    return " (unmarked: WAL mode publishes rows without marking them; no backlog of the slot)"


def _count(value: int | None) -> str:
    return "n/a (no polling columns)" if value is None else str(value)


def _slot_rows(slot: SlotStatus) -> list[tuple[str, str]]:
    state = f"active (pid {slot.active_pid})" if slot.active else "inactive (no client streams it)"
    lag = "unknown" if slot.lag_bytes is None else human_bytes(slot.lag_bytes)
    if slot.lag_seconds is not None:
        lag += f", {slot.lag_seconds:.1f} s"
    retained = "unknown" if slot.retained_bytes is None else human_bytes(slot.retained_bytes)
    safe = "unlimited" if slot.safe_wal_size is None else human_bytes(slot.safe_wal_size)
    rows = [
        ("  plugin", f"{slot.plugin} ({slot.slot_type}, database {slot.database})"),
        ("  state", state),
        ("  confirmed LSN", str(slot.confirmed_flush_lsn)),
        ("  lag", lag),
        ("  WAL retained", f"{retained} since restart LSN {slot.restart_lsn}"),
        ("  wal_status", f"{slot.wal_status} (safe_wal_size {safe})"),
    ]
    if slot.invalidated:
        why, fix = invalidation_cause(slot.invalidation_reason)
        rows.append(("  invalidated", f"{slot.invalidation_reason or 'wal_removed'}: {why}. "
                     "Recover: run the relay once with --on-slot-loss recover "
                     f"(docs/high-availability.md); then {fix}"))
    elif slot.idle_timeout:
        inactive = ("n/a (active)" if slot.active or slot.inactive_seconds is None
                    else seconds_text(slot.inactive_seconds))
        rows.append(("  idle timeout", f"inactive {inactive} of idle_replication_slot_timeout "
                     f"{seconds_text(slot.idle_timeout)}"))
        warning = idle_timeout_warning(slot)
        if warning is not None:
            rows.append(("  WARNING", warning))
    return rows


_PARTITIONS_SQL = """
SELECT n.nspname::text || '.' || c.relname::text
FROM pg_partition_tree(%s) AS t JOIN pg_class AS c ON c.oid = t.relid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE t.isleaf ORDER BY c.relname
"""


def outbox_partitions(conn: psycopg.Connection[Any], table: TableRef) -> tuple[str, ...] | None:
    """The leaf partitions (schema.name) of a partitioned outbox; None if it is not one."""
    try:
        row = conn.execute(
            "SELECT c.oid, c.relkind = 'p' FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (table.schema, table.name)).fetchone()
        if row is None or not row[1]:
            return None
        return tuple(r[0] for r in conn.execute(_PARTITIONS_SQL, (row[0],)).fetchall())
    except psycopg.Error as exc:
        raise translate_error(exc, f"listing the partitions of {table}") from exc


def outbox_counts(conn: psycopg.Connection[Any], dsn: str,
                  outbox: OutboxConfig) -> tuple[int | None, int | None]:
    """(pending rows, dead letters); ConfigError when the table does not exist.

    For a partitioned outbox the counts cover every partition (they query the parent).
    """
    table = validated_table(outbox.table)
    try:
        row = conn.execute(
            "SELECT c.oid, (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid"
            " AND a.attname IN ('processed_at', 'dead_lettered_at') AND NOT a.attisdropped)"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s", (table.schema, table.name)).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, f"looking up {table}") from exc
    if row is None:
        raise ConfigError(f"outbox table {table} does not exist in {describe_dsn(dsn)}: run "
                          "`cdc-relay init` first, or pass the right --table / --dsn")
    if row[1] < 2:
        return None, None
    return count_pending(conn, outbox)


def status(dsn: str, slot: str, outbox: OutboxConfig, *,
           standby_dsn: str | None = None, signal_table: str | None = None) -> StatusReport:
    """Read the slot's position and lag, failover readiness, the outbox backlog and the
    incremental snapshots' progress (in the schema of ``signal_table``, ``--signal-table``;
    by default the outbox table's) - read-only."""
    validate_slot_name(slot)
    validated_table(outbox.table)
    signal = signal_ref(signal_table, outbox.table)
    with connect(dsn, autocommit=True, application_name="cdc-relay status") as conn:
        current, slot_status = read_slot_status(conn, slot)
        pending, dead = outbox_counts(conn, dsn, outbox)
        partitions = outbox_partitions(conn, outbox.table)
        record = read_record(conn, outbox.table, slot)
        running = record is not None and not record.finished and backfill_running(conn, slot)
        failover = read_failover(conn, standby_dsn, slot)
        try:
            incremental = read_progress(conn, signal, slot)
        except AccessRefused:  # a role that may not read the snapshots' progress: not shown
            incremental = []
    return StatusReport(slot, current, slot_status, outbox.table, pending, dead, partitions,
                        record, running, failover, tuple(incremental))


def drop_replication_slot(dsn: str, slot: str) -> None:
    """Drop the slot; RelayError when it does not exist or is in use."""
    if not drop_slot(dsn, slot):
        raise RelayError(f"there is no replication slot {slot!r} on {describe_dsn(dsn)}: "
                         "nothing dropped (`cdc-relay status` shows the slot a --slot names)")


"""Polling mode's SQL text: every statement run against the outbox table, and its rows.

Owns ``OutboxQueries`` - the statements polling mode and the admin commands
(polling/admin.py) run, built once per table from ``psycopg.sql.Identifier`` names, so
configurable column names (``OutboxColumns``) are respected and never interpolated raw -
and the pure reading of the rows they return: ``event_from_row`` and, for strict
per-aggregate order, ``ready_prefix``; ``array_literal`` writes a batch's ids as the one
parameter ``mark_processed`` / ``unmark_processed`` / ``record_failures`` take.

Strict order (``PollingSource.claim`` with ``strict_order=True``):

* candidates are pending rows in ``created_at`` order whose aggregate has no earlier
  pending row that is waiting for a retry (a failed event blocks its aggregate) and is
  not locked by another poller right now (``pg_locks``: a hint, the lock decides);
* each candidate aggregate is locked with a transaction-level advisory lock
  (``pg_try_advisory_xact_lock(hashtext(table), hashtext(aggregate))``); an aggregate
  another poller holds is skipped, so two pollers never interleave one aggregate;
* under the lock, the aggregate's pending rows are read again (fresh snapshot) and only
  the prefix of rows ready to send is claimed, so nothing overtakes a row in backoff;
* those rows are then locked (``lock_rows``), re-checking that each is still pending and
  ready and skipping rows a plain poller holds; an aggregate's rows after one that
  failed this check are not taken (``locked_prefix``), so a poller without
  ``--strict-order`` on the same table cannot make a row go out twice.

Order is ``created_at`` (the inserting transaction's start time), then ``ctid``: the
schema has no insertion sequence, so the events of one transaction are ordered by heap
position - insertion order for freshly appended rows, not a guarantee once free space
is reused. A row that failed sorts first among its transaction's rows.

Rows become OutboxEvents exactly as WAL mode makes them: the payload is the column's
text output (``payload::text``: jsonb's normal form, the bytes WAL mode sends),
``created_at`` is floor epoch milliseconds, ``attempt`` is ``attempts + 1``.

Must not: hold or open a connection, run a statement (polling/claims.py and polling/admin.py do), talk to
the broker, or decide anything about failures.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from cdc_relay.config import OutboxConfig, validate_identifier
from cdc_relay.model import OutboxEvent, carry
from cdc_relay.pg.db import validated_columns, validated_table


class OutboxQueries:
    """Every polling-mode statement for one outbox table, built from quoted names only."""

    def __init__(self, outbox: OutboxConfig) -> None:
        table = validated_table(outbox.table)
        cols = validated_columns(outbox.columns)
        c = {role: sql.Identifier(getattr(cols, role)) for role in cols.__dataclass_fields__}
        self.table_name = str(table)
        t = sql.Identifier(table.schema, table.name)
        self.table_identifier = t
        self.id_column = cols.id
        names: dict[str, sql.Composable] = {"t": t, **{f"c_{k}": v for k, v in c.items()}}

        def q(text: str, **extra: sql.Composable) -> sql.Composed:
            return sql.SQL(text).format(**names, **extra)

        self.pending_where = q("processed_at IS NULL AND dead_lettered_at IS NULL")
        self._ready = "attempts < %(max)s AND (retry_after IS NULL OR retry_after <= now())"
        self.event_columns = q(
            # Aliased: ORDER BY would otherwise see two output columns named like the id.
            "{c_id}::text AS cdc_event_id, {c_aggregate_type}::text AS cdc_aggregate_type,"
            " {c_aggregate_id}::text AS cdc_aggregate_id, {c_event_type}::text AS cdc_event_type,"
            " {c_payload}::text AS cdc_payload,"
            " CASE WHEN isfinite({c_created_at})"
            " THEN floor(extract(epoch FROM {c_created_at}) * 1000)::bigint END AS cdc_created_ms,"
            " attempts AS cdc_attempts, {c_id} AS cdc_raw_id"
        )
        # Carried columns (--header, --partition-column, then the trace context columns the
        # table has), as text, after the eight above: event_from_row reads them by count.
        carried = (*outbox.extra_columns, *outbox.trace_columns)
        if carried:
            self.event_columns = sql.SQL(", ").join([self.event_columns, *(
                sql.SQL("{}::text AS {}").format(
                    sql.Identifier(validate_identifier(column, "carried column")),
                    sql.Identifier(f"cdc_carried_{n}"))
                for n, column in enumerate(carried))])
        self.extra_count = len(outbox.extra_columns)
        self.trace_count = len(outbox.trace_columns)
        self.aggregate_key = q(
            "hashtext(length({c_aggregate_type}::text)::text || ':' || {c_aggregate_type}::text"
            " || '|' || {c_aggregate_id}::text)"
        )
        # created_at is the transaction's start time, so the events of one transaction tie:
        # ctid (heap order: insertion order for fresh rows) breaks the tie. In strict order
        # a row that already failed sorts first within its tie (its UPDATE moved it to a
        # later ctid). Both orders let the planner walk the pending index on created_at.
        self.order = q("{c_created_at}, ctid")
        self.strict_order = q("{c_created_at}, attempts DESC, ctid")
        self.names = names
        self.q = q

    def claim(self) -> sql.Composed:
        """Oldest ready rows, locked; rows another poller holds are skipped."""
        return self.q(
            "SELECT {cols} FROM {t} WHERE {pending} AND " + self._ready
            + " ORDER BY {order} LIMIT %(limit)s FOR UPDATE SKIP LOCKED",
            cols=self.event_columns, pending=self.pending_where, order=self.order)

    def strict_candidates(self) -> sql.Composed:
        """Aggregate keys of the oldest ready rows whose aggregate is not blocked.

        The waiting rows are few (those in backoff), so they are collected once
        (MATERIALIZED) and each candidate is checked against that short list - whatever
        the planner believes about a freshly filled table.
        """
        return self.q(
            "WITH waiting AS MATERIALIZED (SELECT {c_aggregate_type} AS agg_type,"
            " {c_aggregate_id} AS agg_id, {c_created_at} AS created, {c_id} AS row_id"
            " FROM {t} WHERE {pending} AND (retry_after > now() OR attempts >= %(max)s)),"
            # Aggregates other pollers hold now: skipping them lets a second poller find
            # work beyond the first one's batch instead of coming back empty-handed.
            " held AS MATERIALIZED (SELECT objid FROM pg_locks WHERE locktype = 'advisory'"
            " AND objsubid = 2 AND classid = hashtext(%(ns)s)::oid AND pid <> pg_backend_pid())"
            " SELECT {key} FROM {t} r WHERE {pending} AND " + self._ready
            + " AND NOT EXISTS (SELECT 1 FROM waiting b WHERE b.agg_type = r.{c_aggregate_type}"
            " AND b.agg_id = r.{c_aggregate_id}"
            # <= : a waiting row blocks the rest of its own transaction's events too.
            " AND b.created <= r.{c_created_at} AND b.row_id <> r.{c_id})"
            " AND NOT EXISTS (SELECT 1 FROM held h WHERE h.objid = ({key})::oid)"
            " ORDER BY {order} LIMIT %(limit)s",
            key=self.aggregate_key, pending=self.pending_where, order=self.strict_order)

    def lock_aggregates(self) -> sql.Composed:
        """Try each aggregate's transaction-level advisory lock; return the ones we got."""
        return self.q(
            "SELECT k FROM unnest(%(keys)s::int4[]) AS u(k)"
            " WHERE pg_try_advisory_xact_lock(hashtext(%(ns)s), k)")

    def strict_rows(self) -> sql.Composed:
        """The oldest pending rows of the locked aggregates, with key and readiness.

        Not locked here: the advisory locks keep other strict pollers away, and only the
        rows actually taken are locked (``lock_rows``) - locking a whole backlog of busy
        aggregates per batch would write to every one of those rows.
        """
        return self.q(
            "SELECT {key}, " + self._ready + ", {cols} FROM {t} WHERE {pending}"
            " AND {key} = ANY(%(keys)s::int4[]) ORDER BY {order} LIMIT %(window)s",
            key=self.aggregate_key, cols=self.event_columns, pending=self.pending_where,
            order=self.strict_order)

    def lock_rows(self) -> sql.Composed:
        """Lock the rows to take; return the ids of those still pending and ready.

        ``strict_rows`` read them without a lock, so a plain poller may have claimed or
        even processed one since: the WHERE clause is evaluated again on the locked row
        version (READ COMMITTED re-checks updated rows), and a row another poller holds
        is skipped rather than waited for (it would come back processed).
        """
        return self.q(
            "SELECT {c_id} FROM {t} WHERE {c_id} = ANY(%(ids)s) AND {pending} AND " + self._ready
            + " FOR UPDATE SKIP LOCKED", pending=self.pending_where)

    def id_array_type(self) -> sql.Composed:
        """The oid of the id column's array type: how ``array_literal`` ids are sent."""
        return self.q(
            "SELECT t.typarray FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
            " WHERE a.attrelid = %(table)s::regclass AND a.attname = %(column)s"
            " AND NOT a.attisdropped")

    def mark_processed(self) -> sql.Composed:
        return self.q("UPDATE {t} SET processed_at = now() WHERE {c_id} = ANY(%(ids)s)")

    def unmark_processed(self) -> sql.Composed:
        """Undo ``mark_processed`` inside the batch's own, uncommitted transaction (premark)."""
        return self.q("UPDATE {t} SET processed_at = NULL WHERE {c_id} = ANY(%(ids)s)")

    def record_failures(self) -> sql.Composed:
        return self.q(
            "UPDATE {t} AS t SET attempts = t.attempts + 1, last_error = f.err,"
            " retry_after = now() + f.delay * interval '1 second',"
            " dead_lettered_at = CASE WHEN t.attempts + 1 >= %(max)s THEN now() END"
            " FROM unnest(%(ids)s, %(errs)s::text[], %(delays)s::float8[]) AS f(id, err, delay)"
            " WHERE t.{c_id} = f.id RETURNING t.{c_id}::text, t.dead_lettered_at IS NOT NULL"
        )

    def count_pending(self) -> sql.Composed:
        return self.q("SELECT count(*) FROM {t} WHERE {pending}", pending=self.pending_where)

    def count_dead_letters(self) -> sql.Composed:
        return self.q("SELECT count(*) FROM {t} WHERE dead_lettered_at IS NOT NULL")

    def list_dead_letters(self) -> sql.Composed:
        return self.q(
            "SELECT {c_id}::text, {c_aggregate_type}::text, {c_aggregate_id}::text,"
            " {c_event_type}::text, attempts, last_error, {c_created_at}, dead_lettered_at"
            " FROM {t} WHERE dead_lettered_at IS NOT NULL"
            " ORDER BY dead_lettered_at, {c_id} LIMIT %(limit)s"
        )

    def retry_dead_letters(self, *, all_rows: bool) -> sql.Composed:
        which = "" if all_rows else " AND {c_id}::text = ANY(%(ids)s::text[])"
        return self.q(
            "UPDATE {t} SET dead_lettered_at = NULL, attempts = 0, retry_after = NULL"
            " WHERE dead_lettered_at IS NOT NULL" + which + " RETURNING {c_id}::text"
        )

    def cleanup_batch(self, *, wal_mode: bool = False) -> sql.Composed:
        if wal_mode:
            # WAL mode never sets processed_at: the WAL already carried every committed
            # row, so rows are deleted by age (dead letters of a poller still stay).
            return self.q(
                "DELETE FROM {t} WHERE {c_id} IN (SELECT {c_id} FROM {t}"
                " WHERE dead_lettered_at IS NULL"
                " AND {c_created_at} < now() - %(older)s * interval '1 second'"
                " LIMIT %(batch)s FOR UPDATE SKIP LOCKED)"
            )
        return self.q(
            "DELETE FROM {t} WHERE {c_id} IN (SELECT {c_id} FROM {t}"
            " WHERE processed_at IS NOT NULL"
            " AND processed_at < now() - %(older)s * interval '1 second'"
            " LIMIT %(batch)s FOR UPDATE SKIP LOCKED)"
        )


    def event(self, row: Sequence[Any]) -> OutboxEvent:
        """The OutboxEvent of a claim row of these queries (carried columns included)."""
        return event_from_row(row, self.extra_count, self.trace_count)


def array_literal(values: Iterable[str]) -> str:
    """A PostgreSQL array literal of ``values`` (text), every element quoted.

    A batch's ids travel as this one string rather than as a list psycopg adapts
    element by element (polling/claims.py); the server parses it with the id
    column's own input function.
    """
    return "{" + ",".join(
        '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"' for value in values) + "}"


def event_from_row(row: Sequence[Any], extra: int = 0, trace: int = 0) -> OutboxEvent:
    """A claim row (id_text, aggregate_type, aggregate_id, event_type, payload, ms, attempts,
    raw id, then ``extra`` carried column values and ``trace`` trace context values)."""
    event = OutboxEvent(
        id=row[0],
        aggregate_type=row[1],
        aggregate_id=row[2],
        event_type=row[3],
        payload=row[4].encode(),
        created_at_ms=row[5],
        attempt=row[6] + 1,
    )
    return carry(event, row[8:], extra, trace) if extra or trace else event


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pending row read under its aggregate's lock (strict order)."""

    key: int
    ready: bool
    row: tuple[Any, ...]


def locked_prefix(rows: Iterable[tuple[Any, ...]], locked: set[Any]) -> list[tuple[Any, ...]]:
    """The claim rows (``event_columns`` order) to publish once ``lock_rows`` answered.

    Per aggregate, the rows before the first one that was not locked (another poller
    holds it, or it is no longer pending): a later event must not overtake it. The rows
    after it stay locked until the batch ends, unpublished and untouched.
    """
    stopped: set[tuple[Any, Any]] = set()
    taken: list[tuple[Any, ...]] = []
    for row in rows:
        aggregate = (row[1], row[2])
        if aggregate in stopped:
            continue
        if row[7] not in locked:
            stopped.add(aggregate)
            continue
        taken.append(row)
    return taken


def ready_prefix(candidates: Iterable[Candidate], limit: int) -> list[tuple[Any, ...]]:
    """The rows to claim: per aggregate, the rows before its first not-ready row.

    ``candidates`` come in claim order (created_at, ...); the result keeps it and
    holds at most ``limit`` rows. A row that waits for its retry blocks every later
    row of its aggregate, so an aggregate's events are never published out of order.
    """
    blocked: set[int] = set()
    taken: list[tuple[Any, ...]] = []
    for candidate in candidates:
        if len(taken) >= limit:
            break
        if candidate.key in blocked:
            continue
        if not candidate.ready:
            blocked.add(candidate.key)
            continue
        taken.append(candidate.row)
    return taken

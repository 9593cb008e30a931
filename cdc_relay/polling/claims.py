"""Polling mode's connection side: claim a batch, mark it processed, record failures (docs/design.md).

Owns the transaction of one batch on one poller's connection: ``PollingSource.claim``
opens it (the claimed rows stay locked), and ``complete`` (mark successes processed,
record failures, commit) or ``release`` (roll back: nothing counted) ends it.
``premark`` runs the marking UPDATE early, while the broker's acknowledgements are
still awaited, inside the same uncommitted transaction: nobody sees it before
``complete`` commits, and ``complete`` first undoes it for every premarked row that
did not end up processed, so what is committed is exactly what ``complete`` is told. The
statements themselves, the strict-order claim's design and how rows become
OutboxEvents are in ``polling/sql.py`` (``OutboxQueries``).

The retry policy's arithmetic is the pure ``backoff_delay``; ``text.shorten`` keeps
``last_error`` to one readable line of at most ``MAX_ERROR_LENGTH`` characters.

A batch's fixed cost is kept small (measured: docs/design.md, polling mode): the
statements are rendered to bytes once per connection (psycopg then caches their
conversion and prepares them), and the ids of a settled batch travel as one array
literal cast to the id column's type (read from the catalog when connecting) rather
than as a list psycopg adapts element by element. libpq's pipeline mode was measured
too: it saves a round trip but costs more client CPU than it saves on a local server.

Must not: talk to the broker, route, decide which failures count (the poller does),
build SQL text (``polling/sql.py``), or sleep. psycopg errors leave this module as
RelayErrors (``translate_error``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.adapt import Dumper
from psycopg.rows import TupleRow

from cdc_relay.config import OutboxConfig
from cdc_relay.errors import ConfigError, RelayError
from cdc_relay.model import OutboxEvent
from cdc_relay.pg.db import SERVER_TCP_KEEPALIVES, connect, translate_error
from cdc_relay.polling.settlement import MAX_ERROR_LENGTH, AttemptFailure, Completion
from cdc_relay.polling.sql import (
    Candidate,
    OutboxQueries,
    array_literal,
    locked_prefix,
    ready_prefix,
)
from cdc_relay.text import shorten

# ---------------------------------------------------------------- connections

class IdArray(str):
    """A batch's ids as one array literal (``array_literal``), sent as the id column's array type."""


def _id_array_dumper(array_oid: int) -> type[Dumper]:
    """A dumper sending an ``IdArray`` as is, typed as the id column's array (``array_oid``)."""

    class IdArrayDumper(Dumper):
        oid = array_oid

        def dump(self, obj: Any) -> bytes:
            return str(obj).encode()

    return IdArrayDumper


# transaction_timeout exists from PostgreSQL 17 on: set whichever the server has.
_SESSION_TIMEOUTS_OFF = (
    "SELECT set_config(name, '0', false) FROM pg_settings"
    " WHERE name IN ('idle_in_transaction_session_timeout', 'transaction_timeout')"
)

# The backend gives the session up as soon as the client does on a silent network (no
# FIN, no RST), releasing the claimed rows' locks: each bound is set where the server's
# is unset (0: the OS's default) or looser. Values are integers (cdc_relay/pg/db.py).
_SERVER_KEEPALIVES = (
    "SELECT set_config(name, wanted, false) FROM pg_settings JOIN (VALUES "
    + ", ".join(f"('{name}', '{value}')" for name, value in SERVER_TCP_KEEPALIVES.items())
    + ") AS bounds(name, wanted) USING (name)"
    " WHERE setting::bigint = 0 OR setting::bigint > wanted::bigint"
)

class PollingSource:
    """One poller's connection: claims a batch in a transaction and ends it.

    Between ``claim`` and ``complete``/``release`` the claimed rows (and in strict mode
    their aggregates) are locked; no other poller can publish them. A lost connection
    raises ServiceUnavailable: the server rolls the batch back, so nothing is marked
    and the rows are claimed again (at least once).
    """

    def __init__(self, dsn: str, outbox: OutboxConfig, *, application_name: str = "cdc-relay poll"):
        self._dsn = dsn
        self._queries = OutboxQueries(outbox)
        self._application_name = application_name
        self._conn: psycopg.Connection[TupleRow] | None = None
        self._sql: dict[str, bytes] = {}  # the statements, rendered for this connection
        self._premarked: set[str] = set()  # ids marked processed ahead of their acks (premark)

    @property
    def connected(self) -> bool:
        """True while a connection is open and not known to be broken."""
        return self._conn is not None and not self._conn.closed

    def open(self) -> None:
        """Connect (not in autocommit: each batch is one explicit transaction).

        The session's idle-in-transaction and transaction timeouts are switched off: a
        batch's transaction waits for delivery reports while its rows stay locked, and a
        server (or role, or DSN) timeout shorter than that would end the session, release
        the locks mid-batch and let another poller publish the same rows. The batch's
        own length is bounded by the producer's message timeout instead. The server's TCP
        keepalives are tightened to the client's, so that on a silent network the backend
        ends (and its locks go) as soon as this side reconnects (docs/high-availability.md).
        """
        if self.connected:
            return
        conn = connect(self._dsn, application_name=self._application_name)
        try:
            conn.execute(_SESSION_TIMEOUTS_OFF)
            conn.execute(_SERVER_KEEPALIVES)
            queries = self._queries
            row = conn.execute(queries.id_array_type(), {
                "table": queries.table_identifier.as_string(conn),
                "column": queries.id_column}).fetchone()
            conn.commit()
            if not row or not row[0]:
                raise ConfigError(f"{queries.table_name} has no column {queries.id_column} with an "
                                  "array type (run cdc-relay init --mode poll)")
            conn.adapters.register_dumper(IdArray, _id_array_dumper(row[0]))
            self._sql = {name: statement.as_bytes(conn) for name, statement in (
                ("claim", queries.claim()), ("strict_candidates", queries.strict_candidates()),
                ("lock_aggregates", queries.lock_aggregates()), ("strict_rows", queries.strict_rows()),
                ("lock_rows", queries.lock_rows()), ("mark_processed", queries.mark_processed()),
                ("unmark_processed", queries.unmark_processed()),
                ("record_failures", queries.record_failures()))}
        except psycopg.Error as exc:
            conn.close()
            raise translate_error(exc, "configuring the polling session") from exc
        except ConfigError:
            conn.close()
            raise
        self._conn = conn

    def close(self) -> None:
        """Close the connection; an open batch is rolled back by the server."""
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._sql = {}
        self._premarked = set()

    def _require(self) -> psycopg.Connection[TupleRow]:
        if self._conn is None or self._conn.closed:
            self._conn = None
            self.open()
        assert self._conn is not None
        return self._conn

    def _fail(self, exc: psycopg.Error, doing: str) -> RelayError:
        """Translate, and drop a connection that cannot be trusted any more."""
        error = translate_error(exc, doing, grant="SELECT, UPDATE", conn=self._conn)
        if self._conn is not None and (self._conn.broken or self._conn.closed):
            self.close()
        else:
            self._rollback_quietly()
        return error

    def _rollback_quietly(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            conn.rollback()
        except psycopg.Error:
            self.close()

    def claim(self, limit: int, max_attempts: int, *, strict_order: bool = False) -> list[OutboxEvent]:
        """Open the batch's transaction and lock up to ``limit`` ready rows, oldest first.

        An empty result ends the transaction at once. Otherwise the caller must call
        ``complete`` or ``release``.
        """
        conn = self._require()
        params = {"limit": limit, "max": max_attempts, "ns": self._queries.table_name}
        try:
            rows = (self._claim_strict(conn, params) if strict_order
                    else conn.execute(self._sql["claim"], params).fetchall())
            if not rows:
                conn.rollback()
        except psycopg.Error as exc:
            raise self._fail(exc, f"claiming a batch from {self._queries.table_name}") from exc
        return [self._queries.event(row) for row in rows]

    def _claim_strict(self, conn: psycopg.Connection[TupleRow],
                      params: dict[str, Any]) -> list[tuple[Any, ...]]:
        keys = [row[0] for row in conn.execute(self._sql["strict_candidates"], params)]
        if not keys:
            return []
        unique = list(dict.fromkeys(keys))
        locked = [row[0] for row in conn.execute(self._sql["lock_aggregates"],
                                                   {**params, "keys": unique})]
        if not locked:
            return []
        # A prefix of the locked aggregates' rows in claim order holds every row that
        # could precede a taken one; twice the limit leaves room for waiting rows.
        window = {**params, "keys": locked, "window": 2 * params["limit"]}
        rows = conn.execute(self._sql["strict_rows"], window).fetchall()
        taken = ready_prefix((Candidate(row[0], row[1], tuple(row[2:])) for row in rows),
                             params["limit"])
        if not taken:
            return []
        still_pending = {row[0] for row in conn.execute(
            self._sql["lock_rows"], {**params, "ids": [row[7] for row in taken]})}
        return locked_prefix(taken, still_pending)

    def premark(self, events: Sequence[OutboxEvent]) -> None:
        """Mark ``events`` processed now, in the batch's open transaction, before their acks.

        Invisible until ``complete`` commits it - and ``complete`` undoes it first for
        every event it is not told is processed - so only the statement's time moves
        off the batch's critical path (docs/design.md, polling mode). A lost
        connection rolls the whole batch back, as at any other point of it. So does an
        UPDATE the server refuses (a trigger raising, a missing privilege): PostgreSQL
        aborts the transaction at once, releasing its row locks while the batch's
        messages may still be in flight - the window a lost connection opens too
        (docs/design.md, polling mode). The caller releases the batch uncounted.
        """
        conn = self._require()
        ids = [event.id for event in events]
        try:
            conn.execute(self._sql["mark_processed"], {"ids": IdArray(array_literal(ids))})
        except psycopg.Error as exc:
            self._premarked = set()
            raise self._fail(exc, f"marking a batch of {self._queries.table_name}") from exc
        self._premarked.update(ids)

    def complete(self, processed: Sequence[OutboxEvent], failures: Sequence[AttemptFailure],
                 max_attempts: int) -> Completion:
        """Mark ``processed`` (one UPDATE), record ``failures`` (one UPDATE), commit.

        Claimed events in neither list are released untouched (no attempt counted).
        Premarked events (``premark``) that are not in ``processed`` are unmarked first;
        premarked ``processed`` events need no further statement.
        """
        conn = self._require()
        dead: tuple[str, ...] = ()
        premarked, self._premarked = self._premarked, set()
        try:
            if premarked and not processed and not failures:
                conn.rollback()  # nothing to write: as if the marking never ran
                return Completion(0, 0, ())
            to_mark = [event.id for event in processed if event.id not in premarked]
            if premarked:
                done = {event.id for event in processed}
                undo = [event_id for event_id in premarked if event_id not in done]
                if undo:
                    conn.execute(self._sql["unmark_processed"], {"ids": IdArray(array_literal(undo))})
            if to_mark:
                conn.execute(self._sql["mark_processed"], {"ids": IdArray(array_literal(to_mark))})
            if failures:
                rows = conn.execute(self._sql["record_failures"], {
                    "ids": IdArray(array_literal([f.event.id for f in failures])),
                    "errs": [shorten(f.reason, MAX_ERROR_LENGTH) for f in failures],
                    "delays": [f.delay for f in failures],
                    "max": max_attempts,
                }).fetchall()
                dead = tuple(row[0] for row in rows if row[1])
            conn.commit()
        except psycopg.Error as exc:
            raise self._fail(exc, f"completing a batch of {self._queries.table_name}") from exc
        return Completion(len(processed), len(failures), dead)

    def release(self) -> None:
        """Roll the batch back: every claimed row is pending again, no attempt counted."""
        self._premarked = set()
        self._rollback_quietly()

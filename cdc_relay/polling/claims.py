"""Polling mode's connection side: claim a batch, mark it processed, record failures (docs/design.md).

Owns the transaction of one batch on one poller's connection: ``PollingSource.claim``
opens it (the claimed rows stay locked), and ``complete`` (mark successes processed,
record failures, commit) or ``release`` (roll back: nothing counted) ends it. The
statements themselves, the strict-order claim's design and how rows become
OutboxEvents are in ``polling/sql.py`` (``OutboxQueries``).

The retry policy's arithmetic is the pure ``backoff_delay``; ``text.shorten`` keeps
``last_error`` to one readable line of at most ``MAX_ERROR_LENGTH`` characters.

Round trips (a batch's fixed cost, measured: docs/design.md, polling mode): the
statements are rendered to bytes once per connection (psycopg then caches their
conversion and prepares them), the claim's ``BEGIN`` travels with its ``SELECT`` and
``complete``'s UPDATEs with their ``COMMIT``, each in one libpq pipeline - one round
trip to claim a batch, one to settle it.

Must not: talk to the broker, route, decide which failures count (the poller does),
build SQL text (``polling/sql.py``), or sleep. psycopg errors leave this module as
RelayErrors (``translate_error``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from cdc_relay.config import OutboxConfig
from cdc_relay.db import connect, translate_error
from cdc_relay.errors import RelayError
from cdc_relay.model import OutboxEvent
from cdc_relay.polling.settlement import MAX_ERROR_LENGTH, AttemptFailure, Completion
from cdc_relay.polling.sql import (
    Candidate,
    OutboxQueries,
    locked_prefix,
    ready_prefix,
)
from cdc_relay.text import shorten

# ---------------------------------------------------------------- connections

# transaction_timeout exists from PostgreSQL 17 on: set whichever the server has.
_SESSION_TIMEOUTS_OFF = (
    "SELECT set_config(name, '0', false) FROM pg_settings"
    " WHERE name IN ('idle_in_transaction_session_timeout', 'transaction_timeout')"
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
        self._raw_ids: dict[str, Any] = {}
        self._sql: dict[str, bytes] = {}  # the statements, rendered for this connection

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
        own length is bounded by the producer's message timeout instead.
        """
        if self.connected:
            return
        conn = connect(self._dsn, application_name=self._application_name)
        try:
            conn.execute(_SESSION_TIMEOUTS_OFF)
            conn.commit()
            queries = self._queries
            self._sql = {name: statement.as_bytes(conn) for name, statement in (
                ("claim", queries.claim()), ("strict_candidates", queries.strict_candidates()),
                ("lock_aggregates", queries.lock_aggregates()), ("strict_rows", queries.strict_rows()),
                ("lock_rows", queries.lock_rows()), ("mark_processed", queries.mark_processed()),
                ("record_failures", queries.record_failures()))}
        except psycopg.Error as exc:
            conn.close()
            raise translate_error(exc, "configuring the polling session") from exc
        self._conn = conn

    def close(self) -> None:
        """Close the connection; an open batch is rolled back by the server."""
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._raw_ids = {}
        self._sql = {}

    def _require(self) -> psycopg.Connection[TupleRow]:
        if self._conn is None or self._conn.closed:
            self._conn = None
            self.open()
        assert self._conn is not None
        return self._conn

    def _fail(self, exc: psycopg.Error, doing: str) -> RelayError:
        """Translate, and drop a connection that cannot be trusted any more."""
        error = translate_error(exc, doing)
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
            if strict_order:
                rows = self._claim_strict(conn, params)
            else:
                with conn.pipeline():  # BEGIN and the SELECT in one round trip
                    cursor = conn.execute(self._sql["claim"], params)
                rows = cursor.fetchall()
            if not rows:
                conn.rollback()
        except psycopg.Error as exc:
            raise self._fail(exc, f"claiming a batch from {self._queries.table_name}") from exc
        self._raw_ids = {row[0]: row[7] for row in rows}
        return [self._queries.event(row) for row in rows]

    def _claim_strict(self, conn: psycopg.Connection[TupleRow],
                      params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with conn.pipeline():  # BEGIN and the first SELECT in one round trip
            cursor = conn.execute(self._sql["strict_candidates"], params)
        keys = [row[0] for row in cursor.fetchall()]
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

    def complete(self, processed: Sequence[OutboxEvent], failures: Sequence[AttemptFailure],
                 max_attempts: int) -> Completion:
        """Mark ``processed`` (one UPDATE), record ``failures`` (one UPDATE), commit.

        All in one round trip (a pipeline): a failing UPDATE aborts the rest, so the
        COMMIT never runs without both. Claimed events in neither list are released
        untouched (no attempt counted).
        """
        conn = self._require()
        raw = self._raw_ids
        dead: tuple[str, ...] = ()
        try:
            failed = None
            with conn.pipeline():
                if processed:
                    conn.execute(self._sql["mark_processed"],
                                 {"ids": [raw[event.id] for event in processed]})
                if failures:
                    failed = conn.execute(self._sql["record_failures"], {
                        "ids": [raw[f.event.id] for f in failures],
                        "errs": [shorten(f.reason, MAX_ERROR_LENGTH) for f in failures],
                        "delays": [f.delay for f in failures],
                        "max": max_attempts,
                    })
                conn.commit()
            if failed is not None:
                dead = tuple(row[0] for row in failed.fetchall() if row[1])
        except psycopg.Error as exc:
            raise self._fail(exc, f"completing a batch of {self._queries.table_name}") from exc
        finally:
            self._raw_ids = {}
        return Completion(len(processed), len(failures), dead)

    def release(self) -> None:
        """Roll the batch back: every claimed row is pending again, no attempt counted."""
        self._raw_ids = {}
        self._rollback_quietly()

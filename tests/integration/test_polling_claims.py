"""Polling claims against a real PostgreSQL: strict and plain pollers side by side, and a
server timeout shorter than a batch (defect 9)."""

from __future__ import annotations

import threading

import psycopg

from cdc_relay.config import OutboxConfig
from cdc_relay.model import OutboxEvent
from cdc_relay.outbox import emit
from cdc_relay.polling.claims import PollingSource
from tests.support import init_outbox, wait_for


def test_a_strict_poller_never_takes_a_row_a_plain_poller_published_meanwhile(db: str) -> None:
    init_outbox(db, "--mode", "poll")
    with psycopg.connect(db) as conn:
        event_id = str(emit(conn, "order", "o-1", "Placed", {"n": 1}))
        conn.commit()
    plain = PollingSource(db, OutboxConfig(), application_name="plain poller")
    strict = PollingSource(db, OutboxConfig(), application_name="strict poller")
    try:
        [claimed] = plain.claim(10, 5)  # holds the row lock
        taken: list[OutboxEvent] = []
        finished = threading.Event()

        def claim_strict() -> None:
            taken.extend(strict.claim(10, 5, strict_order=True))
            finished.set()

        worker = threading.Thread(target=claim_strict)
        worker.start()

        def strict_done_or_waiting() -> bool:
            if finished.is_set():
                return True
            with psycopg.connect(db, autocommit=True) as conn:
                row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name"
                                   " = 'strict poller' AND wait_event_type = 'Lock'").fetchone()
            return row is not None and row[0] > 0

        wait_for(strict_done_or_waiting, timeout=30, message="the strict claim to finish or wait")
        plain.complete([claimed], [], 5)  # published and marked processed
        worker.join(timeout=30)
        assert finished.is_set()
        assert event_id not in [event.id for event in taken], "a processed row was claimed again"
    finally:
        strict.release()
        plain.close()
        strict.close()


def test_a_batch_outlives_an_idle_in_transaction_timeout_shorter_than_its_hold(db: str) -> None:
    init_outbox(db, "--mode", "poll")
    with psycopg.connect(db) as conn:
        emit(conn, "order", "o-1", "Placed", {"n": 1})
        conn.commit()
    # A DSN (or role, or server) setting of 300 ms: shorter than waiting for the broker.
    short = db + " options='-c idle_in_transaction_session_timeout=300'"
    source = PollingSource(short, OutboxConfig(), application_name="slow poller")
    try:
        claimed = source.claim(10, 5)
        assert len(claimed) == 1

        def idle_for_a_second() -> bool:
            with psycopg.connect(db, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'slow poller'"
                    " AND state = 'idle in transaction'"
                    " AND state_change < now() - interval '1 second'").fetchone()
            return row is not None and row[0] == 1

        wait_for(idle_for_a_second, timeout=30, message="the batch held for a second")
        with psycopg.connect(db, autocommit=True) as conn:  # the row is still locked
            other = conn.execute("SELECT id FROM outbox_events WHERE processed_at IS NULL"
                                 " FOR UPDATE SKIP LOCKED").fetchall()
        assert other == []
        source.complete(claimed, [], 5)
        with psycopg.connect(db, autocommit=True) as conn:
            done = conn.execute("SELECT count(*) FROM outbox_events"
                                " WHERE processed_at IS NOT NULL").fetchone()
        assert done is not None and done[0] == 1
    finally:
        source.close()

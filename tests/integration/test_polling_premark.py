"""Premarking against a real PostgreSQL: the marking UPDATE run while a batch's acks are
awaited is invisible until ``complete`` commits, and what commits is exactly what
``complete`` is told (processed, failed, released) - docs/design.md, polling mode."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from cdc_relay.config import OutboxConfig
from cdc_relay.errors import DatabaseError, ServiceUnavailable
from cdc_relay.outbox import emit
from cdc_relay.polling.claims import PollingSource
from cdc_relay.polling.settlement import AttemptFailure
from cdc_relay.polling.sql import array_literal
from tests.support import init_outbox


@pytest.fixture
def outbox(db: str) -> Iterator[list[str]]:
    """Four pending events, e0..e3 in claim order; yields their ids."""
    init_outbox(db, "--mode", "poll")
    with psycopg.connect(db) as conn:
        ids = [str(emit(conn, "order", f"o-{n}", "Placed", {"n": n})) for n in range(4)]
        conn.commit()
    yield ids


def state(dsn: str) -> dict[str, tuple[object, ...]]:
    """Per id, seen from another connection: (processed, attempts, has last_error, waits)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {row[0]: row[1:] for row in conn.execute(
            "SELECT id::text, processed_at IS NOT NULL, attempts, last_error IS NOT NULL,"
            " retry_after IS NOT NULL FROM outbox_events")}


UNTOUCHED = (False, 0, False, False)


def test_premarked_rows_stay_pending_for_everyone_else_until_complete_commits(
        db: str, outbox: list[str]) -> None:
    source = PollingSource(db, OutboxConfig(), application_name="premarking poller")
    other = PollingSource(db, OutboxConfig(), application_name="other poller")
    try:
        batch = source.claim(2, 5)
        assert [e.id for e in batch] == outbox[:2]
        source.premark(batch)
        assert state(db) == dict.fromkeys(outbox, UNTOUCHED)  # nothing committed yet
        # and the rows are still locked: another poller skips them, takes the rest
        assert [e.id for e in other.claim(10, 5)] == outbox[2:]
        other.release()
        source.complete(batch, [], 5)
        assert state(db) == {**dict.fromkeys(outbox[:2], (True, 0, False, False)),
                             **dict.fromkeys(outbox[2:], UNTOUCHED)}
    finally:
        source.close()
        other.close()


def test_complete_commits_exactly_its_verdict_whatever_was_premarked(
        db: str, outbox: list[str]) -> None:
    source = PollingSource(db, OutboxConfig())
    try:
        e0, e1, e2, e3 = source.claim(10, 5)
        source.premark([e0, e1, e2])  # e3: never produced (e.g. a routing error)
        # e0 acked; e1 failed (an attempt); e2 released (held back: no attempt); e3 failed
        completion = source.complete([e0], [AttemptFailure(e1, "broker said no", 1.0),
                                            AttemptFailure(e3, "cannot route", 1.0)], 5)
        assert (completion.processed, completion.failed, completion.dead_lettered) == (1, 2, ())
        assert state(db) == {e0.id: (True, 0, False, False), e1.id: (False, 1, True, True),
                             e2.id: UNTOUCHED, e3.id: (False, 1, True, True)}
    finally:
        source.close()


@pytest.mark.parametrize("end", ["release", "nothing acknowledged"])
def test_a_premarked_batch_that_is_released_marks_nothing(
        db: str, outbox: list[str], end: str) -> None:
    source = PollingSource(db, OutboxConfig())
    try:
        batch = source.claim(10, 5)
        source.premark(batch)
        if end == "release":
            source.release()
        else:  # broker-wide trouble: every event released, no attempt
            assert source.complete([], [], 5).processed == 0
        assert state(db) == dict.fromkeys(outbox, UNTOUCHED)
        assert [e.id for e in source.claim(10, 5)] == outbox  # all pending again
        source.release()
    finally:
        source.close()


def test_a_premark_on_a_lost_connection_fails_and_the_batch_is_rolled_back(
        db: str, outbox: list[str]) -> None:
    source = PollingSource(db, OutboxConfig(), application_name="doomed poller")
    try:
        batch = source.claim(10, 5)
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE application_name = 'doomed poller'")
        with pytest.raises(ServiceUnavailable):
            source.premark(batch)
        source.release()
        assert state(db) == dict.fromkeys(outbox, UNTOUCHED)
    finally:
        source.close()


def test_ids_travel_as_one_literal_that_the_server_reads_back_verbatim(db: str) -> None:
    odd = ["plain", 'a "quoted" one', "back\\slash", "comma,brace}{", "", "NULL", " spaced "]
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT %s::text[]", (array_literal(odd),)).fetchone()
    assert row is not None and row[0] == odd


def test_a_premark_the_server_refuses_releases_the_batch_uncounted(
        db: str, outbox: list[str]) -> None:
    with psycopg.connect(db) as conn:  # e.g. a user's trigger that refuses the UPDATE
        conn.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
                     " $$BEGIN RAISE EXCEPTION 'not today'; END$$")
        conn.execute("CREATE TRIGGER refuse BEFORE UPDATE ON outbox_events FOR EACH ROW"
                     " WHEN (NEW.processed_at IS NOT NULL) EXECUTE FUNCTION refuse()")
        conn.commit()
    source = PollingSource(db, OutboxConfig())
    try:
        batch = source.claim(10, 5)
        with pytest.raises(DatabaseError, match="not today"):
            source.premark(batch)
        source.release()
        assert state(db) == dict.fromkeys(outbox, UNTOUCHED)
        assert [e.id for e in source.claim(10, 5)] == outbox  # pending, claimable again
        source.release()
    finally:
        source.close()

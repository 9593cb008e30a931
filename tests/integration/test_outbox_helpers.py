"""The application-side helpers against a real PostgreSQL: ``emit`` and ``process_once``."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from cdc_relay.app.init import init_database
from cdc_relay.config import OutboxConfig, TableRef
from cdc_relay.consumer import process_once, process_once_async
from cdc_relay.outbox import emit, emit_async

PAYLOAD = {
    "name": "Zoë Ångström — 東京",
    "emoji": "🎉👩‍💻",
    "nested": {"items": [{"sku": "a-1", "qty": 2, "price": 12.5}], "empty": {}, "none": None},
    "flags": [True, False],
    "big": 2**53,
}


@pytest.fixture
def outbox_db(db: str) -> str:
    init_database(db, OutboxConfig(), slot=None)
    return db


def _rows(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def test_emit_in_a_rolled_back_transaction_leaves_no_row(outbox_db: str) -> None:
    with psycopg.connect(outbox_db) as conn:
        emit(conn, "order", "o-1", "created", PAYLOAD)
        conn.rollback()
    assert _rows(outbox_db, "SELECT count(*) FROM outbox_events") == [(0,)]


def test_emit_does_not_commit(outbox_db: str) -> None:
    with psycopg.connect(outbox_db) as conn:
        emit(conn, "order", "o-1", "created", PAYLOAD)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert _rows(outbox_db, "SELECT count(*) FROM outbox_events") == [(0,)]
        conn.commit()
    assert _rows(outbox_db, "SELECT count(*) FROM outbox_events") == [(1,)]


def test_emit_in_a_committed_transaction_stores_one_intact_event(outbox_db: str) -> None:
    with psycopg.connect(outbox_db) as conn, conn.transaction():
        conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
        conn.execute("INSERT INTO orders VALUES ('o-1')")
        event_id = emit(conn, "order", "o-1", "created", PAYLOAD)

    rows = _rows(
        outbox_db,
        "SELECT id, aggregate_type, aggregate_id, event_type, payload, attempts, "
        "processed_at IS NULL, created_at IS NOT NULL FROM outbox_events",
    )
    assert rows == [(event_id, "order", "o-1", "created", PAYLOAD, 0, True, True)]


def test_events_of_one_transaction_get_increasing_created_at(outbox_db: str) -> None:
    # Polling claims ORDER BY created_at: within a transaction it must follow the inserts.
    with psycopg.connect(outbox_db) as conn:
        ids = [emit(conn, "order", "o-1", "Step", {"n": n}) for n in range(20)]
        conn.commit()
        rows = conn.execute("SELECT id FROM outbox_events ORDER BY created_at").fetchall()
        distinct = conn.execute("SELECT count(DISTINCT created_at) FROM outbox_events").fetchone()
    assert [r[0] for r in rows] == ids
    assert distinct == (20,)


def test_emit_accepts_json_bytes_strings_and_numbers(outbox_db: str) -> None:
    given = uuid.uuid4()
    with psycopg.connect(outbox_db) as conn:
        assert emit(conn, "a", "1", "bytes", b'{"k": ["v", 1]}', event_id=given) == given
        emit(conn, "a", "2", "str", "just text")
        emit(conn, "a", "3", "number", 42)
        emit(conn, "a", "4", "list", [1, "two"])
        conn.commit()
    rows = _rows(outbox_db, "SELECT event_type, payload FROM outbox_events ORDER BY aggregate_id")
    assert rows == [("bytes", {"k": ["v", 1]}), ("str", "just text"), ("number", 42),
                    ("list", [1, "two"])]


def test_a_refused_payload_does_not_abort_the_callers_transaction(outbox_db: str) -> None:
    with psycopg.connect(outbox_db) as conn:
        with pytest.raises(ValueError, match="not valid JSON"):
            emit(conn, "a", "1", "e", b"{not json")
        with pytest.raises(ValueError, match="U\\+0000"):
            emit(conn, "a", "1", "e", {"text": "nul\x00byte"})
        with pytest.raises(TypeError):
            emit(conn, "a", "1", "e", {"obj": object()})
        emit(conn, "a", "1", "e", {"ok": True})
        conn.commit()
    assert _rows(outbox_db, "SELECT payload FROM outbox_events") == [({"ok": True},)]


def test_emit_async_inserts_in_the_callers_transaction(outbox_db: str) -> None:
    async def scenario() -> uuid.UUID:
        async with await psycopg.AsyncConnection.connect(outbox_db) as conn:
            await emit_async(conn, "order", "o-1", "discarded", PAYLOAD)
            await conn.rollback()
            async with conn.transaction():
                return await emit_async(conn, "order", "o-1", "created", PAYLOAD)

    event_id = asyncio.run(scenario())

    assert _rows(outbox_db, "SELECT id, event_type, payload FROM outbox_events") == [
        (event_id, "created", PAYLOAD)]


def test_process_once_skips_a_redelivery_from_another_connection(outbox_db: str) -> None:
    event_id = uuid.uuid4()
    with psycopg.connect(outbox_db) as first:
        assert process_once(first, event_id) is True
        first.commit()
    with psycopg.connect(outbox_db) as second:
        assert process_once(second, str(event_id)) is False
        second.commit()
    assert _rows(outbox_db, "SELECT event_id FROM processed_events") == [(event_id,)]


def test_a_rolled_back_consumer_transaction_does_not_mark_the_event(outbox_db: str) -> None:
    event_id = uuid.uuid4()
    with psycopg.connect(outbox_db) as conn:
        try:
            with conn.transaction():
                assert process_once(conn, event_id) is True
                raise RuntimeError("applying the event failed")
        except RuntimeError:
            pass
        with conn.transaction():
            assert process_once(conn, event_id) is True
    assert _rows(outbox_db, "SELECT count(*) FROM processed_events") == [(1,)]


def test_a_concurrent_duplicate_waits_for_the_first_consumer(outbox_db: str) -> None:
    event_id = uuid.uuid4()
    results: list[bool] = []
    with psycopg.connect(outbox_db) as first:
        assert process_once(first, event_id) is True

        def second_consumer() -> None:
            with psycopg.connect(outbox_db) as second:
                results.append(process_once(second, event_id))
                second.commit()

        thread = threading.Thread(target=second_consumer)
        thread.start()
        _wait_for_lock_waiter(outbox_db)
        first.commit()
        thread.join(timeout=30)
    assert results == [False]


def _wait_for_lock_waiter(dsn: str) -> None:
    deadline = time.monotonic() + 30
    query = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
             "AND wait_event_type = 'Lock'")
    while _rows(dsn, query) != [(1,)]:
        assert time.monotonic() < deadline, "the second consumer never waited"
        time.sleep(0.02)


def test_process_once_refuses_an_autocommit_connection_outside_a_transaction(
    outbox_db: str,
) -> None:
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        with pytest.raises(psycopg.ProgrammingError, match="consumer's transaction"):
            process_once(conn, uuid.uuid4())
        with conn.transaction():
            assert process_once(conn, uuid.uuid4()) is True


def test_process_once_async_and_a_custom_schema(db: str) -> None:
    init_database(db, OutboxConfig(TableRef.parse("Billing.outbox")), slot=None)
    event_id = uuid.uuid4()

    async def scenario() -> list[bool]:
        async with await psycopg.AsyncConnection.connect(db) as conn:
            first = await process_once_async(conn, event_id, table="Billing.processed_events")
            await conn.commit()
            second = await process_once_async(
                conn, event_id, table=TableRef("Billing", "processed_events"))
            await conn.commit()
            return [first, second]

    assert asyncio.run(scenario()) == [True, False]
    assert _rows(db, 'SELECT event_id FROM "Billing".processed_events') == [(event_id,)]

"""Consumer side of the outbox: drop redelivered events (docs/design.md).

Delivery is at-least-once, so a consumer sees some events twice. Each Kafka message
carries the event's UUID in its ``id`` header (``event_id_from_headers``); the consumer
records it in ``processed_events`` in the *same* transaction that applies the event
(``process_once``). A redelivery then finds the id and is skipped, and a rollback
removes the mark together with the work, so a failed event is processed again.

Must not: commit, roll back or open transactions (the mark must share the consumer's
transaction), open connections, or import a Kafka client (headers are plain values, so
any client - confluent-kafka, aiokafka, kafka-python - can pass them in).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from cdc_relay.config import TableRef
from cdc_relay.outbox_core import (
    DEFAULT_PROCESSED_TABLE,
    EventIdError,
    Query,
    mark_sql,
    mark_steps,
    run_async,
    run_sync,
)

__all__ = ["DEFAULT_TABLE", "ID_HEADER", "EventIdError", "event_id_from_headers",
           "mark_statement", "process_once", "process_once_async"]

DEFAULT_TABLE = DEFAULT_PROCESSED_TABLE
ID_HEADER = "id"

HeaderValue = bytes | str | None
Headers = Sequence[tuple[str, HeaderValue]] | Mapping[str, HeaderValue]


@functools.lru_cache(maxsize=64)
def mark_statement(table: str | TableRef = DEFAULT_TABLE) -> sql.Composed:
    """The INSERT that marks an event processed; ConfigError for an invalid name."""
    return sql.Composed([sql.SQL(mark_sql(table))])


def _require_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    # On an autocommit connection outside a transaction block the mark would commit at
    # once: if processing then failed, the event would count as done and be lost.
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise psycopg.ProgrammingError(
            "process_once needs the consumer's transaction: call it inside "
            "`with conn.transaction():` (or on a connection with autocommit off), in the "
            "same transaction that applies the event"
        )


def process_once(
    conn: psycopg.Connection[Any],
    event_id: uuid.UUID | str,
    *,
    table: str | TableRef = DEFAULT_TABLE,
) -> bool:
    """Mark ``event_id`` processed; True the first time (process it), False for a duplicate.

    Call it inside the transaction that applies the event and commit both together: a
    rollback un-marks the event. A concurrent call for the same id (another consumer,
    another connection) waits until the first transaction ends, then returns False if
    it committed and True if it rolled back.
    """
    steps = mark_steps(event_id, table=table, style="format")
    _require_transaction(conn)

    def execute(query: Query) -> Any:
        return conn.execute(query.text, query.params).fetchone()

    return run_sync(steps, execute)


async def process_once_async(
    conn: psycopg.AsyncConnection[Any],
    event_id: uuid.UUID | str,
    *,
    table: str | TableRef = DEFAULT_TABLE,
) -> bool:
    """The asyncio twin of :func:`process_once`."""
    steps = mark_steps(event_id, table=table, style="format")
    _require_transaction(conn)

    async def execute(query: Query) -> Any:
        cursor = await conn.execute(query.text, query.params)
        return await cursor.fetchone()

    return await run_async(steps, execute)


def event_id_from_headers(headers: Headers | None, *, name: str = ID_HEADER) -> uuid.UUID:
    """The event UUID from a Kafka message's headers.

    ``headers``: a list of ``(key, value)`` tuples (confluent-kafka's
    ``Message.headers()``, aiokafka) or a mapping; values bytes or str. If the header
    repeats, the last one wins (as Kafka's ``Headers.lastHeader``). A JSON-quoted value
    (``"\\"3f1c...\\""``, as a JSON header converter writes it) is accepted.
    Raises EventIdError when the header is missing or not a UUID.
    """
    value: HeaderValue = None
    found = False
    if isinstance(headers, Mapping):
        if name in headers:
            value, found = headers[name], True
    elif headers is not None:
        for key, item in headers:
            if key == name:
                value, found = item, True
    if not found or value is None:
        raise EventIdError(
            f"the message has no {name!r} header: it was not published by cdc-relay, or "
            "the headers were dropped on the way"
        )
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EventIdError(f"header {name!r} is not a UUID: {bytes(value)[:64]!r}") from exc
    else:
        text = str(value)
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    try:
        return uuid.UUID(text)
    except ValueError as exc:
        raise EventIdError(f"header {name!r} is not a UUID: {text[:64]!r}") from exc

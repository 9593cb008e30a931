"""Application side of the outbox: insert one event in the caller's transaction (docs/design.md).

``emit`` (psycopg ``Connection``) and ``emit_async`` (``AsyncConnection``) share one
statement builder and one argument builder; only the ``execute`` call differs. The
INSERT is composed from validated, quoted identifiers once per (table, columns) and
cached.

Must not: commit, roll back or open a transaction (the event must commit or vanish
with the caller's business rows), open connections, or fail *in the database* on input
it can check itself - a failed statement aborts the caller's whole transaction, so bad
names, non-JSON payloads and wrong argument types are refused before the INSERT.
"""

from __future__ import annotations

import functools
import re
import uuid
from typing import Any

import orjson
import psycopg
from psycopg import sql

from cdc_relay.config import TableRef
from cdc_relay.db import validated_columns, validated_table
from cdc_relay.model import OutboxColumns

DEFAULT_TABLE = "public.outbox_events"

# JSON text escaping U+0000: valid JSON, refused by jsonb ("unsupported Unicode escape
# sequence"). Preceded by an even number of backslashes, so ``\\u0000`` (an escaped
# backslash followed by "u0000") is not matched.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


@functools.lru_cache(maxsize=128)
def insert_statement(table: str | TableRef, columns: OutboxColumns | None = None) -> sql.Composed:
    """The INSERT for one event into ``table``; ConfigError for an invalid name.

    Cached per (table, columns): both are hashable and the result is immutable.
    """
    ref = validated_table(table)
    cols = validated_columns(columns)
    return sql.SQL(
        "INSERT INTO {table} ({id}, {aggregate_type}, {aggregate_id}, {event_type}, {payload}) "
        "VALUES (%s, %s, %s, %s, %s)"
    ).format(
        table=sql.Identifier(ref.schema, ref.name),
        id=sql.Identifier(cols.id),
        aggregate_type=sql.Identifier(cols.aggregate_type),
        aggregate_id=sql.Identifier(cols.aggregate_id),
        event_type=sql.Identifier(cols.event_type),
        payload=sql.Identifier(cols.payload),
    )


def serialize_payload(payload: Any) -> str:
    """The payload as JSON text, checked before it reaches PostgreSQL.

    * ``bytes`` / ``bytearray`` / ``memoryview``: already-serialised JSON (UTF-8); it is
      validated and stored as is (jsonb normalises it).
    * anything else is serialised with orjson: dict, list, str (a JSON *string*, not
      JSON text - pass bytes for that), int, float, bool, None, and what orjson
      handles natively (datetime, UUID, dataclasses, ...).

    Raises TypeError for a value orjson cannot serialise and ValueError for bytes that
    are not JSON, or for a U+0000 character, which jsonb cannot store.
    """
    if isinstance(payload, bytes | bytearray | memoryview):
        data = bytes(payload)
        try:
            orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"payload bytes are not valid JSON: {exc}") from exc
    else:
        try:
            data = orjson.dumps(payload)
        except orjson.JSONEncodeError as exc:
            raise TypeError(f"payload is not JSON-serialisable: {exc}") from exc
    if b"\\u0000" in data and _NUL_ESCAPE.search(data):
        raise ValueError("payload contains a U+0000 (NUL) character, which jsonb cannot store")
    return data.decode("utf-8")


def _arguments(
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Any,
    event_id: uuid.UUID | None,
) -> tuple[uuid.UUID, str, str, str, str]:
    for what, value in (
        ("aggregate_type", aggregate_type),
        ("aggregate_id", aggregate_id),
        ("event_type", event_type),
    ):
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if event_id is None:
        event_id = uuid.uuid4()
    elif not isinstance(event_id, uuid.UUID):
        raise TypeError(f"event_id must be a uuid.UUID, got {type(event_id).__name__}")
    return (event_id, aggregate_type, aggregate_id, event_type, serialize_payload(payload))


def emit(
    conn: psycopg.Connection[Any],
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Any,
    *,
    table: str | TableRef = DEFAULT_TABLE,
    columns: OutboxColumns | None = None,
    event_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """Insert one outbox event inside the caller's transaction and return its id.

    Nothing is committed here: the event becomes visible to the relay when the
    caller's transaction commits, and disappears if it rolls back. (On an autocommit
    connection outside ``conn.transaction()`` the event commits on its own.)
    ``payload``: see :func:`serialize_payload`. ``event_id`` defaults to a random
    UUID; it is the Kafka ``id`` header consumers deduplicate on. Invalid table or
    column names raise ConfigError before anything is sent to the database.
    """
    query = insert_statement(table, columns)
    args = _arguments(aggregate_type, aggregate_id, event_type, payload, event_id)
    conn.execute(query, args)
    return args[0]


async def emit_async(
    conn: psycopg.AsyncConnection[Any],
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Any,
    *,
    table: str | TableRef = DEFAULT_TABLE,
    columns: OutboxColumns | None = None,
    event_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """The asyncio twin of :func:`emit` (same statement, same checks)."""
    query = insert_statement(table, columns)
    args = _arguments(aggregate_type, aggregate_id, event_type, payload, event_id)
    await conn.execute(query, args)
    return args[0]

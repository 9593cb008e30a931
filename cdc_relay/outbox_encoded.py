"""Application side of pre-encoded outbox payloads (docs/application-side.md, docs/messages.md).

``emit_encoded`` (psycopg ``Connection``) and ``emit_encoded_async`` write one event whose
payload the application encoded itself with confluent-kafka's own schema-registry
serializer (``AvroSerializer``, ``JSONSerializer``, ``ProtobufSerializer``): the serializer
registers the schema (or looks it up) with its ``SchemaRegistryClient`` and returns the
Confluent wire format (a zero byte, the 4-byte schema id, the data), which is stored in the
outbox's ``bytea`` payload column. A relay run with ``--value-encoding pre-encoded``
produces those bytes unchanged, so a consumer's stock deserializer reads exactly what the
application's serializer wrote.

The serializer is called with the topic the relay will route the event to (``topic``,
default ``outbox.event.<aggregate_type>``, the relay's default ``--topic-pattern``), so
TopicNameStrategy registers under ``<topic>-value`` as a producer would. ``encoded_steps``
is that step for every adapter: the integrations' ``emit_encoded`` (SQLAlchemy, asyncpg,
Django; cdc_relay/integrations/) run its statements as their ``emit`` runs the core's.

Must not: commit, roll back or open a transaction, or send a statement before the payload
is encoded and checked: the registry is called first, and a registry error or a payload
that does not fit its schema raises in the application before anything reaches the
database (docs/design.md, "The application side").
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Generator, Hashable
from typing import Any, Unpack

import psycopg

from cdc_relay.config import TableRef
from cdc_relay.model import OutboxColumns
from cdc_relay.outbox_core import (
    DEFAULT_TABLE,
    EmitOptions,
    Query,
    emit_bytes_steps,
    run_async,
    run_sync,
)

__all__ = ["DEFAULT_TOPIC_PATTERN", "emit_encoded", "emit_encoded_async", "encode_payload",
           "encoded_steps"]

DEFAULT_TOPIC_PATTERN = "outbox.event.{aggregate_type}"
Serializer = Callable[[Any, Any], bytes | None]


def encode_payload(serializer: Serializer, payload: Any, topic: str) -> bytes:
    """``payload`` encoded by ``serializer`` for ``topic``'s value; ValueError when the
    result is not the Confluent wire format (another serializer, or None)."""
    from confluent_kafka.serialization import MessageField, SerializationContext

    data = serializer(payload, SerializationContext(topic, MessageField.VALUE))
    if not isinstance(data, bytes) or len(data) < 5 or data[0] != 0:
        raise ValueError("the serializer did not return the Confluent wire format (magic byte 0, "
                         "4-byte schema id): use confluent-kafka's AvroSerializer, "
                         "JSONSerializer or ProtobufSerializer")
    return data


def _where(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> tuple[str, int, str]:
    info = conn.info
    return (str(info.host), int(info.port), str(info.dbname))


def encoded_steps(aggregate_type: str, aggregate_id: str, event_type: str, payload: Any, *,
                  serializer: Serializer, topic: str | None, style: str,
                  where: Callable[[], Hashable],
                  **options: Unpack[EmitOptions]) -> Generator[Query, Any, uuid.UUID]:
    """One encoded event's statements in ``style`` (outbox_core's ``emit_bytes_steps``),
    ``payload`` encoded for ``topic`` (default ``outbox.event.<aggregate_type>``) before
    the generator exists, so no statement runs when the serializer fails."""
    topic = topic or DEFAULT_TOPIC_PATTERN.format(aggregate_type=aggregate_type)
    data = encode_payload(serializer, payload, topic)
    return emit_bytes_steps(aggregate_type, aggregate_id, event_type, data, style=style,
                            where=where, **options)


def _steps(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], aggregate_type: str,
           aggregate_id: str, event_type: str, payload: Any, serializer: Serializer,
           topic: str | None, options: EmitOptions) -> Generator[Query, Any, uuid.UUID]:
    return encoded_steps(aggregate_type, aggregate_id, event_type, payload,
                         serializer=serializer, topic=topic, style="format",
                         where=lambda: _where(conn), **options)


def emit_encoded(
    conn: psycopg.Connection[Any],
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Any,
    *,
    serializer: Serializer,
    topic: str | None = None,
    table: str | TableRef = DEFAULT_TABLE,
    columns: OutboxColumns | None = None,
    event_id: uuid.UUID | str | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> uuid.UUID:
    """Encode ``payload`` with ``serializer`` and insert the event into the caller's
    transaction (the table's payload column must be ``bytea``); return its id.

    ``serializer``: e.g. ``AvroSerializer(client, schema_str)``; ``topic``: where the relay
    routes the event (default ``outbox.event.<aggregate_type>``). Other arguments as
    :func:`cdc_relay.outbox.emit`.
    """
    steps = _steps(conn, aggregate_type, aggregate_id, event_type, payload, serializer, topic,
                   {"table": table, "columns": columns, "event_id": event_id,
                    "traceparent": traceparent, "tracestate": tracestate})

    def execute(query: Query) -> Any:
        cursor = conn.execute(query.text, query.params)
        return cursor.fetchone() if query.fetch else None

    result: uuid.UUID = run_sync(steps, execute)
    return result


async def emit_encoded_async(
    conn: psycopg.AsyncConnection[Any],
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: Any,
    *,
    serializer: Serializer,
    topic: str | None = None,
    table: str | TableRef = DEFAULT_TABLE,
    columns: OutboxColumns | None = None,
    event_id: uuid.UUID | str | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> uuid.UUID:
    """The asyncio twin of :func:`emit_encoded` (the serializer's registry call blocks)."""
    steps = _steps(conn, aggregate_type, aggregate_id, event_type, payload, serializer, topic,
                   {"table": table, "columns": columns, "event_id": event_id,
                    "traceparent": traceparent, "tracestate": tracestate})

    async def execute(query: Query) -> Any:
        cursor = await conn.execute(query.text, query.params)
        return await cursor.fetchone() if query.fetch else None

    result: uuid.UUID = await run_async(steps, execute)
    return result

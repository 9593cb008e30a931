"""The outbox for asyncpg services (docs/application-side.md).

``emit`` and ``process_once`` run the shared core's statements (cdc_relay/outbox_core.py)
with ``$n`` parameters on an asyncpg ``Connection`` (or a pool's connection proxy), in
its current transaction; ``emit_encoded`` writes a payload encoded through a schema
registry (the shared step of cdc_relay/outbox_encoded.py) into a ``bytea`` payload column.

Must not: open, commit or roll back a transaction (the event commits or vanishes with
the caller's ``async with conn.transaction():``), or open connections.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable
from typing import Any, Unpack

from cdc_relay.integrations import missing

try:
    import asyncpg  # noqa: F401 - only to say what to install when it is missing
except ImportError:
    raise missing("asyncpg", "asyncpg") from None

from cdc_relay import outbox_core as core
from cdc_relay.config import TableRef
from cdc_relay.outbox_encoded import Serializer, encoded_steps

__all__ = ["emit", "emit_encoded", "process_once"]

# asyncpg.Connection or a pool's PoolConnectionProxy (asyncpg ships no type hints).
Connection = Any


def _where(conn: Connection) -> Hashable:
    # asyncpg keeps the address and database only in private attributes; without them
    # the connection itself is the key (one trace column lookup per connection).
    params = getattr(conn, "_params", None)
    database = getattr(params, "database", None)
    address = getattr(conn, "_addr", None)
    if database is None or address is None:
        return ("connection", id(conn))
    return (repr(address), str(database))


async def _execute(conn: Connection, query: core.Query) -> Any:
    if query.fetch:
        return await conn.fetchrow(query.text, *query.params)
    return await conn.execute(query.text, *query.params)


async def emit(conn: Connection, aggregate_type: str, aggregate_id: str, event_type: str,
               payload: Any, **options: Unpack[core.EmitOptions]) -> uuid.UUID:
    """Insert one outbox event in the connection's transaction; return its id.

    Never commits: the event is published when the caller's transaction commits, never
    if it rolls back (outside a transaction it commits on its own). Options (``id``,
    ``table``, ``columns``, ``traceparent``, ...): see ``cdc_relay.outbox_core.EmitOptions``;
    same checks, errors and trace context as ``cdc_relay.outbox.emit``.
    """
    steps = core.emit_steps(aggregate_type, aggregate_id, event_type, payload, style="numeric",
                            where=lambda: _where(conn), **options)
    return await core.run_async(steps, lambda query: _execute(conn, query))


async def emit_encoded(conn: Connection, aggregate_type: str, aggregate_id: str, event_type: str,
                       payload: Any, *, serializer: Serializer, topic: str | None = None,
                       **options: Unpack[core.EmitOptions]) -> uuid.UUID:
    """:func:`emit` of a payload encoded by ``serializer`` (confluent-kafka's
    ``AvroSerializer``, ``JSONSerializer`` or ``ProtobufSerializer``) for ``topic`` (default
    ``outbox.event.<aggregate_type>``), as ``cdc_relay.outbox_encoded.emit_encoded``: the
    registry is asked (a blocking call) before any statement; the payload column must be
    ``bytea``."""
    steps = encoded_steps(aggregate_type, aggregate_id, event_type, payload, serializer=serializer,
                          topic=topic, style="numeric", where=lambda: _where(conn), **options)
    return await core.run_async(steps, lambda query: _execute(conn, query))


async def process_once(conn: Connection, event_id: uuid.UUID | str, *,
                       table: str | TableRef = core.DEFAULT_PROCESSED_TABLE) -> bool:
    """Mark ``event_id`` processed in the connection's transaction: True the first time
    (process the event), False for a redelivery. A rollback un-marks it."""
    steps = core.mark_steps(event_id, table=table, style="numeric")
    if not conn.is_in_transaction():
        raise core.transaction_required("`async with conn.transaction():`")
    return await core.run_async(steps, lambda query: _execute(conn, query))

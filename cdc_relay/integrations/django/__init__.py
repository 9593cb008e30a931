"""The outbox for Django services: an app (``INSTALLED_APPS``) and two calls (docs/application-side.md).

Add ``"cdc_relay.integrations.django"`` to ``INSTALLED_APPS`` and run ``migrate``: its
migration applies the same sql/ migrations as ``cdc-relay init`` (cdc_relay/pg/schema.py)
on Django's connection - the outbox table, its indexes, the dead-letter view and
``processed_events``, recorded so a later ``init`` (which adds what the relay mode
needs: the slot, or the polling trigger) changes nothing else. Settings, both optional:
``CDC_RELAY_TABLE`` (default ``"public.outbox_events"``) and ``CDC_RELAY_TRACE_CONTEXT``
(``True``: the ``traceparent`` / ``tracestate`` columns, as ``init --with-trace-context``).

``emit`` and ``process_once`` run the shared core's statements (cdc_relay/outbox_core.py)
on ``connections[using]``, in the current transaction: call them inside
``transaction.atomic()``. ``emit_encoded`` writes a payload encoded through a schema
registry (the shared step of cdc_relay/outbox_encoded.py) into a ``bytea`` payload column.

Must not: open, commit or roll back a transaction, or need a model (the outbox is the
relay's table, not an ORM entity). Needs Django's PostgreSQL backend on psycopg 3.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable
from typing import Any, Unpack

from cdc_relay.integrations import missing

try:
    from django.conf import settings
    from django.db import connections
except ImportError:
    raise missing("Django", "django") from None

from cdc_relay import outbox_core as core
from cdc_relay.config import OutboxConfig, TableRef, validated_table
from cdc_relay.outbox_encoded import Serializer, encoded_steps
from cdc_relay.pg.schema import PROCESSED_EVENTS_TABLE

__all__ = ["emit", "emit_encoded", "outbox_config", "process_once"]


def outbox_config() -> OutboxConfig:
    """The outbox of the settings (``CDC_RELAY_TABLE``)."""
    table = getattr(settings, "CDC_RELAY_TABLE", core.DEFAULT_TABLE)
    return OutboxConfig(table=validated_table(table))


def _where(using: str) -> Hashable:
    found = connections[using].settings_dict
    return (found.get("HOST"), found.get("PORT"), found.get("NAME"))


def _run(steps: Any, using: str) -> Any:
    with connections[using].cursor() as cursor:
        def execute(query: core.Query) -> Any:
            cursor.execute(query.text, query.params)
            return cursor.fetchone() if query.fetch else None

        return core.run_sync(steps, execute)


def emit(aggregate_type: str, aggregate_id: str, event_type: str, payload: Any, *,
         using: str = "default", **options: Unpack[core.EmitOptions]) -> uuid.UUID:
    """Insert one outbox event in the current transaction of ``using``; return its id.

    Inside ``transaction.atomic()`` the event commits with the block's other writes and
    vanishes if it rolls back (outside one, Django's autocommit commits it at once).
    ``table`` defaults to ``CDC_RELAY_TABLE``; the other options (``id``, ``columns``,
    ``traceparent``, ...): see ``cdc_relay.outbox_core.EmitOptions``. Same checks,
    errors and trace context as ``cdc_relay.outbox.emit``.
    """
    options.setdefault("table", outbox_config().table)
    steps = core.emit_steps(aggregate_type, aggregate_id, event_type, payload, style="format",
                            where=lambda: _where(using), **options)
    result: uuid.UUID = _run(steps, using)
    return result


def emit_encoded(aggregate_type: str, aggregate_id: str, event_type: str, payload: Any, *,
                 serializer: Serializer, topic: str | None = None, using: str = "default",
                 **options: Unpack[core.EmitOptions]) -> uuid.UUID:
    """:func:`emit` of a payload encoded by ``serializer`` (confluent-kafka's
    ``AvroSerializer``, ``JSONSerializer`` or ``ProtobufSerializer``) for ``topic`` (default
    ``outbox.event.<aggregate_type>``), as ``cdc_relay.outbox_encoded.emit_encoded``: the
    registry is asked before any statement; the payload column must be ``bytea``."""
    options.setdefault("table", outbox_config().table)
    steps = encoded_steps(aggregate_type, aggregate_id, event_type, payload, serializer=serializer,
                          topic=topic, style="format", where=lambda: _where(using), **options)
    result: uuid.UUID = _run(steps, using)
    return result


def process_once(event_id: uuid.UUID | str, *, using: str = "default",
                 table: str | TableRef | None = None) -> bool:
    """Mark ``event_id`` processed in the current ``atomic()`` block: True the first time
    (process the event), False for a redelivery. A rollback un-marks it. ``table``
    defaults to ``processed_events`` in the schema of ``CDC_RELAY_TABLE``."""
    if table is None:
        table = TableRef(outbox_config().table.schema, PROCESSED_EVENTS_TABLE)
    steps = core.mark_steps(event_id, table=table, style="format")
    connection = connections[using]
    if connection.get_autocommit() and not connection.in_atomic_block:
        raise core.transaction_required("`with transaction.atomic():`")
    result: bool = _run(steps, using)
    return result

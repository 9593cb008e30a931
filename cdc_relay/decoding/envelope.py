"""The tableless outbox's envelope: a logical decoding message's content -> OutboxEvent.

``outbox.emit_message`` writes ``pg_logical_emit_message(true, 'cdc-relay', <envelope>)``
where the envelope is one JSON object built by PostgreSQL itself (``json_build_object``)::

    {"v": 1, "id": "<uuid>", "aggregate_type": "...", "aggregate_id": "...",
     "event_type": "...", "payload": "<the payload's jsonb text>",
     "created_at": <epoch ms>, "traceparent": "..." | null, "tracestate": "..." | null}

The payload travels as the *text* of ``payload::jsonb`` (a JSON string inside the
envelope), so the event's payload bytes are jsonb's normal form: byte for byte what the
same payload inserted into the outbox table produces. ``created_at`` is
``clock_timestamp()`` at emit time in floor epoch milliseconds, as for a row.

Both decoders call ``decode_envelope``; it is pure and raises ValueError, naming the
problem, for anything that is not such an envelope (the decoder wraps it in a
DecodeError: the relay stops rather than skip an event).
"""

from __future__ import annotations

import orjson

from cdc_relay.model import Lsn, OutboxEvent

ENVELOPE_VERSION = 1
_TEXT_FIELDS = ("id", "aggregate_type", "aggregate_id", "event_type", "payload")


def decode_envelope(content: bytes, lsn: Lsn, extra_count: int = 0) -> OutboxEvent:
    """The OutboxEvent of one envelope; ``extra`` is ``extra_count`` Nones (no columns)."""
    try:
        envelope = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"cdc-relay logical decoding message is not JSON ({exc})") from exc
    if type(envelope) is not dict or envelope.get("v") != ENVELOPE_VERSION:
        raise ValueError(
            "cdc-relay logical decoding message is not a version-1 envelope: write events "
            "with cdc_relay.outbox.emit_message, and keep the 'cdc-relay' prefix for it"
        )
    texts = []
    for name in _TEXT_FIELDS:
        value = envelope.get(name)
        if type(value) is not str:
            raise ValueError(f"envelope field {name!r} is {value!r}, expected text")
        texts.append(value)
    created_at = envelope.get("created_at")
    if created_at is not None and type(created_at) is not int:
        raise ValueError(f"envelope field 'created_at' is {created_at!r}, expected epoch ms")
    trace = []
    for name in ("traceparent", "tracestate"):
        value = envelope.get(name)
        if value is not None and type(value) is not str:
            raise ValueError(f"envelope field {name!r} is {value!r}, expected text or null")
        trace.append(value)
    id_, aggregate_type, aggregate_id, event_type, payload = texts
    return OutboxEvent(
        id_, aggregate_type, aggregate_id, event_type, payload.encode(), created_at, lsn,
        extra=(None,) * extra_count, traceparent=trace[0], tracestate=trace[1],
    )

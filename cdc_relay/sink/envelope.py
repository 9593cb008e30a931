"""One relay Message as a JSON envelope: for receivers with no headers of their own.

A Kinesis record has only data and a partition key, and an HTTP batch carries many events
in one body: there the message's headers travel inside the body, as one JSON object per
message (docs/sinks.md, "The envelope"):

    {"topic": "outbox.event.order", "key": "order-1", "timestamp": 1700000000000,
     "headers": {"id": "...", "event_type": "OrderChanged", "aggregate_type": "order", ...},
     "payload": <the value>}

``payload`` is the value bytes the Kafka sink sends, embedded as they are when they are
JSON (every message format is), else as a string (``null`` for an empty value: a dead
letter whose payload was omitted). Header values are text (undecodable bytes replaced);
``timestamp`` is epoch milliseconds or null.

Pure: no I/O, no client library. Must not: decide what a refusal means for the event.
"""

from __future__ import annotations

from typing import Any

import orjson

from cdc_relay.model import Message


def payload_fragment(value: bytes) -> Any:
    """The value as it goes into an envelope: JSON embedded as is, else a string."""
    if not value:
        return None
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError:
        return value.decode("utf-8", "replace")
    return orjson.Fragment(value)


def envelope_object(message: Message) -> dict[str, Any]:
    """The envelope of ``message`` as a dict (its payload a JSON fragment)."""
    return {"topic": message.topic, "key": (message.key or b"").decode("utf-8", "replace"),
            "timestamp": message.timestamp_ms,
            "headers": {name: value.decode("utf-8", "replace") for name, value in message.headers},
            "payload": payload_fragment(message.value or b"")}


def envelope(message: Message) -> bytes:
    """The envelope of ``message`` as JSON bytes (module docstring)."""
    return orjson.dumps(envelope_object(message))


def envelopes(objects: list[dict[str, Any]]) -> bytes:
    """A JSON array of envelopes (an HTTP batch's body)."""
    return orjson.dumps(objects)

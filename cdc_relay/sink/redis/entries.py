"""One relay Message as one Redis stream entry: its stream, fields, aggregate and size.

Pure (no redis-py, no I/O), unit-tested on its own (docs/sinks.md, Redis Streams):

* stream = the message's topic (``--topic-pattern``'s result; the dead-letter topic for a
  dead letter);
* fields, in this order: the message's headers (``id`` first: the dedup key, then
  ``event_type``, ``aggregate_type``, trace context, ``--header`` columns, a dead letter's
  ``error`` and ``original_topic``), ``aggregate_id``, ``timestamp`` (epoch ms, when
  known) and ``payload`` (the value bytes the Kafka sink sends);
* size = the bytes of every field name and value; a message over ``max_message_bytes`` is
  a PERMANENT TOO_LARGE refusal (its dead letter omits the payload in WAL mode).

Must not: decide what a refusal means for the event (the loops do that).
"""

from __future__ import annotations

from cdc_relay.model import Message
from cdc_relay.sink.base import Cause, DeliveryError, ErrorKind
from cdc_relay.sink.planned import Outgoing


def build_entry(message: Message, max_bytes: int) -> Outgoing | DeliveryError:
    """The stream entry of ``message``, or the PERMANENT error that keeps it from being sent."""
    fields: dict[str, bytes] = {}
    for name, value in message.headers:
        fields[name] = value
    fields["aggregate_id"] = message.key or b""
    if message.timestamp_ms is not None:
        fields["timestamp"] = str(message.timestamp_ms).encode()
    fields["payload"] = message.value or b""
    size = sum(len(name) + len(value) for name, value in fields.items())
    if size > max_bytes:
        return DeliveryError(ErrorKind.PERMANENT, f"message too large: {size} bytes (fields and "
                             f"payload) > max_message_bytes {max_bytes}", Cause.TOO_LARGE)
    if not message.topic:
        return DeliveryError(ErrorKind.PERMANENT, "the stream name is empty (check --topic-pattern)")
    group = (message.key or b"").decode("utf-8", "replace")
    return Outgoing(message.topic, group, size, fields)

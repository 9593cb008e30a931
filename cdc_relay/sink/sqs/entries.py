"""One relay Message as one SendMessageBatch entry: body, attributes, group and deduplication ids, size.

Pure (no boto3, no I/O), so the mapping is unit-tested on its own (docs/sinks.md, Amazon SQS):

* body = the message's value bytes as text (the bytes the Kafka sink sends; SQS bodies are
  text, so a value that is not UTF-8, or holds a character SQS refuses, is a permanent
  refusal - a dead letter; an empty value - a dead letter whose payload was omitted - is
  the body ``null``, as SQS refuses an empty body);
* attributes = the message's headers (id, event_type, aggregate_type, trace context,
  ``--header`` columns; a dead letter's error and original_topic) plus ``aggregate_id``,
  each a ``String``, or ``Binary`` when the text holds a character SQS refuses; an empty
  value is left out (SQS refuses empty attribute values; a NULL column has no header either);
* on a FIFO queue (name ending in ``.fifo``): MessageGroupId = the aggregate id (per-aggregate
  order, aggregates in parallel; an id SQS would refuse as a group id - over 128 characters,
  or not printable ASCII - is replaced by ``sha256:`` and its hash, the same for every event
  of the aggregate), MessageDeduplicationId = the event id;
* size = what SQS counts against MaximumMessageSize: the body plus each attribute's name,
  data type and value, in bytes.

Must not: decide what a refusal means for the event (the loops do that).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from cdc_relay.model import Message
from cdc_relay.sink.base import Cause, DeliveryError, ErrorKind
from cdc_relay.sink.planned import Outgoing
from cdc_relay.sink.sqs.config import LARGEST_MESSAGE_BYTES, MAX_ATTRIBUTES, queue_name_problem

# Characters SQS accepts in a body or a String attribute (its documented XML character set).
_REFUSED_CHAR = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_GROUP_ID = re.compile(r"[\x21-\x7e]{1,128}")


class Entry(Outgoing):
    """A message made ready for SendMessageBatch: ``data`` its ``fields`` (without the batch
    entry's Id), ``group`` its MessageGroupId on a FIFO queue, else None."""

    __slots__ = ()

    @property
    def fields(self) -> dict[str, Any]:
        return self.data  # type: ignore[no-any-return]


def is_fifo(queue: str) -> bool:
    """SQS requires a FIFO queue's name to end in ``.fifo``, and only a FIFO queue's."""
    return queue.endswith(".fifo")


def group_id(key: bytes) -> str:
    """The MessageGroupId of an aggregate id (module docstring)."""
    text = key.decode("utf-8", "replace")
    if _GROUP_ID.fullmatch(text):
        return text
    return "sha256:" + hashlib.sha256(key).hexdigest()


def _attribute(value: bytes) -> tuple[dict[str, Any], int] | None:
    if not value:
        return None
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or _REFUSED_CHAR.search(text):
        return {"DataType": "Binary", "BinaryValue": value}, len(value) + 6
    return {"DataType": "String", "StringValue": text}, len(value) + 6


def build_entry(message: Message) -> Entry | DeliveryError:
    """The entry of ``message``, or the PERMANENT error that keeps it from ever being sent."""
    queue = message.topic
    problem = queue_name_problem(queue)
    if problem is not None:
        return DeliveryError(ErrorKind.PERMANENT, problem)
    try:
        body = (message.value or b"").decode("utf-8")
    except UnicodeDecodeError:
        return DeliveryError(ErrorKind.PERMANENT, "the message body is not UTF-8 text, which "
                             "SQS requires")
    body = body or "null"
    bad = _REFUSED_CHAR.search(body)
    if bad is not None:
        return DeliveryError(ErrorKind.PERMANENT, f"the message body holds character "
                             f"U+{ord(bad.group()):04X}, which SQS refuses")
    size = len(message.value or b"")
    attributes: dict[str, Any] = {}
    for name, value in [*message.headers, ("aggregate_id", message.key or b"")]:
        made = _attribute(value)
        if made is not None:
            attributes[name] = made[0]
            size += len(name) + made[1]
    if len(attributes) > MAX_ATTRIBUTES:
        return DeliveryError(ErrorKind.PERMANENT, f"{len(attributes)} message attributes (SQS "
                             f"allows {MAX_ATTRIBUTES}): " + ", ".join(attributes))
    if size > LARGEST_MESSAGE_BYTES:
        return too_large(size, LARGEST_MESSAGE_BYTES)
    fields: dict[str, Any] = {"MessageBody": body, "MessageAttributes": attributes}
    group = None
    if is_fifo(queue):
        group = group_id(message.key or b"")
        fields["MessageGroupId"] = group
        event_id = attributes.get("id", {}).get("StringValue")
        if event_id:
            fields["MessageDeduplicationId"] = event_id[:128]
    return Entry(queue, group, size, fields)


def too_large(size: int, limit: int) -> DeliveryError:
    """The PERMANENT error of a message over a queue's MaximumMessageSize."""
    return DeliveryError(ErrorKind.PERMANENT, f"message too large: {size} bytes (body and "
                         f"attributes) > the queue's MaximumMessageSize {limit}", Cause.TOO_LARGE)

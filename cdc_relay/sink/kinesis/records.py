"""One relay Message as one PutRecords entry: stream, partition key, data, size.

Pure (no boto3, no I/O), unit-tested on its own (docs/sinks.md, Amazon Kinesis):

* stream = the message's topic (``--topic-pattern``'s result; a name Kinesis refuses is a
  PERMANENT refusal: a dead letter);
* partition key = the aggregate id (each aggregate on one shard, in order); one Kinesis
  refuses (empty, or over 256 characters) becomes ``sha256:`` and its hash, the same for
  every event of the aggregate;
* data = the envelope (sink/envelope.py: topic, key, timestamp, headers - the event id
  among them - and the payload), or with ``record_format=value`` the value bytes alone;
* size = data plus partition key in bytes, what Kinesis counts against its 1 MiB per
  record (over it: PERMANENT TOO_LARGE) and 5 MiB per call.

Must not: decide what a refusal means for the event.
"""

from __future__ import annotations

import hashlib

from cdc_relay.model import Message
from cdc_relay.sink.base import Cause, DeliveryError, ErrorKind
from cdc_relay.sink.envelope import envelope
from cdc_relay.sink.kinesis.config import MAX_PARTITION_KEY, MAX_RECORD_BYTES, stream_name_problem
from cdc_relay.sink.planned import Outgoing


def partition_key(key: bytes) -> str:
    """The partition key of an aggregate id (module docstring)."""
    text = key.decode("utf-8", "replace")
    if 0 < len(text) <= MAX_PARTITION_KEY:
        return text
    return "sha256:" + hashlib.sha256(key).hexdigest()


def build_record(message: Message, record_format: str) -> Outgoing | DeliveryError:
    """The PutRecords entry of ``message``, or the PERMANENT error that keeps it from being sent."""
    problem = stream_name_problem(message.topic)
    if problem is not None:
        return DeliveryError(ErrorKind.PERMANENT, problem)
    data = envelope(message) if record_format == "envelope" else message.value or b""
    key = partition_key(message.key or b"")
    size = len(data) + len(key.encode())
    if size > MAX_RECORD_BYTES:
        return DeliveryError(ErrorKind.PERMANENT, f"message too large: {size} bytes (data and "
                             f"partition key) > Kinesis's {MAX_RECORD_BYTES} per record",
                             Cause.TOO_LARGE)
    return Outgoing(message.topic, key, size, {"Data": data, "PartitionKey": key})

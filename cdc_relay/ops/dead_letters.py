"""WAL mode's dead letters as read back from the dead-letter topic: choose, rebuild, show.

In WAL mode a dead letter lives only in the dead-letter topic (the outbox row may be
gone). The loop writes it with ``Router.dead_letter``: the original key, value and
timestamp, the original headers, then ``error`` and ``original_topic`` appended (and
``payload_omitted_bytes`` with an empty value when the payload itself was too large).
This module turns such records back into the message that was meant to be sent:

* ``replay_message``: the original headers (the appended ones stripped from the end, so
  an application header of the same name survives), key, value and timestamp; the topic
  is routed again with the current ``--topic-pattern`` (a pattern that made an illegal
  topic may have been fixed) or, with ``to_original``, the ``original_topic`` header;
* ``select``: one record per event id (the last one read: a replayed event that failed
  again is dead-lettered again), all of them or the ids asked for - an unknown id is a
  ConfigError before anything is sent.

The ``id`` header is kept, so consumers deduplicate a replay like any redelivery.
Reading and producing are sink/kafka/dead_letters.py. Must not do I/O or import a
broker client.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

import orjson

from cdc_relay.errors import ConfigError
from cdc_relay.model import Message, OutboxEvent, TopicDeadLetter
from cdc_relay.routing import Router, RoutingError


def select(records: Iterable[TopicDeadLetter], ids: Sequence[str] | None,
           topic: str) -> list[TopicDeadLetter]:
    """One record per event id (the last read), in topic order; ``ids=None`` = all of them.

    Raises ConfigError naming the ids not in the topic (nothing is replayed then).
    """
    latest: dict[str, TopicDeadLetter] = {}
    for record in records:
        if record.id:
            latest.pop(record.id, None)
            latest[record.id] = record
    if ids is None:
        return list(latest.values())
    wanted = [str(i).lower() for i in ids]
    unknown = [i for i in wanted if i not in latest]
    if unknown:
        raise ConfigError(f"no dead letter with id {', '.join(unknown)} in topic {topic!r}: "
                          f"`cdc-relay dead-letters list --from-topic {topic}` shows them")
    return [latest[i] for i in dict.fromkeys(wanted)]


def replay_message(record: TopicDeadLetter, router: Router, *, to_original: bool) -> Message:
    """The message to send again (see the module docstring).

    Raises ConfigError when it cannot be rebuilt: the payload was omitted, the record
    lacks the headers the relay writes, or the topic is still illegal.
    """
    omitted = record.payload_omitted
    if omitted is not None:
        raise ConfigError(f"dead letter {record.id} carries no payload (the broker refused its "
                          f"{omitted} bytes as too large): republish it from the outbox row")
    headers = record.original_headers
    if to_original:
        topic = record.header("original_topic")
        if not topic:
            raise ConfigError(f"dead letter {record.id} has no original_topic header")
    else:
        topic = _route(record, router)
    key = record.key if record.key is not None else b""
    return Message(topic, key, record.value or b"", headers, record.timestamp_ms)


def _route(record: TopicDeadLetter, router: Router) -> str:
    aggregate_type, event_type = record.header("aggregate_type"), record.header("event_type")
    if aggregate_type is None or event_type is None:
        raise ConfigError(f"dead letter at offset {record.offset} lacks the aggregate_type and "
                          "event_type headers: it was not written by cdc-relay (use --to-original)")
    event = OutboxEvent(record.id, aggregate_type, (record.key or b"").decode("utf-8", "replace"),
                        event_type, record.value or b"", record.timestamp_ms)
    try:
        return router.route(event).topic
    except RoutingError as exc:
        raise ConfigError(f"dead letter {record.id} still has no legal topic: {exc.reason}; fix "
                          "--topic-pattern (or use --to-original)") from exc


def _when(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def to_dicts(records: Iterable[TopicDeadLetter]) -> list[dict[str, object]]:
    return [{
        "id": r.id, "partition": r.partition, "offset": r.offset,
        "original_topic": r.header("original_topic"), "aggregate_type": r.header("aggregate_type"),
        "aggregate_id": None if r.key is None else r.key.decode("utf-8", "replace"),
        "event_type": r.header("event_type"), "error": r.header("error"),
        "payload_omitted_bytes": r.payload_omitted, "created_at": _when(r.timestamp_ms),
    } for r in records]


def records_json(records: Iterable[TopicDeadLetter]) -> str:
    """A JSON array, one object per record (``dead-letters list --from-topic --format json``)."""
    return orjson.dumps(to_dicts(records), option=orjson.OPT_INDENT_2).decode()


def records_table(records: Sequence[TopicDeadLetter], topic: str) -> str:
    """One line per record, for people."""
    if not records:
        return f"no dead letters in {topic}"
    lines = []
    for row in to_dicts(records):
        lines.append(f"{row['id']}  {row['original_topic']}  {row['aggregate_type']}/"
                     f"{row['aggregate_id']}  {row['event_type']}  {row['created_at']}  "
                     f"error: {row['error']}")
    return "\n".join(lines)

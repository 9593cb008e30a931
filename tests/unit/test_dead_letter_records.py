"""Rebuilding WAL mode's dead letters from the topic for a replay."""

from __future__ import annotations

import pytest

from cdc_relay.config import RouterConfig
from cdc_relay.errors import ConfigError
from cdc_relay.model import OutboxEvent, TopicDeadLetter
from cdc_relay.ops.dead_letters import records_json, replay_message, select
from cdc_relay.routing import Router

ROUTER = Router(RouterConfig(topic_pattern="fixed.{event_type}", dead_letter_topic="dlq"))
ID = "7616f707-0000-4000-8000-000000000001"


def dead_letter(event_id: str = ID, *, offset: int = 0, aggregate_type: str = "bad type",
                extra: list[tuple[str, bytes]] | None = None) -> TopicDeadLetter:
    """What WAL mode writes: the routed message's dead-letter form (Router.dead_letter)."""
    event = OutboxEvent(event_id, aggregate_type, "o-1", "Placed", b'{"n": 1}', 1796037824024)
    writer = Router(RouterConfig(topic_pattern="outbox.{aggregate_type}", dead_letter_topic="dlq"))
    message = writer.dead_letter(event, "topic name 'outbox.bad type' contains ' '")
    headers = [*(extra or []), *message.headers]
    return TopicDeadLetter(0, offset, message.key, message.value, tuple(headers),
                           message.timestamp_ms)


def test_a_replay_carries_the_original_id_key_value_headers_and_timestamp() -> None:
    record = dead_letter(extra=[("error", b"an application header of that name")])
    message = replay_message(record, ROUTER, to_original=False)
    assert message.topic == "fixed.Placed"  # routed again with the fixed pattern
    assert message.key == b"o-1" and message.value == b'{"n": 1}'
    assert message.timestamp_ms == 1796037824024
    assert message.headers == [("error", b"an application header of that name"),
                               ("id", ID.encode()), ("event_type", b"Placed"),
                               ("aggregate_type", b"bad type")]


def test_to_original_uses_the_original_topic_header() -> None:
    record = dead_letter(aggregate_type="order")
    assert replay_message(record, ROUTER, to_original=True).topic == "outbox.order"


def test_a_topic_that_is_still_illegal_is_refused() -> None:
    router = Router(RouterConfig(topic_pattern="again.{aggregate_type}", dead_letter_topic="dlq"))
    with pytest.raises(ConfigError, match="still has no legal topic"):
        replay_message(dead_letter(), router, to_original=False)


def test_a_dead_letter_without_its_payload_cannot_be_replayed() -> None:
    record = dead_letter()
    record = TopicDeadLetter(0, 0, record.key, b"", (*record.headers,
                             ("payload_omitted_bytes", b"2000000")), None)
    with pytest.raises(ConfigError, match="2000000 bytes"):
        replay_message(record, ROUTER, to_original=False)


def test_select_keeps_the_last_record_of_each_id_and_refuses_unknown_ids() -> None:
    other = "7616f707-0000-4000-8000-000000000002"
    records = [dead_letter(offset=0), dead_letter(other, offset=1), dead_letter(offset=2)]
    assert [(r.id, r.offset) for r in select(records, None, "dlq")] == [(other, 1), (ID, 2)]
    assert [r.offset for r in select(records, [ID.upper()], "dlq")] == [2]
    with pytest.raises(ConfigError, match="no dead letter with id 00000000"):
        select(records, ["00000000-0000-4000-8000-000000000000"], "dlq")


def test_records_json_names_the_cause_and_the_original_topic() -> None:
    text = records_json([dead_letter()])
    assert '"original_topic": "outbox.bad type"' in text and "contains" in text

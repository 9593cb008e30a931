"""The Redis sink without a server: entries, settings, how XADD replies settle entries (a fake client)."""

from __future__ import annotations

from typing import Any

import pytest
import redis.exceptions

from cdc_relay.errors import ConfigError
from cdc_relay.model import Message
from cdc_relay.sink.base import Cause, Delivery, DeliveryError, ErrorKind, collect
from cdc_relay.sink.planned import Outgoing
from cdc_relay.sink.redis.config import parse_redis
from cdc_relay.sink.redis.entries import build_entry
from cdc_relay.sink.redis.sink import RedisSink


def message(n: int, key: str = "a-1", topic: str = "outbox.event.order") -> Message:
    return Message(topic, key.encode(), b'{"n":%d}' % n, [("id", f"e-{n}".encode()),
                                                         ("event_type", b"OrderChanged")], 1_700)


def config(*items: str) -> Any:
    return parse_redis("redis://127.0.0.1:6379/0", list(items), topic_pattern="outbox.event.{aggregate_type}",
                       dead_letter_topic="outbox.dead-letters")


def test_an_entry_holds_the_headers_then_aggregate_id_timestamp_and_payload() -> None:
    entry = build_entry(message(1), 1 << 20)
    assert isinstance(entry, Outgoing)
    assert list(entry.data) == ["id", "event_type", "aggregate_id", "timestamp", "payload"]
    assert entry.data["payload"] == b'{"n":1}' and entry.data["timestamp"] == b"1700"
    assert entry.queue == "outbox.event.order" and entry.group == "a-1"


def test_an_entry_over_max_message_bytes_is_a_permanent_too_large_refusal() -> None:
    refused = build_entry(message(1), 20)
    assert isinstance(refused, DeliveryError)
    assert refused.kind is ErrorKind.PERMANENT and refused.cause is Cause.TOO_LARGE


@pytest.mark.parametrize(("brokers", "items", "words"), [
    ("amqp://h:1/", [], "redis://"),
    ("redis://h:1", ["maxlen=-1"], "non-negative"),
    ("redis://h:1", ["nope=1"], "unknown --sink-config key 'nope'"),
    ("redis://h:1", ["tls_ca_file=/no/such"], "no such file"),
])
def test_bad_settings_are_config_errors_naming_the_fix(brokers: str, items: list[str],
                                                       words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_redis(brokers, items, topic_pattern="t", dead_letter_topic="d")


def test_a_header_named_like_an_entry_field_is_refused() -> None:
    with pytest.raises(ConfigError, match="rename it with COLUMN:NAME"):
        parse_redis("redis://h:1", [], topic_pattern="t", dead_letter_topic="d",
                    header_names=["payload"])


class FakePipeline:
    def __init__(self, replies: list[Any]) -> None:
        self.replies, self.sent = replies, []  # type: ignore[var-annotated]

    def xadd(self, name: str, fields: dict[str, bytes], **options: Any) -> None:
        self.sent.append((name, options))

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        return self.replies


class FakeClient:
    def __init__(self, *batches: list[Any]) -> None:
        self.batches = list(batches)
        self.pipelines: list[FakePipeline] = []

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        self.pipelines.append(FakePipeline(self.batches.pop(0)))
        return self.pipelines[-1]

    def close(self) -> None:
        pass


def send(replies: list[Any], *items: str) -> tuple[RedisSink, list[Delivery]]:
    got: list[Delivery] = []
    sink = RedisSink(config(*items), collect(got))
    sink._client = FakeClient(replies)
    for n in range(len(replies)):
        sink.produce(message(n, key=f"a-{n}"), n)
    with sink._cond:
        batch = sink._planner.take(0.0, {}, 1 << 20)
    sink._send(batch, [sink._items[p.seq] for p in batch])
    sink.poll(0)
    return sink, got


def test_each_reply_settles_its_entry_wrongtype_is_permanent_and_oom_is_sent_again() -> None:
    sink, got = send([b"1-0", redis.exceptions.ResponseError("WRONGTYPE Operation against a key"),
                      redis.exceptions.ResponseError("OOM command not allowed")], "maxlen=5")
    by_token = {d.token: d.error for d in got}
    assert by_token[0] is None
    wrong = by_token[1]
    assert wrong is not None and wrong.kind is ErrorKind.PERMANENT and "WRONGTYPE" in wrong.reason
    assert 2 not in by_token and sink.pending() == 1  # waits to be sent again
    assert sink._planner.waiting_count() == 1
    assert sink._client.pipelines[0].sent[0][1] == {"maxlen": 5, "approximate": True}


def test_a_noperm_reply_refuses_the_sink_and_reports_nothing_unsent() -> None:
    sink, got = send([b"1-0", redis.exceptions.NoPermissionError("NOPERM no permissions")])
    assert [d.token for d in got] == [0]
    assert sink.fatal_error is not None and "refused the relay" in sink.fatal_error.reason

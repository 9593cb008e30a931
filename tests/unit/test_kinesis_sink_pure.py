"""The Kinesis sink without a server: records, settings, and how PutRecords results settle records
(a fake client): a record failed for throughput is sent again alone and its key's later
records are neither sent nor acknowledged before it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from cdc_relay.errors import ConfigError
from cdc_relay.model import Message
from cdc_relay.sink.base import Cause, Delivery, DeliveryError, ErrorKind, collect
from cdc_relay.sink.kinesis.config import parse_kinesis
from cdc_relay.sink.kinesis.records import build_record, partition_key
from cdc_relay.sink.kinesis.sink import KinesisSink
from cdc_relay.sink.planned import Outgoing

STREAM = "outbox.event.order"


def message(name: str, key: str, size: int = 10) -> Message:
    return Message(STREAM, key.encode(), b'{"p":"' + b"x" * size + b'"}',
                   [("id", name.encode()), ("event_type", b"OrderChanged")], 1_700)


def config(*items: str) -> Any:
    return parse_kinesis("http://127.0.0.1:1", ["region=us-east-1", *items],
                         topic_pattern="outbox.event.{aggregate_type}",
                         dead_letter_topic="outbox.dead-letters")


def test_a_record_is_the_envelope_keyed_by_the_aggregate_id() -> None:
    record = build_record(message("e-1", "order-1"), "envelope")
    assert isinstance(record, Outgoing)
    assert record.data["PartitionKey"] == "order-1" and record.group == "order-1"
    envelope = orjson.loads(record.data["Data"])
    assert envelope["headers"]["id"] == "e-1" and envelope["payload"] == {"p": "x" * 10}
    value = build_record(message("e-1", "order-1"), "value")
    assert isinstance(value, Outgoing) and value.data["Data"] == b'{"p":"xxxxxxxxxx"}'


def test_a_partition_key_kinesis_refuses_is_hashed_the_same_for_every_event() -> None:
    long_key = b"k" * 300
    assert partition_key(long_key) == partition_key(long_key)
    assert partition_key(long_key).startswith("sha256:") and len(partition_key(long_key)) < 256
    assert partition_key(b"").startswith("sha256:")


def test_a_record_over_1_mib_is_a_permanent_too_large_refusal() -> None:
    refused = build_record(message("e-1", "k", size=1_048_576), "envelope")
    assert isinstance(refused, DeliveryError)
    assert refused.kind is ErrorKind.PERMANENT and refused.cause is Cause.TOO_LARGE


@pytest.mark.parametrize(("brokers", "items", "words"), [
    ("amqp://h", [], "kinesis://REGION"),
    ("kinesis://eu-west-1", ["region=us-east-1"], "disagree"),
    ("kinesis://eu-west-1", ["batch_size=501"], "at most 500"),
    ("kinesis://eu-west-1", ["record_format=xml"], "envelope"),
])
def test_bad_settings_are_config_errors_naming_the_fix(brokers: str, items: list[str],
                                                       words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_kinesis(brokers, items, topic_pattern="a.{aggregate_type}", dead_letter_topic="d")


def test_an_illegal_dead_letter_stream_is_refused_at_start_up() -> None:
    with pytest.raises(ConfigError, match="not legal in Kinesis"):
        parse_kinesis("kinesis://eu-west-1", [], topic_pattern="a.{aggregate_type}",
                      dead_letter_topic="dead letters")


class FakeKinesis:
    """Answers PutRecords from a script: a set of ids to fail for throughput, once each."""

    def __init__(self, fail_once: set[str]) -> None:
        self.fail_once = fail_once
        self.calls: list[list[str]] = []

    def put_records(self, StreamName: str, Records: list[dict[str, Any]]) -> dict[str, Any]:
        ids = [orjson.loads(r["Data"])["headers"]["id"] for r in Records]
        self.calls.append(ids)
        results = []
        for event_id in ids:
            if event_id in self.fail_once:
                self.fail_once.discard(event_id)
                results.append({"ErrorCode": "ProvisionedThroughputExceededException",
                                "ErrorMessage": "Rate exceeded for shard"})
            else:
                results.append({"SequenceNumber": "1", "ShardId": "shardId-0"})
        return {"FailedRecordCount": sum("ErrorCode" in r for r in results), "Records": results}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drive(sink: KinesisSink, clock: Clock, rounds: int) -> None:
    """Take and send one batch per round, the clock past any backoff each time."""
    for _ in range(rounds):
        with sink._cond:
            batch = sink._planner.take(clock(), {}, sink.default_limit)
        if batch:
            sink._send(batch, [sink._items[p.seq] for p in batch])
        clock.now += 10.0


def test_a_throttled_record_is_sent_again_alone_and_its_keys_later_records_wait_for_it() -> None:
    got: list[Delivery] = []
    clock = Clock()
    fake = FakeKinesis(fail_once={"a1"})
    sink = KinesisSink(config(), collect(got), client=fake, clock=clock)
    for token, (name, key) in enumerate([("a1", "A"), ("a2", "A"), ("b1", "B"), ("a3", "A")]):
        sink.produce(message(name, key), token)
    drive(sink, clock, rounds=5)
    sink.poll(0)
    # a1 failed in the first call, with b1 stored; a2 was in no call before a1 was stored
    assert fake.calls == [["a1", "b1"], ["a1"], ["a2"], ["a3"]]
    assert [d.token for d in got] == [2, 0, 1, 3] and all(d.error is None for d in got)


def test_a_kms_access_refusal_of_one_record_refuses_the_sink() -> None:
    class Refusing(FakeKinesis):
        def put_records(self, StreamName: str, Records: list[dict[str, Any]]) -> dict[str, Any]:
            return {"Records": [{"ErrorCode": "KMSAccessDeniedException", "ErrorMessage": "no"}]}

    got: list[Delivery] = []
    sink = KinesisSink(config(), collect(got), client=Refusing(set()), clock=Clock())
    sink.produce(message("a1", "A"), 0)
    drive(sink, Clock(), rounds=1)
    sink.poll(0)
    assert got == [] and sink.fatal_error is not None
    assert "kinesis:PutRecords" in sink.fatal_error.reason

"""The SQS sink's pure parts: settings, the entry of a message, the batch planner's order rule;
and the sink's handling of a SendMessageBatch reply with Failed entries (a fake client)."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_relay.cli.sink_options import sink_settings, sink_topics
from cdc_relay.errors import ConfigError
from cdc_relay.model import Message
from cdc_relay.sink.base import Cause, Delivery, ErrorKind, collect
from cdc_relay.sink.batches import MAX_ENTRIES, Pending, Planner
from cdc_relay.sink.sqs.config import (
    DEFAULT_DEAD_LETTER_QUEUE,
    DEFAULT_QUEUE_PATTERN,
    MAX_HEADER_COLUMNS,
    parse_sqs,
)
from cdc_relay.sink.sqs.entries import Entry, build_entry


def parse(brokers: str = "http://127.0.0.1:4566", *items: str, headers: tuple[str, ...] = ()) -> Any:
    return parse_sqs(brokers, list(items), topic_pattern=DEFAULT_QUEUE_PATTERN,
                     dead_letter_topic=DEFAULT_DEAD_LETTER_QUEUE, header_names=headers)


# ---------------------------------------------------------------- settings

def test_kafkas_default_names_become_sqs_queue_names_and_given_names_stay() -> None:
    assert sink_topics("sqs", "outbox.event.{aggregate_type}", "outbox.dead-letters") == (
        "outbox-event-{aggregate_type}.fifo", "outbox-dead-letters.fifo")
    assert sink_topics("sqs", "ev-{aggregate_type}", "dl") == ("ev-{aggregate_type}", "dl")
    assert sink_topics("kafka", "a.{aggregate_type}", "b") == ("a.{aggregate_type}", "b")


def test_the_address_is_an_endpoint_or_a_region() -> None:
    assert (parse().endpoint_url, parse().region) == ("http://127.0.0.1:4566", None)
    config = parse("sqs://eu-west-1", "concurrency=2")
    assert (config.endpoint_url, config.region, config.concurrency) == (None, "eu-west-1", 2)
    assert parse("https://sqs.eu-west-1.amazonaws.com", "region=eu-west-1").region == "eu-west-1"


@pytest.mark.parametrize(("brokers", "items", "message"), [
    ("localhost:9092", (), "expected sqs://REGION"),
    ("sqs://nowhere", (), "expected sqs://REGION"),
    ("sqs://eu-west-1", ("region=us-east-1",), "disagree"),
    ("http://h:1", ("exchange=x",), "unknown --sink-config key 'exchange'"),
    ("http://h:1", ("concurrency=0",), "expected a positive number"),
])
def test_bad_settings_are_one_clear_config_error(brokers: str, items: tuple[str, ...],
                                                 message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(brokers, *items)


def test_header_columns_beyond_the_attribute_limit_or_with_illegal_names_are_refused() -> None:
    assert MAX_HEADER_COLUMNS == 1  # 10 attributes, 9 of them the relay's own
    assert parse(headers=("tenant",)).endpoint_url
    with pytest.raises(ConfigError, match="do not fit SQS's 10 message attributes"):
        parse(headers=("tenant", "region"))
    for bad in ("AWS.x", "a..b", "tenant!", "id"):
        with pytest.raises(ConfigError, match="--header name"):
            parse(headers=(bad,))


def test_illegal_queue_names_are_refused_at_start_up() -> None:
    with pytest.raises(ConfigError, match="--topic-pattern"):
        parse_sqs("http://h:1", [], topic_pattern="outbox.{aggregate_type}",
                  dead_letter_topic="dlq")
    with pytest.raises(ConfigError, match="dead-letter queue"):
        parse_sqs("http://h:1", [], topic_pattern="q-{aggregate_type}", dead_letter_topic="d.q")


def test_sink_settings_builds_the_sqs_config_with_the_header_names() -> None:
    with pytest.raises(ConfigError, match="do not fit"):
        sink_settings("sqs", "sqs://eu-west-1", (), (), topic_pattern=DEFAULT_QUEUE_PATTERN,
                      dead_letter_topic="d", message_timeout=5, header=("a", "b:c"))
    config = sink_settings("sqs", "sqs://eu-west-1", (), (), topic_pattern=DEFAULT_QUEUE_PATTERN,
                           dead_letter_topic="d", message_timeout=5, header=("a",))
    assert config is not None and config.message_timeout_ms == 5000  # type: ignore[union-attr]


# ---------------------------------------------------------------- entries

def message(queue: str = "q-order.fifo", key: bytes = b"order-1", value: bytes = b'{"a":1}',
            headers: list[tuple[str, bytes]] | None = None) -> Message:
    return Message(queue, key, value, headers if headers is not None else [
        ("id", b"e-1"), ("event_type", b"OrderPlaced"), ("aggregate_type", b"order")], 1)


def test_a_fifo_entry_groups_by_aggregate_and_deduplicates_by_event_id() -> None:
    entry = build_entry(message())
    assert isinstance(entry, Entry)
    assert entry.fields["MessageBody"] == '{"a":1}'
    assert entry.fields["MessageGroupId"] == "order-1" == entry.group
    assert entry.fields["MessageDeduplicationId"] == "e-1"
    assert entry.fields["MessageAttributes"]["aggregate_id"] == {
        "DataType": "String", "StringValue": "order-1"}
    assert entry.size == len(b'{"a":1}') + sum(
        len(n) + 6 + len(v) for n, v in [("id", "e-1"), ("event_type", "OrderPlaced"),
                                         ("aggregate_type", "order"), ("aggregate_id", "order-1")])


def test_a_standard_entry_has_no_group_or_dedup_id() -> None:
    entry = build_entry(message("q-order"))
    assert isinstance(entry, Entry) and entry.group is None
    assert "MessageGroupId" not in entry.fields and "MessageDeduplicationId" not in entry.fields


def test_odd_aggregate_ids_get_a_stable_hashed_group_and_odd_values_a_binary_attribute() -> None:
    one, two = build_entry(message(key="Bestellung 7 ✓".encode())), build_entry(
        message(key="Bestellung 7 ✓".encode()))
    assert isinstance(one, Entry) and isinstance(two, Entry)
    assert one.group == two.group and one.group is not None and one.group.startswith("sha256:")
    odd = build_entry(message(headers=[("id", b"e"), ("note", b"bell\x07"), ("empty", b"")]))
    assert isinstance(odd, Entry)
    attributes = odd.fields["MessageAttributes"]
    assert attributes["note"] == {"DataType": "Binary", "BinaryValue": b"bell\x07"}
    assert "empty" not in attributes  # SQS refuses empty values


@pytest.mark.parametrize(("msg", "reason"), [
    (message(queue="q.order.fifo"), "not legal in SQS"),
    (message(value=b"\xff"), "not UTF-8"),
    (message(value=b'"\x01"'), "U+0001"),
    (message(headers=[(f"h{i}", b"v") for i in range(10)]), "11 message attributes"),
    (message(value=b"x" * (1 << 20)), "too large"),
])
def test_what_sqs_can_never_take_is_permanent(msg: Message, reason: str) -> None:
    error = build_entry(msg)
    assert not isinstance(error, Entry)
    assert error.kind is ErrorKind.PERMANENT and reason in error.reason


def test_an_empty_value_a_dead_letter_without_its_payload_is_the_body_null() -> None:
    entry = build_entry(message(value=b""))
    assert isinstance(entry, Entry) and entry.fields["MessageBody"] == "null"


# ---------------------------------------------------------------- the planner

def test_a_batch_takes_one_entry_per_group_up_to_ten_within_the_byte_limit() -> None:
    planner = Planner()
    for seq in range(30):
        planner.add(Pending(seq, "q.fifo", f"g{seq % 12}", 100))
    first = planner.take(0.0, {}, 10_000)
    assert [p.seq for p in first] == list(range(MAX_ENTRIES))
    second = planner.take(0.0, {}, 10_000)
    assert [p.seq for p in second] == [10, 11]  # g0..g9 are busy
    planner.settle(first, [], 0.0)
    assert [p.seq for p in planner.take(0.0, {"q.fifo": 350}, 10_000)] == [12, 13, 14]


def test_an_entry_sent_again_holds_back_its_group_until_it_is_done() -> None:
    planner = Planner()
    for seq in range(4):
        planner.add(Pending(seq, "q.fifo", "g" if seq < 3 else "h", 1))
    batch = planner.take(0.0, {}, 100)
    assert [p.seq for p in batch] == [0, 3]
    planner.settle([batch[1]], [batch[0]], retry_at=5.0)
    assert planner.take(1.0, {}, 100) == []  # 1 and 2 wait behind 0
    assert [p.seq for p in planner.take(5.0, {}, 100)] == [0]


def test_standard_queue_entries_are_not_held_back_by_each_other() -> None:
    planner = Planner()
    for seq in range(12):
        planner.add(Pending(seq, "q", None, 1))
    assert len(planner.take(0.0, {}, 100)) == MAX_ENTRIES
    assert [p.seq for p in planner.take(0.0, {}, 100)] == [10, 11]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=60),
       st.randoms(use_true_random=False))
def test_whatever_fails_each_groups_entries_are_delivered_in_seq_order(
        items: list[tuple[int, bool]], rnd: random.Random) -> None:
    planner = Planner()
    for seq, (group, _) in enumerate(items):
        planner.add(Pending(seq, "q.fifo", f"g{group}", 1))
    delivered: list[Pending] = []
    in_flight: list[list[Pending]] = []
    now = 0.0
    while len(delivered) < len(items):
        now += 1.0
        batch = planner.take(now, {}, 1000)
        if batch:
            in_flight.append(batch)
        if in_flight and (not batch or rnd.random() < 0.5):
            done = in_flight.pop(rnd.randrange(len(in_flight)))  # replies in any order
            failed = [p for p in done if items[p.seq][1] and p.attempts == 0 and rnd.random() < 0.7]
            ok = [p for p in done if p not in failed]
            delivered.extend(ok)
            planner.settle(ok, failed, now + rnd.choice([0.0, 2.0]))
    for group in range(5):
        seqs = [p.seq for p in delivered if p.group == f"g{group}"]
        assert seqs == sorted(seqs)


# ---------------------------------------------------------------- the sink's reply handling

class FakeSqs:
    """A fake boto3 SQS client: Failed (not the sender's fault) for listed bodies, once each."""

    def __init__(self, fail_once: set[str]) -> None:
        self.fail_once = set(fail_once)
        self.sent: list[list[str]] = []
        self.lock = threading.Lock()

    def get_queue_url(self, QueueName: str) -> dict[str, str]:
        return {"QueueUrl": f"http://fake/{QueueName}"}

    def get_queue_attributes(self, QueueUrl: str, AttributeNames: list[str]) -> dict[str, Any]:
        return {"Attributes": {"MaximumMessageSize": "262144"}}

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        with self.lock:
            self.sent.append([e["MessageBody"] for e in Entries])
            ok, failed = [], []
            for e in Entries:
                if e["MessageBody"] in self.fail_once:
                    self.fail_once.discard(e["MessageBody"])
                    failed.append({"Id": e["Id"], "SenderFault": False, "Code": "InternalError",
                                   "Message": "try again"})
                elif e["MessageBody"] == '"refused"':
                    failed.append({"Id": e["Id"], "SenderFault": True, "Code": "MessageTooLong",
                                   "Message": "too long"})
                else:
                    ok.append({"Id": e["Id"], "MessageId": "m"})
            return {"Successful": ok, "Failed": failed}


def test_failed_entries_alone_are_sent_again_and_their_group_waits_for_them() -> None:
    from cdc_relay.sink.sqs.sink import SqsSink

    client = FakeSqs(fail_once={"1"})
    got: list[Delivery] = []
    sink = SqsSink(parse("http://fake:1", "concurrency=1"), collect(got), client=client)
    group = {0: "a", 1: "a", 2: "a", 3: "b", 4: "c"}
    for n in range(5):
        sink.produce(Message("q-x.fifo", group[n].encode(), str(n).encode(), [("id", b"%d" % n)]), n)
    sink.produce(Message("q-x.fifo", b"d", b'"refused"', [("id", b"r")]), 5)
    sink.warm_up(5.0)
    deadline = time.monotonic() + 10
    while len(got) < 6 and time.monotonic() < deadline:
        sink.poll(0.05)
    sink.close(1.0)
    assert {d.token for d in got if d.error is None} == {0, 1, 2, 3, 4}
    [refused] = [d for d in got if d.error is not None]
    assert refused.token == 5 and refused.error is not None
    assert refused.error.kind is ErrorKind.PERMANENT and refused.error.cause is Cause.TOO_LARGE
    order_of_a = [body for batch in client.sent for body in batch if body in ("0", "1", "2")]
    assert order_of_a == ["0", "1", "1", "2"]  # 1 failed once and was sent again before 2
    assert all(len([b for b in batch if b in ("0", "1", "2")]) <= 1 for batch in client.sent)
    assert sum(batch.count("3") for batch in client.sent) == 1  # never sent again


def client_error(code: str, operation: str, status: int = 400) -> Exception:
    import botocore.exceptions

    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        operation)


class NoQueuesSqs(FakeSqs):
    """A fake SQS client with no queue at all; ``list_refused``: ListQueues is denied."""

    def __init__(self, list_refused: bool = False) -> None:
        super().__init__(set())
        self.list_refused = list_refused

    def get_queue_url(self, QueueName: str) -> dict[str, str]:
        raise client_error("AWS.SimpleQueueService.NonExistentQueue", "GetQueueUrl")

    def list_queues(self, QueueNamePrefix: str) -> dict[str, Any]:
        if self.list_refused:
            raise client_error("AccessDenied", "ListQueues", 403)
        return {"ResponseMetadata": {"HTTPStatusCode": 200}}  # SQS's answer: no QueueUrls key


def test_a_missing_queue_is_reported_with_the_command_that_creates_it() -> None:
    from cdc_relay.sink.sqs.sink import SqsSink

    got: list[Delivery] = []
    sink = SqsSink(parse("http://fake:1", "concurrency=1"), collect(got), client=NoQueuesSqs())
    sink.produce(Message("q-x.fifo", b"a", b"1", [("id", b"1")]), 0)
    sink.warm_up(5.0)
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        sink.poll(0.05)
    sink.close(0)
    [missing] = got
    assert missing.error is not None and missing.error.cause is Cause.TOPIC_MISSING
    assert missing.error.reason == ("queue 'q-x.fifo' does not exist: create it (aws sqs "
                                    "create-queue --queue-name q-x.fifo --attributes "
                                    "FifoQueue=true; docs/sinks.md)")


def test_doctor_with_no_queues_yet_names_the_queues_run_needs_not_a_permission() -> None:
    from cdc_relay.sink.sqs.probe import probe_sqs

    found = {p.name: p for p in probe_sqs(parse(), 5.0, client=NoQueuesSqs())}
    queues = found["queues"]
    assert queues.ok is None and "ListQueues" not in queues.detail + (queues.fix or "")
    assert "no queue of 'outbox-event-{aggregate_type}.fifo' exists yet" in queues.detail
    assert "'outbox-event-order.fifo'" in queues.detail
    assert queues.fix == ("create them, e.g. aws sqs create-queue --queue-name "
                          "outbox-event-order.fifo --attributes FifoQueue=true")
    assert found["dead-letter queue"].ok is False


def test_doctor_reports_a_refused_list_queues_as_the_access_finding() -> None:
    from cdc_relay.sink.sqs.probe import probe_sqs

    queues = {p.name: p for p in probe_sqs(parse(), 5.0,
                                           client=NoQueuesSqs(list_refused=True))}["queues"]
    assert queues.ok is None and "ListQueues was refused (AccessDenied)" in queues.detail
    assert queues.fix is not None and "grant sqs:ListQueues" in queues.fix


def test_an_entry_claimed_out_of_turn_leaves_the_planner_consistent() -> None:
    planner = Planner()
    one, two = Pending(1, "q.fifo", "g", 1), Pending(2, "q.fifo", "h", 1)
    planner.add(one)
    planner.add(two)
    assert planner.claim(two) and not planner.claim(two)
    assert ("q.fifo", "h") in planner.busy
    assert planner.claim(one) and planner.waiting == {}
    planner.settle([one, two], [], 0.0)
    planner.add(Pending(3, "q.fifo", "g", 1))
    assert [p.seq for p in planner.take(0.0, {}, 10)] == [3]


def test_errors_without_a_response_are_no_refusal_and_403s_are() -> None:
    import botocore.exceptions

    from cdc_relay.sink.sqs.client import error_code, refusal

    timeout = botocore.exceptions.ReadTimeoutError(endpoint_url="http://x")
    timeout.response = None  # type: ignore[attr-defined]
    assert refusal(timeout, "http://x") is None and error_code(timeout) == ""
    forbidden = botocore.exceptions.ClientError(
        {"Error": {"Code": "403"}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetQueueUrl")
    refused = refusal(forbidden, "http://x")
    assert refused is not None and "sqs:GetQueueUrl" in str(refused)
    denied = botocore.exceptions.ClientError({"Error": {"Code": "AccessDenied"}}, "SendMessageBatch")
    assert refusal(denied, "http://x") is not None


def test_a_missing_region_is_a_config_error_when_the_factory_is_built(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_relay.sink.sqs.sink import sqs_sink_factory

    for key in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(ConfigError, match="no AWS region"):
        sqs_sink_factory(parse("http://127.0.0.1:1"))
    assert sqs_sink_factory(parse("sqs://eu-west-1")) is not None


@pytest.fixture
def no_aws_region(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    """An environment that gives no region; returns a writer of an AWS config file."""
    for key in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))

    def config_file(text: str) -> None:
        (tmp_path / "config").write_text(text)
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))

    return config_file


@pytest.mark.parametrize(("variable", "region"), [("AWS_REGION", "eu-west-3"),
                                                  ("AWS_DEFAULT_REGION", "ap-south-1")])
def test_the_sqs_client_takes_the_region_from_either_aws_variable(
        no_aws_region: Any, monkeypatch: pytest.MonkeyPatch, variable: str, region: str) -> None:
    from cdc_relay.sink.sqs.client import make_client

    monkeypatch.setenv(variable, region)
    assert make_client(parse()).meta.region_name == region


def test_the_sqs_client_takes_the_region_of_the_profile_from_aws_profile_or_sink_config(
        no_aws_region: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_relay.sink.sqs.client import make_client

    no_aws_region("[default]\nregion = us-west-2\n[profile ops]\nregion = sa-east-1\n")
    assert make_client(parse()).meta.region_name == "us-west-2"
    assert make_client(parse("http://127.0.0.1:4566", "profile=ops")).meta.region_name == "sa-east-1"
    monkeypatch.setenv("AWS_PROFILE", "ops")
    assert make_client(parse()).meta.region_name == "sa-east-1"


def test_the_sqs_region_chain_puts_the_given_region_first_then_aws_region_then_the_rest(
        no_aws_region: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_relay.sink.sqs.client import make_client

    no_aws_region("[default]\nregion = us-west-2\n")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    assert make_client(parse()).meta.region_name == "ap-south-1"
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    assert make_client(parse()).meta.region_name == "eu-west-3"
    assert make_client(parse("sqs://eu-north-1")).meta.region_name == "eu-north-1"
    assert make_client(parse("http://127.0.0.1:4566", "region=us-east-2")).meta.region_name == (
        "us-east-2")


def test_no_region_anywhere_names_every_place_a_region_may_come_from(no_aws_region: Any) -> None:
    from cdc_relay.sink.sqs.client import make_client

    with pytest.raises(ConfigError) as refused:
        make_client(parse())
    for place in ("sqs://REGION", "region=REGION", "AWS_REGION", "AWS_DEFAULT_REGION", "profile"):
        assert place in str(refused.value)


def test_cloudevents_binary_is_refused_and_structured_leaves_no_room_for_a_header() -> None:
    with pytest.raises(ConfigError, match="use --message-format cloudevents-structured"):
        parse_sqs("sqs://eu-west-1", [], topic_pattern=DEFAULT_QUEUE_PATTERN,
                  dead_letter_topic="d", message_format="cloudevents")
    assert parse_sqs("sqs://eu-west-1", [], topic_pattern=DEFAULT_QUEUE_PATTERN,
                     dead_letter_topic="d", message_format="cloudevents-structured")
    with pytest.raises(ConfigError, match="at most 0 --header columns"):
        parse_sqs("sqs://eu-west-1", [], topic_pattern=DEFAULT_QUEUE_PATTERN, dead_letter_topic="d",
                  header_names=("tenant",), message_format="cloudevents-structured")

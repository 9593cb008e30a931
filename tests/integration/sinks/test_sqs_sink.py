"""The SQS sink on its own against moto's server: per-entry outcomes, a batch with one bad entry, refusals.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from cdc_relay.errors import AccessRefused, BrokerError
from cdc_relay.local.moto_server import MotoServer
from cdc_relay.model import Message
from cdc_relay.sink.base import Cause, Delivery, ErrorKind, ProduceRejected, collect
from cdc_relay.sink.sqs.config import parse_sqs
from cdc_relay.sink.sqs.sink import SqsSink
from tests.integration.sinks.sqs_support import SqsReader


def serve_until(sink: SqsSink, done: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("the sink did not get there in time")
        sink.poll(0.05)


def make_sink(url: str, prefix: str, got: list[Delivery], *extra: str,
              timeout_ms: int = 30_000) -> SqsSink:
    config = parse_sqs(url, list(extra), topic_pattern=prefix + "-{aggregate_type}.fifo",
                       dead_letter_topic=f"{prefix}-dlq.fifo", message_timeout_ms=timeout_ms)
    return SqsSink(config, collect(got))


def message(queue: str, n: int, group: str, size: int = 20) -> Message:
    body = b'{"n":%d,"pad":"' % n + b"x" * size + b'"}'
    return Message(queue, group.encode(), body, [("id", f"e-{n}".encode()),
                                                 ("event_type", b"Changed")], 1_700_000_000_000)


def test_a_batch_with_one_entry_the_queue_refuses_delivers_the_others_and_gives_that_one_up(
        moto: MotoServer, sqs: SqsReader, topic_prefix: str) -> None:
    """moto refuses the whole SendMessageBatch when one entry is over the queue's
    MaximumMessageSize (docs/sinks.md, moto's gaps); the sink sends the entries alone to
    find it. The queue's limit is lowered after the sink looked it up, so the sink's own
    check cannot catch the entry first."""
    sqs.create("order.fifo", "dlq.fifo")
    queue = f"{topic_prefix}-order.fifo"
    got: list[Delivery] = []
    sink = make_sink(moto.url, topic_prefix, got, "concurrency=1")
    try:
        sink.warm_up(10.0)
        sink.produce(message(queue, 0, "g0"), 0)
        serve_until(sink, lambda: got)  # the queue's limit is known (and cached) now
        sqs.client.set_queue_attributes(QueueUrl=sqs.queue_url("order.fifo"),
                                        Attributes={"MaximumMessageSize": "1024"})
        moto.pause()  # the first of the next messages hangs alone; the rest make one batch
        try:
            sink.produce(message(queue, 1, "g1"), 1)
            for n in range(2, 10):
                sink.produce(message(queue, n, f"g{n}", size=4000 if n == 5 else 20), n)
        finally:
            moto.resume()
        serve_until(sink, lambda: len(got) == 10)
    finally:
        sink.close(5.0)
    by_token = {d.token: d.error for d in got}
    refused = by_token.pop(5)
    assert refused is not None and refused.kind is ErrorKind.PERMANENT
    assert refused.cause is Cause.TOO_LARGE and "shorter than 1024" in refused.reason
    assert by_token == {n: None for n in range(10) if n != 5}
    received = sqs.receive("order.fifo")
    assert sorted(m.headers["id"].decode() for m in received) == [
        f"e-{n}" for n in range(10) if n != 5]


def test_entries_of_one_group_arrive_in_produce_order_and_carry_group_and_dedup_ids(
        moto_url: str, sqs: SqsReader, topic_prefix: str) -> None:
    sqs.create("order.fifo", "dlq.fifo")
    queue = f"{topic_prefix}-order.fifo"
    got: list[Delivery] = []
    sink = make_sink(moto_url, topic_prefix, got)
    try:
        sink.warm_up(10.0)
        for n in range(60):
            sink.produce(message(queue, n, f"agg {n % 3}"), n)  # a space: not a legal group id
        sink.produce(message(queue, 0, "agg 0"), 60)  # the same event again: dropped by SQS
        serve_until(sink, lambda: len(got) == 61)
    finally:
        sink.close(5.0)
    assert all(d.error is None for d in got)
    received = sqs.receive("order.fifo")
    assert len(received) == 60  # the copy sent while the first was in the queue was dropped
    groups: dict[bytes, list[int]] = {}
    for m in received:
        assert m.headers["_MessageDeduplicationId"] == m.headers["id"]
        assert m.headers["_MessageGroupId"].startswith(b"sha256:")
        groups.setdefault(m.headers["aggregate_id"], []).append(int(m.headers["id"][2:]))
    assert len({m.headers["_MessageGroupId"] for m in received}) == 3
    for numbers in groups.values():
        assert numbers == sorted(numbers)


def test_a_missing_queue_is_retriable_topic_trouble_and_a_bad_queue_name_is_permanent(
        moto_url: str, sqs: SqsReader, topic_prefix: str) -> None:
    sqs.create("dlq.fifo")
    got: list[Delivery] = []
    sink = make_sink(moto_url, topic_prefix, got)
    try:
        sink.warm_up(10.0)
        sink.produce(message(f"{topic_prefix}-nowhere.fifo", 1, "g"), 1)
        serve_until(sink, lambda: got)
        with pytest.raises(ProduceRejected, match="not legal in SQS") as rejected:
            sink.produce(message(f"{topic_prefix}.dotted.fifo", 2, "g"), 2)
    finally:
        sink.close(1.0)
    error = got[0].error
    assert error is not None and error.kind is ErrorKind.RETRIABLE
    assert error.cause is Cause.TOPIC_MISSING and "does not exist" in error.reason
    assert rejected.value.error.kind is ErrorKind.PERMANENT


def test_a_stalled_endpoint_makes_the_sink_fatal_after_the_message_timeout(
        moto: MotoServer, sqs: SqsReader, topic_prefix: str) -> None:
    sqs.create("order.fifo", "dlq.fifo")
    got: list[Delivery] = []
    sink = make_sink(moto.url, topic_prefix, got, "read_timeout=1", timeout_ms=1500)
    try:
        sink.warm_up(10.0)
        moto.pause()
        try:
            sink.produce(message(f"{topic_prefix}-order.fifo", 1, "g"), 1)
            serve_until(sink, lambda: sink.fatal_error)
        finally:
            moto.resume()
        assert sink.fatal_error is not None and "message timeout" in sink.fatal_error.reason
    finally:
        sink.close(0)
    assert got == []  # never reported: the loops replay it


def test_warm_up_fails_while_nothing_answers(topic_prefix: str, moto_url: str) -> None:
    sink = make_sink("http://127.0.0.1:9", topic_prefix, [], "connect_timeout=1")
    try:
        with pytest.raises(BrokerError, match="check --brokers"):
            sink.warm_up(10.0)
    finally:
        sink.close(0)


def test_refused_credentials_are_access_refused_for_every_later_sink(topic_prefix: str,
                                                                     moto_url: str) -> None:
    """moto checks credentials once INITIAL_NO_AUTH_ACTION_COUNT actions are used up (0
    here): the test's made-up key is then refused, as a wrong key is by SQS."""
    with MotoServer(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as strict:
        sink = make_sink(strict.url, topic_prefix, [])
        try:
            with pytest.raises(AccessRefused, match=r"sqs:SendMessage") as refused:
                sink.warm_up(10.0)
            assert "InvalidClientTokenId" in str(refused.value)
            with pytest.raises(AccessRefused):
                sink.warm_up(10.0)
        finally:
            sink.close(0)

"""The RabbitMQ and NATS sinks on their own against the real brokers: warm-up, stalls, missing setup."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from cdc_relay.errors import BrokerError
from cdc_relay.model import Message
from cdc_relay.sink.background import BackgroundSink
from cdc_relay.sink.base import Cause, Delivery, ErrorKind, ProduceRejected, collect
from cdc_relay.sink.config import parse_nats, parse_rabbitmq
from cdc_relay.sink.nats import NatsSink
from cdc_relay.sink.rabbitmq import RabbitMqSink
from tests.integration.sinks.support import RabbitReader
from tests.integration.tcp_proxy import TcpProxy
from tests.support import init_outbox, run_cli


def serve_until(sink: BackgroundSink, done: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("the sink did not get there in time")
        sink.poll(0.05)


def message(topic: str) -> Message:
    return Message(topic, b"k", b"{}", [("id", b"e-1")], 1_700_000_000_000)


def rabbit_sink(port: int, prefix: str, got: list[Delivery], *extra: str) -> RabbitMqSink:
    config = parse_rabbitmq(f"amqp://guest:guest@127.0.0.1:{port}/%2F",
                            [f"exchange={prefix}", f"dead_letter_queue={prefix}.dlq", *extra],
                            dead_letter_topic=f"{prefix}.dlq", message_timeout_ms=1500)
    return RabbitMqSink(config, collect(got))


def nats_sink(port: int, stream: str, prefix: str, got: list[Delivery], *extra: str) -> NatsSink:
    config = parse_nats(f"nats://127.0.0.1:{port}", [f"stream={stream}", *extra],
                        topic_pattern=prefix + ".{aggregate_type}", dead_letter_topic=f"{prefix}.dlq",
                        message_timeout_ms=1500)
    return NatsSink(config, collect(got))


def proxied_sink(kind: str, proxy_factory: Callable[[int], TcpProxy], rabbit: RabbitReader,
                 nats_stream: str, nats_port: int, prefix: str,
                 got: list[Delivery]) -> tuple[TcpProxy, BackgroundSink]:
    """A ``kind`` sink that reaches its broker through a proxy; a RabbitMQ queue reads it."""
    proxy = proxy_factory(rabbit.port if kind == "rabbitmq" else nats_port)
    sink: BackgroundSink = (rabbit_sink(proxy.port, prefix, got) if kind == "rabbitmq"
                            else nats_sink(proxy.port, nats_stream, prefix, got))
    rabbit.bind(f"{prefix}.q", f"{prefix}.#")
    return proxy, sink


@pytest.mark.parametrize("kind", ["rabbitmq", "nats"])
def test_warm_up_fails_while_the_broker_is_unreachable_and_succeeds_on_the_same_sink_after(
        kind: str, rabbit: RabbitReader, nats_stream: str, nats_port: int, topic_prefix: str,
        proxy_factory: Callable[[int], TcpProxy]) -> None:
    got: list[Delivery] = []
    proxy, sink = proxied_sink(kind, proxy_factory, rabbit, nats_stream, nats_port, topic_prefix,
                               got)
    proxy.cut()
    try:
        with pytest.raises(BrokerError):
            sink.warm_up(5.0)
        proxy.restore()
        sink.warm_up(5.0)
        sink.produce(message(f"{topic_prefix}.order"), 1)
        serve_until(sink, lambda: got)
    finally:
        sink.close(1.0)
    assert got == [Delivery(1)]


@pytest.mark.parametrize("kind", ["rabbitmq", "nats"])
def test_a_stalled_broker_makes_the_sink_fatal_after_the_message_timeout(
        kind: str, rabbit: RabbitReader, nats_stream: str, nats_port: int, topic_prefix: str,
        proxy_factory: Callable[[int], TcpProxy]) -> None:
    got: list[Delivery] = []
    proxy, sink = proxied_sink(kind, proxy_factory, rabbit, nats_stream, nats_port, topic_prefix,
                               got)
    try:
        sink.warm_up(5.0)
        proxy.pause()
        sink.produce(message(f"{topic_prefix}.order"), 1)
        serve_until(sink, lambda: sink.fatal_error)
        assert sink.fatal_error is not None and "message timeout" in sink.fatal_error.reason
        with pytest.raises(ProduceRejected) as rejected:
            sink.produce(message(f"{topic_prefix}.order"), 2)
        assert rejected.value.error.kind is ErrorKind.FATAL
    finally:
        proxy.resume()
        sink.close(0)
    assert got == []  # the unconfirmed message is never reported: the loops replay it


def test_rabbitmq_without_declaring_needs_the_exchange_and_says_so(topic_prefix: str,
                                                                  rabbitmq_port: int) -> None:
    sink = rabbit_sink(rabbitmq_port, f"{topic_prefix}-missing", [], "declare_exchange=false")
    try:
        with pytest.raises(BrokerError, match="declare_exchange=false"):
            sink.warm_up(5.0)
    finally:
        sink.close(0)


def test_nats_without_creating_needs_the_stream_and_says_so(nats_stream: str, topic_prefix: str,
                                                            nats_port: int) -> None:
    sink = nats_sink(nats_port, nats_stream, topic_prefix, [], "create_stream=false")
    try:
        with pytest.raises(BrokerError, match="does not exist and create_stream=false"):
            sink.warm_up(5.0)
    finally:
        sink.close(0)


def test_nats_refuses_a_payload_over_the_server_limit_as_permanent(
        nats_stream: str, topic_prefix: str, nats_port: int) -> None:
    sink = nats_sink(nats_port, nats_stream, topic_prefix, [])
    try:
        sink.warm_up(5.0)
        big = Message(f"{topic_prefix}.order", b"k", b"x" * (sink._max_payload + 1), [("id", b"e")])
        with pytest.raises(ProduceRejected, match="too large") as rejected:
            sink.produce(big, 1)
        assert rejected.value.error.kind is ErrorKind.PERMANENT
        assert rejected.value.error.cause is Cause.TOO_LARGE  # its dead letter omits the payload
    finally:
        sink.close(0)


def test_doctor_checks_the_rabbitmq_and_nats_sinks(db: str, rabbitmq_url: str, nats_url: str,
                                                   rabbit: RabbitReader, topic_prefix: str) -> None:
    init_outbox(db, "--no-slot")
    rabbit_report = run_cli("doctor", "--dsn", db, "--mode", "poll", "--sink", "rabbitmq",
                            "--brokers", rabbitmq_url, "--sink-config", f"exchange={topic_prefix}")
    assert "PASS  broker: rabbitmq" in rabbit_report.stdout, rabbit_report.stdout
    assert f"exchange '{topic_prefix}' exists" in rabbit_report.stdout
    assert "guest:guest" not in rabbit_report.stdout
    missing = run_cli("doctor", "--dsn", db, "--mode", "poll", "--sink", "nats", "--brokers",
                      nats_url, "--sink-config", f"stream={topic_prefix.upper()}",
                      "--sink-config", "create_stream=false")
    assert "PASS  broker: nats" in missing.stdout, missing.stdout
    assert "FAIL  broker: stream" in missing.stdout and missing.returncode == 1
    wrong = run_cli("doctor", "--dsn", db, "--mode", "poll", "--sink", "rabbitmq",
                    "--brokers", rabbitmq_url.replace("guest:guest", "guest:wrong"))
    assert "FAIL  broker: rabbitmq" in wrong.stdout and "ACCESS_REFUSED" in wrong.stdout
    assert "wrong" not in wrong.stdout

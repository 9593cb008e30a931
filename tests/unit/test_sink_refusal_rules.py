"""Which broker failures are refusals (exit 6, never retried) and which are retried."""

from __future__ import annotations

import logging

import pika.exceptions as pe
import pytest
from confluent_kafka import KafkaError
from pika.adapters.utils.connection_workflow import AMQPConnectionWorkflowFailed

from cdc_relay.config import KafkaConfig
from cdc_relay.errors import AccessRefused, BrokerError
from cdc_relay.sink import nats, rabbitmq
from cdc_relay.sink.background import BackgroundSink
from cdc_relay.sink.base import Cause, ErrorKind, ignore_reports
from cdc_relay.sink.kafka.client import classify
from cdc_relay.sink.kafka.sink import KafkaSink


def test_rabbitmq_login_and_vhost_refusals_are_refusals() -> None:
    assert rabbitmq.is_refusal(pe.ProbableAuthenticationError("x"))
    assert rabbitmq.is_refusal(pe.ProbableAccessDeniedError("x"))
    assert rabbitmq.is_refusal(pe.ConnectionClosedByBroker(403, "ACCESS_REFUSED"))
    assert rabbitmq.is_refusal(pe.ConnectionClosedByBroker(530, "NOT_ALLOWED - vhost"))
    wrapped = AMQPConnectionWorkflowFailed([pe.ProbableAuthenticationError("x")])
    assert rabbitmq.is_refusal(wrapped)
    assert not rabbitmq.is_refusal(pe.AMQPConnectionError("refused"))
    assert not rabbitmq.is_refusal(pe.ConnectionClosedByBroker(320, "CONNECTION_FORCED"))


def test_nats_authorization_violations_are_refusals() -> None:
    assert nats.is_refusal(Exception("nats: 'Authorization Violation'"))
    assert nats.is_refusal(Exception("nats: 'User Authentication Expired'"))
    assert not nats.is_refusal(Exception("nats: no servers available for connection"))


class _Sink(BackgroundSink):
    def __init__(self, clock: list[float]) -> None:
        super().__init__(ignore_reports, generation=1, max_in_flight=10, message_timeout=5,
                         logger=logging.getLogger("t"), clock=lambda: clock[0])

    def _stop(self) -> None:
        pass


def test_a_refused_sink_raises_access_refused_and_is_never_retried() -> None:
    sink = _Sink([0.0])
    sink._fail("login refused", refused=True)
    with pytest.raises(AccessRefused, match="refused the relay: login refused"):
        sink._raise_failure("RabbitMQ at x")
    assert not sink._may_reconnect(10.0)


def test_reconnect_attempts_follow_the_backoff() -> None:
    clock = [100.0]
    sink = _Sink(clock)
    sink._fail("connection refused")
    with pytest.raises(BrokerError):
        sink._raise_failure("RabbitMQ at x")
    assert sink._may_reconnect(0.0)  # the first retry is at once
    assert not sink._may_reconnect(0.0)  # the next waits 0.25 s, longer than allowed
    clock[0] += 0.25
    assert sink._may_reconnect(0.0)
    clock[0] += 0.25  # the next waits 0.5 s
    assert not sink._may_reconnect(0.0)


def test_a_refused_kafka_login_is_access_refused_at_warm_up() -> None:
    sink = KafkaSink(KafkaConfig(brokers="127.0.0.1:1"), ignore_reports)
    try:
        sink._on_error(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication failed"))
        with pytest.raises(AccessRefused, match=r"Kafka at 127\.0\.0\.1:1 refused the relay"):
            sink.warm_up(1.0)
    finally:
        sink.close(0)


def test_a_forbidden_or_missing_kafka_topic_is_named_with_its_fix() -> None:
    forbidden = classify(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "orders")
    assert (forbidden.kind, forbidden.cause) == (ErrorKind.RETRIABLE, Cause.TOPIC_FORBIDDEN)
    assert forbidden.reason.startswith(
        "not authorized to write to topic orders: grant WRITE on TOPIC orders to the relay's user "
        "(docs/operations.md, Kafka ACLs)")
    missing = classify(KafkaError(KafkaError._UNKNOWN_TOPIC), "orders")
    assert missing.reason.startswith("topic orders does not exist: create it")
    # A refusal at produce() time comes without the message: the error as librdkafka says it.
    assert classify(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)).reason.startswith(
        "TOPIC_AUTHORIZATION_FAILED")

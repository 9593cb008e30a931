"""``dead-letters replay``: a topic refusal that ``produce`` raises itself (librdkafka's
cached metadata) names the topic and its grant, as a delivery report does
(sink/kafka/dead_letters.py)."""

from __future__ import annotations

from confluent_kafka import KafkaError

from cdc_relay.sink.base import Cause, DeliveryError, ErrorKind
from cdc_relay.sink.kafka.client import classify
from cdc_relay.sink.kafka.dead_letters import _naming_topic


def test_a_forbidden_topic_raised_by_produce_names_the_topic_and_the_grant() -> None:
    raised = classify(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization"))
    named = _naming_topic(raised, "shop.order")
    assert named.cause is Cause.TOPIC_FORBIDDEN and named.kind is raised.kind
    assert named.reason.startswith("not authorized to write to topic shop.order: "
                                   "grant WRITE on TOPIC shop.order")
    assert "create the topic or grant the producer access" not in named.reason


def test_other_errors_are_left_as_they_are() -> None:
    error = DeliveryError(ErrorKind.PERMANENT, "too large", Cause.TOO_LARGE)
    assert _naming_topic(error, "shop.order") is error

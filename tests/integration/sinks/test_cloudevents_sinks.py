"""The CloudEvents formats on RabbitMQ and NATS: the same attributes as headers, read back
with the CloudEvents SDK (docs/messages.md, "CloudEvents")."""

from __future__ import annotations

import signal

import psycopg
from cloudevents.v1.kafka import KafkaMessage, from_binary, from_structured

from cdc_relay.outbox import emit
from tests.integration.sinks.support import RabbitReader, stream_messages
from tests.integration.wal_support import init_db, start_relay
from tests.support import Msg, wait_for


def _write(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {str(emit(conn, "order", f"o-{n}", "OrderCreated", {"n": n})) for n in range(3)}


def _ids(messages: list[Msg]) -> set[str]:
    return {m.headers["id"].decode() for m in messages}


def test_rabbitmq_carries_a_structured_cloudevent_with_its_content_type(
        db: str, rabbitmq_url: str, rabbit: RabbitReader, topic_prefix: str) -> None:
    init_db(db)
    rabbit.bind(f"{topic_prefix}.q", f"{topic_prefix}.order")
    with start_relay(db, rabbitmq_url, topic_prefix, extra=(
            "--sink", "rabbitmq", "--sink-config", f"exchange={topic_prefix}",
            "--sink-config", f"dead_letter_queue={topic_prefix}.dlq",
            "--message-format", "cloudevents-structured")) as relay:
        wanted = _write(db)
        got = rabbit.collect(f"{topic_prefix}.q", until=lambda ms: _ids(ms) >= wanted)
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    for message in got:
        assert message.headers["_content_type"] == b"application/cloudevents+json"
        cloud = from_structured(KafkaMessage({"content-type": message.headers["content-type"]},
                                             message.key, message.value))
        assert cloud["id"] == message.headers["id"].decode()
        assert (cloud["type"], cloud["subject"]) == ("OrderCreated", message.key.decode())
        assert cloud["source"].endswith("/public.outbox_events")
        assert cloud.data == {"n": int(cloud["subject"][2:])}


def test_nats_carries_the_binary_mode_attributes_as_headers(
        db: str, nats_url: str, nats_stream: str, topic_prefix: str) -> None:
    init_db(db)
    with start_relay(db, nats_url, topic_prefix, extra=(
            "--sink", "nats", "--sink-config", f"stream={nats_stream}",
            "--message-format", "cloudevents", "--cloudevents-source", "urn:shop")) as relay:
        wanted = _write(db)
        got = wait_for(lambda: (lambda ms: ms if _ids(ms) >= wanted else None)(
            stream_messages(nats_url, nats_stream)), timeout=60, interval=0.2,
            message="three events in the stream")
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    for message in got:
        cloud = from_binary(KafkaMessage(message.headers, message.key, message.value))
        assert (cloud["id"], cloud["type"], cloud["source"], cloud["specversion"]) == (
            message.headers["id"].decode(), "OrderCreated", "urn:shop", "1.0")
        assert cloud["datacontenttype"] == "application/json"
        assert cloud["time"].endswith("Z")
        assert cloud.data == {"n": int(cloud["subject"][2:])}

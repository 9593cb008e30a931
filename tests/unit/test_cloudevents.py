"""The CloudEvents message formats without services: golden bytes, the SDK reading them,
the pure-Python-only routing, and their options (docs/messages.md, "CloudEvents")."""

from __future__ import annotations

import orjson
import pytest
from cloudevents.v1.kafka import KafkaMessage, from_binary, from_structured
from hypothesis import given
from hypothesis import strategies as st

from cdc_relay.cloudevents import rfc3339
from cdc_relay.config import RouterConfig, TableRef
from cdc_relay.errors import ConfigError
from cdc_relay.formats import _ESCAPES, json_string
from cdc_relay.model import Message, OutboxEvent
from cdc_relay.pg.db import dsn_database
from cdc_relay.routing import Router, RoutingError
from cdc_relay.sink import nats, rabbitmq
from tests.unit.paths import built

EVENT_ID = "5f0c6d1e-3b8a-4c9e-9a51-2f7b9c1d4e60"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CREATED_MS = 1_796_292_000_123  # 2026-12-03T10:00:00.123Z
PAYLOAD = '{"total": 12.5, "name": "Zoë \\"Q\\""}'.encode()


def event(**changes: object) -> OutboxEvent:
    values: dict[str, object] = dict(id=EVENT_ID, aggregate_type="order", aggregate_id="o-1",
                                     event_type="OrderCreated", payload=PAYLOAD,
                                     created_at_ms=CREATED_MS, traceparent=TRACEPARENT,
                                     tracestate="vendor=x")
    values.update(changes)
    return OutboxEvent(**values)  # type: ignore[arg-type]


def router(message_format: str, **options: object) -> Router:
    return Router(RouterConfig(message_format=message_format, **options),  # type: ignore[arg-type]
                  TableRef("sales", "outbox"), database="shop")


def test_binary_mode_golden_bytes() -> None:
    message = router("cloudevents").route(event())
    assert (message.topic, message.key, message.value) == ("outbox.event.order", b"o-1", PAYLOAD)
    assert message.timestamp_ms == CREATED_MS
    assert message.headers == [
        ("id", EVENT_ID.encode()),
        ("event_type", b"OrderCreated"),
        ("aggregate_type", b"order"),
        ("traceparent", TRACEPARENT.encode()),
        ("tracestate", b"vendor=x"),
        ("ce_specversion", b"1.0"),
        ("ce_id", EVENT_ID.encode()),
        ("ce_source", b"/cdc-relay/shop/sales.outbox"),
        ("ce_type", b"OrderCreated"),
        ("ce_subject", b"o-1"),
        ("ce_time", b"2026-12-03T10:00:00.123Z"),
        ("ce_traceparent", TRACEPARENT.encode()),
        ("ce_tracestate", b"vendor=x"),
        ("content-type", b"application/json"),
    ]


def test_structured_mode_golden_bytes() -> None:
    message = router("cloudevents-structured").route(event(tracestate=None))
    assert message.key == b"o-1"
    assert message.headers[-1] == ("content-type", b"application/cloudevents+json")
    assert [name for name, _ in message.headers] == [
        "id", "event_type", "aggregate_type", "traceparent", "content-type"]
    assert message.value == (
        b'{"specversion":"1.0","id":"' + EVENT_ID.encode() + b'","source":"/cdc-relay/shop/'
        b'sales.outbox","type":"OrderCreated","subject":"o-1","time":"2026-12-03T10:00:00.123Z",'
        b'"datacontenttype":"application/json","traceparent":"' + TRACEPARENT.encode()
        + b'","data":' + PAYLOAD + b"}")
    assert orjson.loads(message.value)["data"] == {"total": 12.5, "name": 'Zoë "Q"'}


def _kafka(message: Message) -> KafkaMessage:
    return KafkaMessage(dict(message.headers), message.key, message.value)


@pytest.mark.parametrize(("message_format", "read"), [
    ("cloudevents", from_binary), ("cloudevents-structured", from_structured)])
def test_the_cloudevents_sdk_reads_both_modes(message_format: str, read: object) -> None:
    message = router(message_format, cloudevents_source="urn:shop:{table}").route(event())
    cloud = read(_kafka(message))  # type: ignore[operator]
    assert (cloud["specversion"], cloud["id"], cloud["type"], cloud["subject"],
            cloud["source"], cloud["time"]) == (
        "1.0", EVENT_ID, "OrderCreated", "o-1", "urn:shop:outbox", "2026-12-03T10:00:00.123Z")
    assert cloud["traceparent"] == TRACEPARENT
    # The SDK's from_structured takes the content-type header (the envelope's media type,
    # as the Kafka binding requires) for datacontenttype; the envelope says application/json.
    assert cloud["datacontenttype"] == ("application/json" if read is from_binary
                                        else "application/cloudevents+json")
    assert cloud.data == {"total": 12.5, "name": 'Zoë "Q"'}


def test_an_event_without_created_at_or_trace_context_has_no_time_or_trace_attributes() -> None:
    plain = event(created_at_ms=None, traceparent=None, tracestate=None)
    names = [name for name, _ in router("cloudevents").route(plain).headers]
    assert "ce_time" not in names and "ce_traceparent" not in names
    envelope = orjson.loads(router("cloudevents-structured").route(plain).value)
    assert "time" not in envelope and "traceparent" not in envelope


@pytest.mark.parametrize("message_format", ["cloudevents", "cloudevents-structured"])
def test_the_compiled_router_never_builds_cloudevents(message_format: str) -> None:
    compiled_where_built = router(message_format)
    pure = built(False, Router, RouterConfig(message_format=message_format),
                 TableRef("sales", "outbox"), database="shop")
    assert not compiled_where_built.compiled
    for item in (event(), event(traceparent=None, tracestate=None), event(created_at_ms=None)):
        assert compiled_where_built.route(item) == pure.route(item)


def test_a_payload_that_is_not_utf8_is_a_routing_error_and_its_dead_letter_keeps_the_id() -> None:
    route = router("cloudevents-structured")
    bad = event(payload=b'{"a": "\xff"}')
    with pytest.raises(RoutingError, match="not valid UTF-8"):
        route.route(bad)
    letter = route.dead_letter(bad, "not valid UTF-8")
    assert ("id", EVENT_ID.encode()) in letter.headers


def test_a_dead_letter_carries_the_attributes_a_replay_needs() -> None:
    route = router("cloudevents", topic_pattern="{aggregate_type}")
    letter = route.dead_letter(event(aggregate_type="bad type"), "illegal topic")
    names = [name for name, _ in letter.headers]
    assert names[-2:] == ["error", "original_topic"]
    assert {"ce_id", "ce_source", "ce_type", "content-type"} <= set(names)


def test_rabbitmq_and_nats_carry_the_same_attributes_as_headers() -> None:
    message = router("cloudevents-structured").route(event())
    assert rabbitmq.properties(message).content_type == "application/cloudevents+json"
    binary = router("cloudevents").route(event())
    amqp = rabbitmq.properties(binary)
    assert amqp.content_type == "application/json"
    for headers in (amqp.headers, nats.headers(binary)):
        assert headers["ce_id"] == EVENT_ID
        assert headers["ce_source"] == "/cdc-relay/shop/sales.outbox"
        assert headers["ce_time"] == "2026-12-03T10:00:00.123Z"


@pytest.mark.parametrize(("epoch_ms", "text"), [
    (0, "1970-01-01T00:00:00.000Z"), (CREATED_MS, "2026-12-03T10:00:00.123Z"),
    (-1, "1969-12-31T23:59:59.999Z")])
def test_times_are_rfc3339_utc_with_milliseconds(epoch_ms: int, text: str) -> None:
    assert rfc3339(epoch_ms) == text


@pytest.mark.parametrize(("options", "match"), [
    ({"cloudevents_source": "/x/{db}"}, "placeholders may be"),
    ({"cloudevents_source": " "}, "non-empty source"),
    ({"message_format": "cloudevents", "header_columns": (("tenant", "ce_tenant"),)},
     "set by the relay itself"),
    ({"message_format": "cloudevents-structured",
      "header_columns": (("kind", "Content-Type"),)}, "set by the relay itself"),
])
def test_bad_cloudevents_options_are_config_errors(options: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RouterConfig(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("dsn", "database"), [
    ("host=db port=5432 dbname=shop user=app", "shop"),
    ("postgresql://app@db:5432/shop?sslmode=disable", "shop"),
    ("host=db user=alice", "alice"),  # libpq's default: the user's name
])
def test_the_default_source_names_the_database_libpq_connects_to(
        dsn: str, database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGDATABASE", raising=False)
    assert dsn_database(dsn) == database


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",))))
def test_json_strings_fast_path_escapes_exactly_as_the_full_translation(text: str) -> None:
    # json_string skips str.translate when nothing needs escaping (ids, most event types).
    assert json_string(text) == ('"' + text.translate(_ESCAPES) + '"').encode()

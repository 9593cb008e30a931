"""The router's message contract (docs/design.md): topic, key, value, headers, timestamp, dead letters.

Every test runs twice: on the pure-Python route and on the compiled one (decoding/_croute.c;
test_routing_compiled.py compares the two directly and fails when it is not built).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cdc_relay.config import RouterConfig, TableRef
from cdc_relay.errors import ConfigError
from cdc_relay.model import Lsn, Message, OutboxEvent
from cdc_relay.routing import Router, RoutingError, topic_problem


def event(**overrides: object) -> OutboxEvent:
    fields: dict[str, object] = {
        "id": "7616f707-2b9a-4b8e-9a57-0f4a3f0c1d2e",
        "aggregate_type": "Order",
        "aggregate_id": "o-1",
        "event_type": "OrderCreated",
        "payload": b'{"amount": 12.5, "orderId": "o-1"}',
        "created_at_ms": 1_700_000_000_123,
        "lsn": Lsn(0x192D3B0),
    }
    fields.update(overrides)
    return OutboxEvent(**fields)  # type: ignore[arg-type]


_COMPILED = [False]  # set per test by the path fixture


@pytest.fixture(autouse=True)
def path(compiled: bool) -> Iterator[None]:
    """Every test on both paths (the ``compiled`` fixture, tests/conftest.py)."""
    _COMPILED[0] = compiled
    yield
    _COMPILED[0] = False


def router(pattern: str = "outbox.event.{aggregate_type}", dead: str = "outbox.dead-letters",
           table: TableRef | None = None) -> Router:
    made = Router(RouterConfig(topic_pattern=pattern, dead_letter_topic=dead), table)
    assert made.compiled is _COMPILED[0]
    return made


def test_default_pattern_routes_by_aggregate_type() -> None:
    assert router().route(event()).topic == "outbox.event.Order"


def test_pattern_placeholders_take_event_type_schema_and_table() -> None:
    r = router("{schema}.{table}.{aggregate_type}.{event_type}", table=TableRef("app", "outbox"))
    assert r.route(event()).topic == "app.outbox.Order.OrderCreated"


def test_table_defaults_to_public_outbox_events() -> None:
    assert router("{schema}.{table}").route(event()).topic == "public.outbox_events"


def test_message_carries_key_value_headers_and_timestamp() -> None:
    message = router().route(event())
    assert message.key == b"o-1"
    assert message.value == b'{"amount": 12.5, "orderId": "o-1"}'
    assert message.headers == [
        ("id", b"7616f707-2b9a-4b8e-9a57-0f4a3f0c1d2e"),
        ("event_type", b"OrderCreated"),
        ("aggregate_type", b"Order"),
    ]
    assert message.timestamp_ms == 1_700_000_000_123


def test_missing_created_at_leaves_the_timestamp_to_the_producer() -> None:
    assert router().route(event(created_at_ms=None)).timestamp_ms is None


def test_payload_bytes_are_passed_through_untouched() -> None:
    payload = '{"name": "Zoë", "emoji": "🚀"}'.encode()
    assert router().route(event(payload=payload)).value is payload


def test_unicode_aggregate_id_becomes_a_utf8_key() -> None:
    message = router().route(event(aggregate_id="Bestellung-ä-日本-🚀"))
    assert message.key == "Bestellung-ä-日本-🚀".encode()


def test_unencodable_aggregate_id_is_a_routing_error() -> None:
    with pytest.raises(RoutingError, match="UTF-8"):
        router().route(event(aggregate_id="bad-\ud800"))


def test_events_of_one_pair_share_the_cached_topic_but_not_their_keys() -> None:
    r = router()
    first, second = r.route(event(aggregate_id="a")), r.route(event(aggregate_id="b"))
    assert first.topic is second.topic
    assert (first.key, second.key) == (b"a", b"b")


def test_cache_stays_correct_past_its_bound() -> None:
    r = router("{aggregate_type}.{event_type}")
    for i in range(5000):
        assert r.route(event(aggregate_type=f"A{i}")).topic == f"A{i}.OrderCreated"
    assert r.route(event()).topic == "Order.OrderCreated"


@pytest.mark.parametrize(
    ("aggregate_type", "expected"),
    [
        ("has space", "' '"),
        ("a/b", "'/'"),
        ("Straße", "'ß'"),
        ("x" * 300, "at most 249"),
    ],
)
def test_illegal_topic_is_a_routing_error_with_the_reason(aggregate_type: str,
                                                         expected: str) -> None:
    with pytest.raises(RoutingError, match=expected) as caught:
        router("{aggregate_type}").route(event(aggregate_type=aggregate_type))
    assert caught.value.topic == aggregate_type
    assert str(caught.value) == caught.value.reason


@pytest.mark.parametrize("aggregate_type", [".", "..", ""])
def test_reserved_or_empty_topic_is_a_routing_error(aggregate_type: str) -> None:
    with pytest.raises(RoutingError):
        router("{aggregate_type}").route(event(aggregate_type=aggregate_type))


def test_illegal_topic_stays_illegal_when_cached() -> None:
    r = router("{aggregate_type}")
    for _ in range(2):
        with pytest.raises(RoutingError):
            r.route(event(aggregate_type="a b"))


def test_topic_of_exactly_249_legal_characters_is_accepted() -> None:
    name = "a" * 249
    assert topic_problem(name) is None
    assert router("{aggregate_type}").route(event(aggregate_type=name)).topic == name


@pytest.mark.parametrize("name", ["outbox.dead letters", "..", "x" * 250, "dlq/1"])
def test_illegal_dead_letter_topic_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match="dead-letter topic"):
        router(dead=name)


def test_pattern_whose_literal_text_is_illegal_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="topic pattern"):
        router("outbox events/{aggregate_type}")


def test_dead_letter_of_an_event_keeps_key_value_timestamp_and_adds_the_reason() -> None:
    bad = event(aggregate_type="has space")
    message = router(dead="dlq").dead_letter(bad, "topic name 'outbox.event.has space' is bad")
    assert message.topic == "dlq"
    assert (message.key, message.value, message.timestamp_ms) == (
        b"o-1", bad.payload, 1_700_000_000_123)
    assert message.headers == [
        ("id", b"7616f707-2b9a-4b8e-9a57-0f4a3f0c1d2e"),
        ("event_type", b"OrderCreated"),
        ("aggregate_type", b"has space"),
        ("error", b"topic name 'outbox.event.has space' is bad"),
        ("original_topic", b"outbox.event.has space"),
    ]


def test_dead_letter_of_a_message_keeps_its_headers_and_names_its_topic() -> None:
    r = router(dead="dlq")
    original = r.route(event())
    message = r.dead_letter(original, "MSG_SIZE_TOO_LARGE: Broker: Message size too large")
    assert message.topic == "dlq"
    assert (message.key, message.value, message.timestamp_ms) == (
        original.key, original.value, original.timestamp_ms)
    assert message.headers == [
        *original.headers,
        ("error", b"MSG_SIZE_TOO_LARGE: Broker: Message size too large"),
        ("original_topic", b"outbox.event.Order"),
    ]
    assert original.headers == r.route(event()).headers  # the original is not mutated


def test_dead_letter_never_fails_on_unencodable_text() -> None:
    message = router().dead_letter(event(aggregate_id="bad-\ud800"), "bad key")
    assert message.key == b"bad-?"


def test_dead_letter_reason_is_capped() -> None:
    message = router().dead_letter(Message("t", b"k", b"v"), "x" * 5000)
    error = dict(message.headers)["error"]
    assert len(error.decode()) == 1000
    assert error.decode().endswith("…")


def test_route_is_the_same_for_wal_and_polling_events() -> None:
    r = router()
    wal = event(lsn=Lsn(0x192D3B0), attempt=1)
    polled = event(lsn=Lsn(0), attempt=3)
    assert r.route(wal) == r.route(polled)

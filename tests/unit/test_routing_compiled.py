"""The compiled router against the pure-Python route (decoding/_croute.c; docs/design.md,
"The compiled decoders").

Differential: for every event, plain or odd, the compiled ``route`` gives the same
Message, or the same RoutingError, as the Python one. Also where it is installed (the
plain configuration only), the classes it refuses, the Router's cache it shares, and that
a Router holding it is still garbage. These tests fail, not skip, when the extension is
not built: CI has a compiler, so a broken build must show.
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import make_dataclass, replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_relay.config import RouterConfig
from cdc_relay.decoding import _croute
from cdc_relay.model import Lsn, Message, OutboxEvent
from cdc_relay.routing import _CACHE_LIMIT, Router, RoutingError
from tests.unit.decoding_fixtures import NOT_OUTBOX_EVENTS
from tests.unit.paths import built

EVENT = OutboxEvent("7616f707-2b9a-4b8e-9a57-0f4a3f0c1d2e", "Order", "o-1", "OrderCreated",
                    b'{"amount": 12.5}', 1_700_000_000_123, Lsn(0x192D3B0))


def both(pattern: str = "outbox.event.{aggregate_type}") -> Router:
    router = built(True, Router, RouterConfig(topic_pattern=pattern))
    assert router.compiled
    return router


def outcome(route: Any, event: Any) -> tuple[str, Any]:
    try:
        return "message", route(event)
    except RoutingError as exc:
        return "error", (exc.reason, exc.topic)


def assert_same(router: Router, event: Any) -> None:
    """The compiled route's answer is the Python route's, asked second and first."""
    assert outcome(router.route, event) == outcome(router._route, event)
    assert outcome(router._route, event) == outcome(router.route, event)


class _Sub(OutboxEvent):
    __slots__ = ()


class _Text(str):
    pass


texts = st.one_of(
    st.sampled_from(["Order", "order", "a b", "Straße", ".", "", "x" * 250, "a/b"]),
    st.text(max_size=12),  # surrogates included: not UTF-8 encodable
)

events = st.builds(
    OutboxEvent,
    id=texts,
    aggregate_type=texts,
    aggregate_id=texts,
    event_type=texts,
    payload=st.binary(max_size=20),
    created_at_ms=st.one_of(st.none(), st.integers(0, 2**53)),
    lsn=st.builds(Lsn, st.integers(0, 2**64 - 1)),
    extra=st.sampled_from([(), ("t-1",), (None,)]),
    traceparent=st.sampled_from([None, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]),
    tracestate=st.sampled_from([None, "congo=t61rcWkgMzE"]),
)


@given(events, st.sampled_from(["outbox.event.{aggregate_type}", "{aggregate_type}.{event_type}",
                               "{schema}.{table}"]))
def test_every_event_routes_the_same_both_ways(event: OutboxEvent, pattern: str) -> None:
    assert_same(both(pattern), event)


def test_the_plain_event_is_built_in_c_and_equal_in_every_field() -> None:
    router = both()
    router._route(EVENT)  # cache the pair: the compiled route builds from the cache
    message = router.route(EVENT)
    assert type(message) is Message
    assert message == Message("outbox.event.Order", b"o-1", EVENT.payload, [
        ("id", b"7616f707-2b9a-4b8e-9a57-0f4a3f0c1d2e"), ("event_type", b"OrderCreated"),
        ("aggregate_type", b"Order")], 1_700_000_000_123, None)
    assert message.value is EVENT.payload  # the raw format sends it as it is
    again = router.route(EVENT)
    assert again.topic is message.topic and again.headers[1] is message.headers[1]
    assert again.headers is not message.headers  # a list per message: callers may extend it


@pytest.mark.parametrize("odd", [
    replace(EVENT, traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    replace(EVENT, extra=("t-1",)),
    replace(EVENT, aggregate_id="bad-\ud800"),
    replace(EVENT, id="bad-\udfff"),
    replace(EVENT, aggregate_id=_Text("o-1")),
    replace(EVENT, aggregate_type="a b"),
    _Sub(*(getattr(EVENT, name) for name in OutboxEvent.__slots__)),
], ids=["traceparent", "extra", "surrogate-key", "surrogate-id", "str-subclass", "illegal-topic",
        "event-subclass"])
def test_what_is_not_the_plain_case_is_the_python_routes_answer(odd: OutboxEvent) -> None:
    router = both("{aggregate_type}")
    router._route(EVENT)
    assert_same(router, odd)


@pytest.mark.parametrize("config", [
    RouterConfig(message_format="debezium-json"),
    RouterConfig(message_format="debezium-json-schemaless"),
    RouterConfig(header_columns=(("tenant", "tenant"),)),
    RouterConfig(partition_column="shard"),
])
def test_it_is_installed_for_the_plain_configuration_only(config: RouterConfig) -> None:
    assert not Router(config).compiled
    assert not built(False, Router, RouterConfig()).compiled
    assert Router(RouterConfig()).compiled  # built here: the default takes it


def test_it_reads_the_cache_the_router_fills_and_clears() -> None:
    router = both("{aggregate_type}.{event_type}")
    for i in range(_CACHE_LIMIT + 10):  # past the bound: the dict is cleared in place
        event = replace(EVENT, aggregate_type=f"A{i}")
        assert router.route(event).topic == f"A{i}.OrderCreated"
        assert router.route(event) == router._route(event)
    assert router._cached <= _CACHE_LIMIT


@pytest.mark.parametrize("name", sorted(NOT_OUTBOX_EVENTS))
def test_a_class_other_than_outbox_event_is_refused(name: str) -> None:
    with pytest.raises(TypeError):
        _croute.Route({}, lambda event: event, NOT_OUTBOX_EVENTS[name], Message)


_MESSAGE_FIELDS = ["topic", "key", "value", "headers", "timestamp_ms", "partition"]


@pytest.mark.parametrize("cls", [
    make_dataclass("Plain", _MESSAGE_FIELDS),
    make_dataclass("Wider", [*_MESSAGE_FIELDS, "more"], slots=True),
    make_dataclass("Reordered", _MESSAGE_FIELDS[::-1], slots=True),
    OutboxEvent,
], ids=["without-slots", "a-field-more", "reordered", "another-class"])
def test_a_class_other_than_message_is_refused(cls: type) -> None:
    with pytest.raises(TypeError, match=r"_croute\.c"):
        _croute.Route({}, lambda event: event, OutboxEvent, cls)


def test_a_router_holding_it_is_still_collected() -> None:
    router = both()
    router.route(EVENT)
    gone = weakref.ref(router)
    del router
    gc.collect()
    assert gone() is None

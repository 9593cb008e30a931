"""The message options without services: validation, carried columns, logical messages,
trace context in ``outbox.emit`` and the partitioner default (docs/messages.md)."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from cdc_relay.config import OutboxConfig, RouterConfig, parse_header_option
from cdc_relay.decoding.pgoutput import PgOutputDecoder
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.errors import ConfigError, DecodeError
from cdc_relay.model import IgnoredMessage, OutboxColumns, OutboxEvent
from cdc_relay.outbox import _current_span_context, _trace_context, emit
from cdc_relay.pg.message_columns import check_columns
from cdc_relay.routing import Router, RoutingError
from cdc_relay.sink.kafka.client import DEFAULT_SETTINGS
from tests.unit.test_message_formats import (
    AT,
    OUTBOX,
    ROW,
    envelope,
    from_pgoutput,
    from_wal2json,
    pg_insert,
    pg_message,
    pg_relation,
    wal2json_insert,
)

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_the_producer_defaults_to_the_java_partitioner() -> None:
    assert DEFAULT_SETTINGS["partitioner"] == "murmur2_random"


@pytest.mark.parametrize(("text", "expected"), [
    ("tenant", ("tenant", "tenant")),
    ("tenant:x-tenant", ("tenant", "x-tenant")),
    (" tenant : X.Tenant_1 ", ("tenant", "X.Tenant_1")),
])
def test_header_option_is_column_or_column_colon_name(text: str, expected: tuple[str, str]) -> None:
    assert parse_header_option(text) == expected


@pytest.mark.parametrize("text", ["bad column", "tenant:", "tenant:has space", "x;y:z"])
def test_bad_header_option_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="--header"):
        parse_header_option(text)


@pytest.mark.parametrize(("config", "match"), [
    ({"message_format": "thrift"}, "unknown message format"),
    ({"header_columns": (("tenant", "id"),)}, "set by the relay"),
    ({"header_columns": (("a", "x"), ("b", "x"))}, "given twice"),
    ({"partition_column": "no-such thing"}, "--partition-column"),
])
def test_router_config_refuses_bad_message_options(config: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RouterConfig(**config)


def test_extra_columns_are_headers_then_partition_each_once() -> None:
    config = RouterConfig(header_columns=(("a", "a"), ("b", "bee")), partition_column="a")
    assert config.extra_columns() == ("a", "b")


COLUMNS = {"id": "uuid", "aggregate_id": "varchar", "tenant": "text", "shard": "int4",
           "note": "text", "traceparent": "text", "tracestate": "text"}


@pytest.mark.parametrize(("config", "match"), [
    (RouterConfig(header_columns=(("tennant", "tenant"),)), "no column 'tennant'"),
    (RouterConfig(partition_column="shrad"), "no column 'shrad'"),
    (RouterConfig(partition_column="note"), "not an integer type"),
])
def test_start_up_check_names_the_unknown_or_unfit_column(config: RouterConfig, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as caught:
        check_columns(COLUMNS, OutboxConfig(), config)
    assert "\n" not in str(caught.value)


def test_start_up_check_returns_the_columns_to_read() -> None:
    config = RouterConfig(header_columns=(("tenant", "t"),), partition_column="shard")
    outbox = check_columns(COLUMNS, OutboxConfig(), config)
    assert (outbox.extra_columns, outbox.trace_columns) == (("tenant", "shard"),
                                                            ("traceparent", "tracestate"))
    without = {k: v for k, v in COLUMNS.items() if not k.startswith("trace")}
    assert check_columns(without, OutboxConfig(), RouterConfig()).trace_columns == ()


@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_a_partition_value_that_is_no_partition_is_a_routing_error(value: str) -> None:
    config = RouterConfig(partition_column="shard")
    with pytest.raises(RoutingError, match="non-negative integer"):
        Router(config).route(from_wal2json({**ROW, "shard": value}, config.extra_columns()))


def test_null_partition_value_leaves_the_partition_to_the_key() -> None:
    config = RouterConfig(partition_column="shard")
    event = from_pgoutput({**ROW, "shard": None}, config.extra_columns())
    assert Router(config).route(event).partition is None


@pytest.mark.parametrize("decode", [from_wal2json, from_pgoutput])
def test_trace_columns_become_w3c_headers(decode: Any) -> None:
    row = {**ROW, "traceparent": TRACEPARENT, "tracestate": "vendor=x"}
    headers = Router(RouterConfig()).route(decode(row)).headers
    assert headers[-2:] == [("traceparent", TRACEPARENT.encode()), ("tracestate", b"vendor=x")]


def test_a_named_column_missing_from_the_row_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="'tennant'"):
        Wal2JsonDecoder(OUTBOX, OutboxColumns(), extra_columns=("tennant",)).decode(wal2json_insert(ROW), AT)
    decoder = PgOutputDecoder(OUTBOX, OutboxColumns(), ("tennant",))
    decoder.decode(pg_relation(list(ROW)), AT)
    with pytest.raises(DecodeError, match="'tennant'"):
        decoder.decode(pg_insert(list(ROW.values())), AT)


def test_wal2json_finds_a_trace_column_added_while_streaming() -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    before = {k: v for k, v in ROW.items() if k != "traceparent"}
    first = decoder.decode(wal2json_insert(before), AT)
    second = decoder.decode(wal2json_insert({**before, "traceparent": TRACEPARENT}), AT)
    assert isinstance(first, OutboxEvent) and isinstance(second, OutboxEvent)
    assert (first.traceparent, second.traceparent) == (None, TRACEPARENT)


def test_pgoutput_header_on_a_mapped_column_carries_its_value() -> None:
    event = from_pgoutput(ROW, ("event_type",))
    assert event.extra == ("OrderCreated",)
    assert event.event_type == "OrderCreated"


def wal2json_message(content: str, *, transactional: bool = True,
                     prefix: str = "cdc-relay") -> bytes:
    return orjson.dumps({"action": "M", "xid": 7 if transactional else None, "lsn": str(AT),
                         "transactional": transactional, "prefix": prefix, "content": content})


def test_non_transactional_messages_are_ignored_and_other_prefixes_are_none() -> None:
    wal2json = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    pgoutput = PgOutputDecoder(OUTBOX, OutboxColumns())
    content = envelope()
    assert wal2json.decode(wal2json_message(content.decode(), transactional=False), AT) == (
        IgnoredMessage("cdc-relay"))
    assert pgoutput.decode(pg_message(content, transactional=False), AT) == (
        IgnoredMessage("cdc-relay"))
    assert wal2json.decode(wal2json_message("x", prefix="other"), AT) is None
    assert pgoutput.decode(pg_message(b"x", prefix="other"), AT) is None


@pytest.mark.parametrize("content", [b"not json", b"[1]", envelope(v=2), envelope(payload=None),
                                     envelope(created_at="now"), envelope(traceparent=5)])
def test_a_malformed_envelope_stops_the_relay(content: bytes) -> None:
    with pytest.raises(DecodeError, match="LSN 0/19477A0"):
        PgOutputDecoder(OUTBOX, OutboxColumns()).decode(pg_message(content), AT)
    with pytest.raises(DecodeError, match="LSN 0/19477A0"):
        Wal2JsonDecoder(OUTBOX, OutboxColumns()).decode(
            wal2json_message(content.decode()), AT)


def test_a_message_has_no_column_values_but_keeps_its_trace_context() -> None:
    content = envelope(traceparent=TRACEPARENT, tracestate="a=b")
    event = PgOutputDecoder(OUTBOX, OutboxColumns(), ("tenant",)).decode(pg_message(content), AT)
    assert isinstance(event, OutboxEvent)
    assert (event.extra, event.traceparent, event.tracestate) == ((None,), TRACEPARENT, "a=b")


def test_the_current_opentelemetry_span_is_the_default_trace_context() -> None:
    assert _current_span_context() == (None, None)  # no span: nothing
    context = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=False,
                          trace_flags=TraceFlags(1), trace_state=TraceState([("vendor", "x")]))
    with trace.use_span(NonRecordingSpan(context)):
        assert _trace_context(None, None) == (TRACEPARENT, "vendor=x")
        assert _trace_context(TRACEPARENT[:-1] + "0", None) == (TRACEPARENT[:-1] + "0", None)


@pytest.mark.parametrize(("traceparent", "tracestate"), [
    ("00-abc-def-01", None), (TRACEPARENT.upper(), None), (None, "a=b")])
def test_a_malformed_trace_context_is_refused_before_any_io(traceparent: str | None,
                                                          tracestate: str | None) -> None:
    class Untouchable:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the database was touched: conn.{name}")

    with pytest.raises(ValueError, match="trace"):
        emit(Untouchable(), "a", "1", "e", {}, event_id=uuid.uuid4(),  # type: ignore[arg-type]
             traceparent=traceparent, tracestate=tracestate)

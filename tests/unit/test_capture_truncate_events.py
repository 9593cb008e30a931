"""TRUNCATE of captured tables as Debezium's ``op: t`` events (``--capture-truncate``):
capture/decoder.py reads pgoutput's Truncate message, capture/route.py makes the events."""

from __future__ import annotations

import json
import struct

import pytest

from cdc_relay.capture.decoder import CaptureDecoder, CodecOptions
from cdc_relay.capture.envelope import SourceInfo
from cdc_relay.capture.route import CaptureRouter
from cdc_relay.capture.selection import Selection
from cdc_relay.capture.shape import ColumnShape, TableShape
from cdc_relay.config import TableRef
from cdc_relay.decoding.pgoutput import PgOutputDecoder
from cdc_relay.errors import DecodeError
from cdc_relay.model import CapturedRow, OutboxColumns
from tests.unit.test_capture_events import BEGIN, _relation

SHAPES = {
    "customers": TableShape("public", "customers", (
        ColumnShape("id", 23, not_null=True), ColumnShape("name", 25), ColumnShape("note", 25)),
        ("id",)),
    "orders": TableShape("public", "orders", (
        ColumnShape("id", 23, not_null=True), ColumnShape("name", 603, type_name="box"),
        ColumnShape("note", 25)), ("id",)),
}


def _truncate(*relids: int, options: int = 0) -> bytes:
    return b"T" + struct.pack("!IB", len(relids), options) + struct.pack(f"!{len(relids)}I", *relids)


def _decoder(*, truncate: bool = True, schemas: bool = False) -> CaptureDecoder:
    outbox = PgOutputDecoder(TableRef(), OutboxColumns())
    decoder = CaptureDecoder(outbox, Selection.parse("public.customers,public.orders"),
                             lambda schema, table: SHAPES.get(table),
                             CodecOptions("pfx", schemas, truncate=truncate))
    decoder.decode(_relation(7), 0)
    decoder.decode(_relation(8, b"other"), 0)  # not captured
    decoder.decode(BEGIN, 0x400)
    return decoder


def _router() -> CaptureRouter:
    return CaptureRouter(SourceInfo("v", "pfx", "db"), clock_ns=lambda: 1_700_000_000_123_456_789)


def test_a_truncate_is_a_t_event_with_a_null_key_and_no_images_and_no_tombstone() -> None:
    row = _decoder().decode(_truncate(7, 8, options=1), 0x450)  # CASCADE; 8 is not captured
    assert isinstance(row, CapturedRow)
    routed = _router().route(row)
    assert routed.problem is None and routed.problems is None
    [message] = routed.messages
    assert (message.topic, message.key) == ("pfx.public.customers", None)
    value = json.loads(message.value or b"")
    assert list(value) == ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"]
    assert (value["before"], value["after"], value["op"]) == (None, None, "t")
    source = value["source"]
    assert (source["table"], source["txId"], source["lsn"], source["snapshot"]) == (
        "customers", 42, 0x450, "false")


def test_a_truncate_carries_the_tables_envelope_schema_with_schemas_on() -> None:
    row = _decoder(schemas=True).decode(_truncate(7), 0x450)
    [message] = _router().route(row).messages  # type: ignore[arg-type]
    value = json.loads(message.value or b"")
    assert value["schema"]["name"] == "pfx.public.customers.Envelope"
    assert value["payload"]["op"] == "t" and message.key is None


def test_without_capture_truncate_a_truncate_is_ignored() -> None:
    assert _decoder(truncate=False).decode(_truncate(7), 0x450) is None


def test_a_truncate_of_no_captured_table_is_ignored() -> None:
    assert _decoder().decode(_truncate(8), 0x450) is None


def test_a_truncate_of_several_tables_is_one_event_each_and_an_unencodable_one_a_dead_letter() -> None:
    decoder = _decoder()
    decoder.decode(_relation(9, b"orders", oids=(23, 603, 25)), 0)
    row = decoder.decode(_truncate(9, 7), 0x450)
    routed = _router().route(row)  # type: ignore[arg-type]
    assert [m.topic for m in routed.messages] == ["pfx.public.orders", "pfx.public.customers"]
    assert routed.problems is not None
    assert routed.problems[0] is not None and "box" in routed.problems[0]
    assert routed.problems[1] is None
    assert json.loads(routed.messages[0].value or b"")["op"] == "t"  # the dead letter's body


def test_a_malformed_truncate_is_fatal_naming_the_lsn() -> None:
    with pytest.raises(DecodeError, match="LSN 0/450"):
        _decoder().decode(_truncate(7)[:-2], 0x450)


def test_the_collector_exports_events_by_table_and_op_and_each_tables_lag() -> None:
    from cdc_relay.ops.metrics.collectors import WalCollector
    from cdc_relay.stats import RelayStats
    from tests.unit.test_metrics_endpoint import samples

    stats = RelayStats()
    assert not any(k.startswith("cdc_relay_captured") for k in samples(WalCollector(stats, None)))
    stats.captured[("public.customers", "t")] = 2
    stats.captured_lag["public.customers"] = 0.25
    got = samples(WalCollector(stats, None))
    assert got["cdc_relay_captured_events_total{op=t,table=public.customers}"] == 2
    assert got["cdc_relay_captured_lag_seconds{table=public.customers}"] == 0.25

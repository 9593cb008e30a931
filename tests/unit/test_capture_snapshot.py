"""Snapshots of captured tables (wal/backfill/tables.py, capture/selection.py): Debezium's
``source.snapshot`` markers and table order, the read event."""

from __future__ import annotations

import json

from cdc_relay.capture.envelope import SourceInfo, TableCodec
from cdc_relay.capture.route import CaptureRouter
from cdc_relay.capture.selection import in_option_order
from cdc_relay.capture.shape import ColumnShape, TableShape
from cdc_relay.model import CapturedRow, Lsn
from cdc_relay.wal.backfill.tables import marker


def test_markers_follow_debeziums_precedence() -> None:
    assert marker(True, False, True, False) == "first"
    assert marker(False, True, False, True) == "last"
    assert marker(True, True, True, True) == "last"  # a single row: last wins
    assert marker(True, False, False, True) == "last_in_data_collection"
    assert marker(False, False, True, False) == "first_in_data_collection"
    assert marker(False, False, True, True) == "last_in_data_collection"
    assert marker(False, False, False, False) == "true"


def test_tables_are_snapshotted_in_the_order_of_the_capture_items() -> None:
    tables = [("public", "b"), ("sales", "z"), ("sales", "a"), ("public", "a")]
    assert in_option_order("public.b, sales.*, public.a", tables) == [
        ("public", "b"), ("sales", "a"), ("sales", "z"), ("public", "a")]
    assert in_option_order("public.*,public.b", tables[:1] + tables[3:]) == [
        ("public", "a"), ("public", "b")]


def test_a_snapshot_row_is_a_read_event_without_before() -> None:
    shape = TableShape("public", "t", (ColumnShape("id", 23, not_null=True),), ("id",))
    codec = TableCodec(shape, ("id",), "pfx", False, "__debezium_unavailable_value")
    row = CapturedRow(codec, "r", [b"7"], None, Lsn(0x500), 99, 1_000_000, None, "first")
    [message] = CaptureRouter(SourceInfo("v", "pfx", "db"), clock_ns=lambda: 0).route(row).messages
    value = json.loads(message.value or b"")
    assert (value["op"], value["before"], value["after"]) == ("r", None, {"id": 7})
    assert (value["source"]["snapshot"], value["source"]["lsn"], value["source"]["txId"]) == (
        "first", 0x500, 99)

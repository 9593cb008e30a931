"""Captured rows from pgoutput bytes to Debezium's messages (capture/decoder.py, route.py,
envelope.py, selection.py), against hand-built pgoutput messages."""

from __future__ import annotations

import json
import struct

import pytest

from cdc_relay.capture.decoder import CaptureDecoder, CodecOptions
from cdc_relay.capture.envelope import SourceInfo
from cdc_relay.capture.route import CaptureRouter
from cdc_relay.capture.selection import Selection
from cdc_relay.capture.shape import ColumnShape, TableShape
from cdc_relay.config import OutboxColumns, TableRef
from cdc_relay.decoding.pgoutput import PgOutputDecoder
from cdc_relay.errors import ConfigError, DecodeError
from cdc_relay.model import Begin, CapturedMessage, CapturedRow, Commit

SHAPE = TableShape("public", "customers", (
    ColumnShape("id", 23, not_null=True), ColumnShape("name", 25),
    ColumnShape("note", 25, not_null=True, default="'n/a'::text")), ("id",))


def _relation(relid: int = 7, name: bytes = b"customers", oids: tuple[int, ...] = (23, 25, 25)) -> bytes:
    cols = b"".join(b"\x01" + n + b"\x00" + struct.pack("!Ii", oid, -1)
                    for n, oid in zip((b"id", b"name", b"note"), oids, strict=True))
    return b"R" + struct.pack("!I", relid) + b"public\x00" + name + b"\x00d" + struct.pack("!H", 3) + cols


def _tuple(*values: bytes | str | None) -> bytes:
    out = struct.pack("!H", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value == "u":
            out += b"u"
        else:
            assert isinstance(value, bytes)
            out += b"t" + struct.pack("!I", len(value)) + value
    return out


BEGIN = b"B" + struct.pack("!QqI", 0x500, 10_000_000, 42)
COMMIT = b"C" + struct.pack("!BQQq", 0, 0x500, 0x600, 10_000_000)


def _decoder(schemas: bool = False) -> CaptureDecoder:
    outbox = PgOutputDecoder(TableRef(), OutboxColumns())
    return CaptureDecoder(outbox, Selection.parse("public.customers"),
                          lambda schema, table: SHAPE if table == "customers" else None,
                          CodecOptions("pfx", schemas))


def _route(row: object, tombstones: bool = True) -> list[CapturedMessage]:
    assert isinstance(row, CapturedRow)
    router = CaptureRouter(SourceInfo("v", "pfx", "db"), tombstones=tombstones,
                           clock_ns=lambda: 1_700_000_000_123_456_789)
    routed = router.route(row)
    assert routed.problem is None
    return routed.messages


def test_an_insert_becomes_a_create_event_with_debeziums_source_block() -> None:
    decoder = _decoder()
    decoder.decode(_relation(), 0)
    assert isinstance(decoder.decode(BEGIN, 0x400), Begin)
    row = decoder.decode(b"I" + struct.pack("!I", 7) + b"N" + _tuple(b"1", b"ada", None), 0x450)
    [message] = _route(row)
    assert message.topic == "pfx.public.customers"
    assert message.key == b'{"id":1}'
    value = json.loads(message.value or b"")
    assert list(value) == ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"]
    assert value["after"] == {"id": 1, "name": "ada", "note": "n/a"}  # NULL → the default
    assert value["source"]["sequence"] == '[null,"1104"]'
    assert value["source"]["ts_us"] == 10_000_000 + 946_684_800_000_000
    assert (value["source"]["txId"], value["source"]["lsn"]) == (42, 0x450)
    assert (value["op"], value["ts_ms"]) == ("c", 1_700_000_000_123)
    assert isinstance(decoder.decode(COMMIT, 0x600), Commit)


def test_a_delete_is_followed_by_a_tombstone_unless_tombstones_are_off() -> None:
    decoder = _decoder()
    decoder.decode(_relation(), 0)
    decoder.decode(BEGIN, 0)
    row = decoder.decode(b"D" + struct.pack("!I", 7) + b"K" + _tuple(b"1", None, None), 0x450)
    delete, tombstone = _route(row)
    assert json.loads(delete.value or b"")["before"] == {"id": 1, "name": None, "note": "n/a"}
    assert (tombstone.key, tombstone.value) == (delete.key, None)
    assert len(_route(row, tombstones=False)) == 1


def test_a_key_change_is_a_delete_its_tombstone_and_a_create() -> None:
    decoder = _decoder()
    decoder.decode(_relation(), 0)
    row = decoder.decode(b"U" + struct.pack("!I", 7) + b"K" + _tuple(b"1", None, None)
                         + b"N" + _tuple(b"2", b"b", b"x"), 0x450)
    messages = _route(row)
    ops = [None if m.value is None else json.loads(m.value)["op"] for m in messages]
    assert ops == ["d", None, "c"]
    # as Debezium's, through Kafka Connect's default header converter
    assert [m.headers for m in messages] == [[("__debezium.newkey", b'{"id":2}')]] * 2 + [
        [("__debezium.oldkey", b'{"id":1}')]]
    plain = decoder.decode(b"U" + struct.pack("!I", 7) + b"N" + _tuple(b"2", b"c", b"x"), 0x460)
    assert [m.headers for m in _route(plain)] == [[]]


def test_an_unchanged_toast_value_is_the_placeholder() -> None:
    decoder = _decoder()
    decoder.decode(_relation(), 0)
    row = decoder.decode(b"U" + struct.pack("!I", 7) + b"N" + _tuple(b"1", "u", b"x"), 0x450)
    [update] = _route(row)
    assert json.loads(update.value or b"")["after"]["name"] == "__debezium_unavailable_value"


def test_the_schema_block_names_key_value_and_envelope_after_the_prefix() -> None:
    decoder = _decoder(schemas=True)
    decoder.decode(_relation(), 0)
    [message] = _route(decoder.decode(b"I" + struct.pack("!I", 7) + b"N" + _tuple(b"1", None, b"x"), 1))
    key, value = json.loads(message.key or b""), json.loads(message.value or b"")
    assert key["schema"]["name"] == "pfx.public.customers.Key"
    assert (value["schema"]["name"], value["schema"]["version"]) == ("pfx.public.customers.Envelope", 2)
    note = value["schema"]["fields"][1]["fields"][2]
    assert list(note) == ["type", "optional", "default", "field"]


def test_a_type_without_a_mapping_routes_to_a_dead_letter_naming_column_and_type() -> None:
    shape = TableShape("public", "customers", (ColumnShape("id", 23, not_null=True),
                       ColumnShape("name", 603, type_name="box"), ColumnShape("note", 25)), ("id",))
    outbox = PgOutputDecoder(TableRef(), OutboxColumns())
    decoder = CaptureDecoder(outbox, Selection.parse("public.*"), lambda s, t: shape,
                             CodecOptions("pfx", False))
    decoder.decode(_relation(oids=(23, 603, 25)), 0)
    row = decoder.decode(b"I" + struct.pack("!I", 7) + b"N" + _tuple(b"1", b"(1,1),(0,0)", None), 1)
    assert isinstance(row, CapturedRow)
    routed = CaptureRouter(SourceInfo("v", "pfx", "db"), clock_ns=lambda: 0).route(row)
    assert routed.problem is not None and "'name'" in routed.problem and "box" in routed.problem
    assert len(routed.messages) == 1


def test_tables_not_selected_go_to_the_outbox_decoder_and_truncation_is_fatal() -> None:
    decoder = _decoder()
    decoder.decode(_relation(8, b"other"), 0)
    assert decoder.decode(b"I" + struct.pack("!I", 8) + b"N" + _tuple(b"1", b"a", b"b"), 1) is None
    decoder.decode(_relation(), 0)
    with pytest.raises(DecodeError, match="LSN"):
        decoder.decode(b"I" + struct.pack("!I", 7) + b"N" + struct.pack("!H", 3) + b"t\x00\x00", 9)


def test_selection_takes_tables_and_schema_patterns_and_refuses_unqualified_names() -> None:
    selection = Selection.parse("public.customers, sales.*")
    assert selection.matches("public", "customers") and selection.matches("sales", "orders")
    assert not selection.matches("public", "orders")
    with pytest.raises(ConfigError, match="schema"):
        Selection.parse("customers")

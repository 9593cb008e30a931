"""wal2json's messages as captured rows (capture/wal2json.py): the same images pgoutput
gives - text values, unchanged TOAST values, old images by replica identity - and what
wal2json leaves out inferred from positions and the catalog."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cdc_relay.capture.decoder import CodecOptions
from cdc_relay.capture.envelope import SourceInfo
from cdc_relay.capture.route import CaptureRouter
from cdc_relay.capture.selection import Selection
from cdc_relay.capture.shape import ColumnShape, TableShape
from cdc_relay.capture.wal2json import Wal2JsonCaptureDecoder, capture_options, parse_typmod
from cdc_relay.config import OutboxColumns, TableRef
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.errors import DecodeError
from cdc_relay.model import UNCHANGED, Begin, CapturedRow, Commit

INT4, TEXT, FLOAT8, NUMERIC, BYTEA, BOOL = 23, 25, 701, 1700, 17, 16
TABLE = TableShape("public", "t", (ColumnShape("id", INT4, type_name="integer", not_null=True),
                                   ColumnShape("big", TEXT, type_name="text"),
                                   ColumnShape("small", INT4, type_name="integer")), ("id",))
POSITIONS = {"id": 1, "big": 2, "small": 3}


class Catalog:
    """A fake catalog: one table as it is now, its positions; counts the reads."""

    def __init__(self, shape: TableShape, positions: dict[str, int]) -> None:
        self.shape, self.positions_now, self.reads = shape, positions, 0

    def __call__(self, schema: str, table: str) -> TableShape | None:
        self.reads += 1
        return self.shape

    def positions(self, schema: str, table: str) -> dict[str, int]:
        return self.positions_now


def _decoder(catalog: Catalog, *, truncate: bool = False) -> Wal2JsonCaptureDecoder:
    return Wal2JsonCaptureDecoder(Wal2JsonDecoder(TableRef(), OutboxColumns()),
                                  Selection.parse("public.t"), catalog,
                                  CodecOptions("pfx", schemas=False, truncate=truncate),
                                  positions=catalog.positions)


def _col(name: str, oid: int, value: Any, position: int | None = None,
         type_name: str | None = None) -> dict[str, Any]:
    names = {INT4: "integer", TEXT: "text", FLOAT8: "double precision", BYTEA: "bytea",
             BOOL: "boolean", NUMERIC: "numeric"}
    out: dict[str, Any] = {"name": name, "type": type_name or names[oid], "typeoid": oid,
                           "value": value}
    if position is not None:
        out["position"] = position
    return out


def _msg(action: str, columns: list[dict[str, Any]] | None = None,
         identity: list[dict[str, Any]] | None = None) -> bytes:
    msg: dict[str, Any] = {"action": action, "xid": 7, "lsn": "0/10", "schema": "public",
                           "table": "t", "pk": [{"name": "id", "type": "integer", "typeoid": 23}]}
    if columns is not None:
        msg["columns"] = columns
    if identity is not None:
        msg["identity"] = [{k: v for k, v in c.items() if k != "position"} for c in identity]
    return json.dumps(msg).encode()


def _full(*values: Any) -> list[dict[str, Any]]:
    return [_col("id", INT4, values[0], 1), _col("big", TEXT, values[1], 2),
            _col("small", INT4, values[2], 3)]


def _row(decoder: Wal2JsonCaptureDecoder, message: bytes, at: int = 0x20) -> CapturedRow:
    row = decoder.decode(message, at)
    assert isinstance(row, CapturedRow)
    return row


def test_begin_and_commit_give_xid_commit_time_and_the_previous_commit_of_a_written_one() -> None:
    decoder = _decoder(Catalog(TABLE, POSITIONS))
    begin = b'{"action":"B","xid":7,"timestamp":"2026-12-06 17:00:00.123456+01","lsn":"0/30"}'
    commit = b'{"action":"C","xid":7,"lsn":"0/30","nextlsn":"0/38"}'
    assert isinstance(decoder.decode(begin, 0x10), Begin)
    row = _row(decoder, _msg("I", _full(1, "a", 2)))
    assert (row.xid, row.commit_us, row.last_commit) == (7, 1796572800123456, None)
    assert isinstance(decoder.decode(commit, 0x38), Commit)
    decoder.decode(begin.replace(b":7", b":8"), 0x40)  # a transaction without changes:
    decoder.decode(commit.replace(b"0/38", b"0/48"), 0x48)  # pgoutput sends nothing of it
    decoder.decode(begin.replace(b":7", b":9"), 0x50)
    assert _row(decoder, _msg("I", _full(2, "b", 3))).last_commit == 0x38


def test_values_are_the_text_pgoutput_sends_numbers_never_through_a_float() -> None:
    shape = TableShape("public", "t", (
        ColumnShape("id", INT4, type_name="integer", not_null=True),
        ColumnShape("n", NUMERIC, type_name="numeric"), ColumnShape("b", BYTEA, type_name="bytea"),
        ColumnShape("f", BOOL, type_name="boolean"), ColumnShape("d", FLOAT8)), ("id",))
    decoder = _decoder(Catalog(shape, {"id": 1, "n": 2, "b": 3, "f": 4, "d": 5}))
    message = (b'{"action":"I","schema":"public","table":"t","columns":['
               b'{"name":"id","type":"integer","typeoid":23,"value":1,"position":1},'
               b'{"name":"n","type":"numeric","typeoid":1700,"value":'
               b'12345678901234567890.123456789000,"position":2},'
               b'{"name":"b","type":"bytea","typeoid":17,"value":"deadbeef","position":3},'
               b'{"name":"f","type":"boolean","typeoid":16,"value":false,"position":4},'
               b'{"name":"d","type":"double precision","typeoid":701,"value":-0,"position":5}]}')
    row = _row(decoder, message)
    assert row.new == [b"1", b"12345678901234567890.123456789000", b"\\xdeadbeef", b"f", b"-0"]


def test_an_update_without_a_toasted_column_marks_it_unchanged_and_has_no_old_image() -> None:
    decoder = _decoder(Catalog(TABLE, POSITIONS))
    _row(decoder, _msg("I", _full(1, "x" * 10, 1)))
    update = _msg("U", [_col("id", INT4, 1, 1), _col("small", INT4, 2, 3)],
                  identity=[_col("id", INT4, 1)])  # the key from the new row: unchanged
    row = _row(decoder, update)
    assert row.op == "u" and row.new == [b"1", UNCHANGED, b"2"] and row.old is None


def test_a_column_added_after_the_change_is_not_taken_for_an_unchanged_one() -> None:
    now = TableShape("public", "t", (*TABLE.columns, ColumnShape("later", TEXT, type_name="text")),
                     ("id",))
    decoder = _decoder(Catalog(now, {**POSITIONS, "later": 4}))
    row = _row(decoder, _msg("U", _full(1, "a", 2), identity=[_col("id", INT4, 1)]))
    assert row.new == [b"1", b"a", b"2"]  # 'later' (position 4) came after: not in the row
    assert row.table.shape.columns[-1].name == "small"


def test_a_dropped_or_renamed_column_is_not_taken_for_an_unchanged_one() -> None:
    # the catalog now: big renamed to huge (same position 2), small dropped
    now = TableShape("public", "t", (TABLE.columns[0], ColumnShape("huge", TEXT, type_name="text")),
                     ("id",))
    decoder = _decoder(Catalog(now, {"id": 1, "huge": 2}))
    row = _row(decoder, _msg("U", _full(1, "a", 2), identity=[_col("id", INT4, 1)]))
    assert [c.name for c in row.table.shape.columns] == ["id", "big", "small"]
    assert row.new == [b"1", b"a", b"2"]


def test_a_changed_key_is_an_old_image_of_the_key_columns() -> None:
    decoder = _decoder(Catalog(TABLE, POSITIONS))
    row = _row(decoder, _msg("U", _full(10, "a", 2), identity=[_col("id", INT4, 2)]))
    assert row.old == [b"2", None, None]
    routed = CaptureRouter(SourceInfo("v", "pfx", "db"), clock_ns=lambda: 0).route(row)
    assert [m.event_type for m in routed.messages] == ["d", "tombstone", "c"]


def test_replica_identity_full_gives_the_old_row_even_when_nothing_changed() -> None:
    full = TableShape("public", "t", TABLE.columns, ("id",), "f")
    decoder = _decoder(Catalog(full, POSITIONS))
    row = _row(decoder, _msg("U", _full(1, "a", 2), identity=_full(1, "a", 2)))
    assert row.old == [b"1", b"a", b"2"]
    deleted = _row(decoder, _msg("D", identity=_full(1, "a", 2)))
    assert deleted.op == "d" and deleted.old == [b"1", b"a", b"2"]


def test_a_delete_under_default_identity_takes_the_last_layout_with_its_key() -> None:
    catalog = Catalog(TABLE, POSITIONS)
    decoder = _decoder(catalog)
    first = _row(decoder, _msg("I", _full(1, "a", 2)))
    row = _row(decoder, _msg("D", identity=[_col("id", INT4, 1)]))
    assert row.table is first.table and row.old == [b"1", None, None]
    fresh = _decoder(Catalog(TABLE, POSITIONS))  # no change seen yet: the catalog's
    assert _row(fresh, _msg("D", identity=[_col("id", INT4, 1)])).old == [b"1", None, None]


def test_a_null_in_a_not_null_number_column_is_a_dead_letter_not_a_zero() -> None:
    shape = TableShape("public", "t", (ColumnShape("id", INT4, type_name="integer", not_null=True),
                                       ColumnShape("d", FLOAT8, type_name="double precision",
                                                   not_null=True)), ("id",))
    decoder = _decoder(Catalog(shape, {"id": 1, "d": 2}))
    row = _row(decoder, _msg("I", [_col("id", INT4, 1, 1), _col("d", FLOAT8, None, 2)]))
    routed = CaptureRouter(SourceInfo("v", "pfx", "db"), clock_ns=lambda: 0).route(row)
    assert routed.problem is not None and "wal2json writes them as null" in routed.problem


def test_a_truncate_is_one_row_of_the_table_with_capture_truncate() -> None:
    decoder = _decoder(Catalog(TABLE, POSITIONS), truncate=True)
    row = _row(decoder, b'{"action":"T","xid":7,"schema":"public","table":"t"}')
    assert row.op == "t" and [c.shape.name for c in row.table] == ["t"]
    assert _decoder(Catalog(TABLE, POSITIONS)).decode(
        b'{"action":"T","schema":"public","table":"t"}', 0x20) is None


def test_the_catalog_is_read_again_only_when_the_layout_changes() -> None:
    catalog = Catalog(TABLE, POSITIONS)
    decoder = _decoder(catalog)
    _row(decoder, _msg("I", _full(1, "a", 2)))
    _row(decoder, _msg("I", _full(2, "b", 3)))
    assert catalog.reads == 1


def test_a_malformed_message_of_a_captured_table_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="LSN 0/20"):
        _decoder(Catalog(TABLE, POSITIONS)).decode(
            b'{"action":"I","schema":"public","table":"t"}', 0x20)


@pytest.mark.parametrize(("text", "typmod"), [
    ("numeric(10,2)", (10 << 16 | 2) + 4), ("numeric(5,1)[]", (5 << 16 | 1) + 4),
    ("numeric", -1), ("character varying(10)", 14), ("character(3)", 7), ("bit(3)", 3),
    ("time(3) without time zone", 3), ("timestamp(0) with time zone", 0),
    ("timestamp without time zone", -1), ("interval(3)", 0x7FFF << 16 | 3),
    ("interval day to second(3)", (1 << 3 | 1 << 10 | 1 << 11 | 1 << 12) << 16 | 3),
    ("interval", -1), ("mood", -1), ("text", -1),
])
def test_parse_typmod_reads_format_types_text(text: str, typmod: int) -> None:
    assert parse_typmod(text) == typmod


def test_capture_options_name_the_outbox_and_the_tables_and_ask_for_what_capture_needs() -> None:
    options = dict(capture_options(TableRef("public", "outbox"), [("public", "t"), ("s", "a.b")],
                                   truncate=True))
    assert options["add-tables"] == "public.outbox,public.t,s.a\\.b"
    assert options["actions"] == "insert,update,delete,truncate"
    assert (options["include-types"], options["include-type-oids"], options["include-pk"],
            options["include-timestamp"], options["include-column-positions"]) == ("1",) * 5
    alone = dict(capture_options(None, [("public", "t")], truncate=False, partitioned=False))
    assert alone["add-tables"] == "public.t" and alone["actions"] == "insert,update,delete"

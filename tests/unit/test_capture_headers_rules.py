"""A primary-key change's ``__debezium.*key`` header text (capture/headers.py), against what
Kafka Connect's SimpleHeaderConverter made of Debezium 3.6's key structs."""

from __future__ import annotations

import pytest

from cdc_relay.capture.headers import key_header
from cdc_relay.capture.jsonw import Float32


def test_a_struct_is_written_with_only_backslash_and_quote_escaped() -> None:
    # Debezium's key (numeric(6,2), text, bytea, float8) = (2.25, 'a\nb"c\dé/', '\x00ff', 1e20)
    key = {"n": "AOE=", "s": 'a\nb"c\\dé/', "b": "AP8=", "f": 1e20}
    assert key_header(key, {"n": 2}) == '{"n":2.25,"s":"a\nb\\"c\\\\dé/","b":"AP8=","f":1.0E20}'.encode()
    assert key_header({"b": "x", "a": 2}) == b'{"b":"x","a":2}'


@pytest.mark.parametrize(("unscaled", "scale", "text"), [
    ("AJY=", 2, "1.50"), ("/2o=", 2, "-1.50"), ("AA==", 3, "0.000"), ("ew==", 0, "123"),
    ("AQ==", 7, "1E-7"), ("AQ==", 9, "1E-9"), ("DA==", 8, "1.2E-7"), ("AQ==", 6, "0.000001"),
])
def test_a_decimal_is_its_number_as_bigdecimal_prints_it(unscaled: str, scale: int, text: str) -> None:
    assert key_header({"d": unscaled}, {"d": scale}) == ('{"d":' + text + "}").encode()


def test_other_values_as_connect_prints_them() -> None:
    key = {"i": -3, "t": True, "n": None, "r": Float32(0.1), "x": float("nan"),
           "v": {"scale": 2, "value": "AJY="}, "a": [1, "q"]}
    assert key_header(key) == (b'{"i":-3,"t":true,"n":null,"r":0.1,"x":NaN,'
                               b'"v":{"scale":2,"value":"AJY="},"a":[1,"q"]}')

"""Debezium's name adjustment for Avro (cdc_relay/capture/names.py) and the codec using it:
the names Debezium 3.6 embedded wrote with ``avro`` (tests/integration/test_capture_avro_names.py),
and an Avro-illegal name refused before the registry with the fix named."""

from __future__ import annotations

import orjson
import pytest

from cdc_relay.capture.envelope import TableCodec
from cdc_relay.capture.names import adjust_field_name, adjust_schema_name
from cdc_relay.capture.shape import ColumnShape, TableShape
from cdc_relay.sink.registry.formats import _check_avro_names

SHAPE = TableShape("public", "my-table", (ColumnShape("order-id", 23, not_null=True),
                                          ColumnShape("1st", 25), ColumnShape("größe", 23)),
                   ("order-id",))


@pytest.mark.parametrize(("name", "avro"), [("order-id", "order_id"), ("1st", "_1st"),
                                            ("größe", "gr__e"), ("_ok9", "_ok9")])
def test_field_names_as_debezium_adjusts_them(name: str, avro: str) -> None:
    assert adjust_field_name(name, "avro") == avro
    assert adjust_field_name(name, "none") == name


def test_schema_names_keep_their_dots() -> None:
    assert adjust_schema_name("shop.public.my-table.Value", "avro") == "shop.public.my_table.Value"
    assert adjust_schema_name("1shop.x", "avro") == "_shop.x"
    assert adjust_schema_name("shop.public.my-table.Value", "none") == "shop.public.my-table.Value"


def _blocks(names: tuple[str, str]) -> tuple[dict[str, object], dict[str, object]]:
    codec = TableCodec(SHAPE, ("order-id", "1st", "größe"), "shop", True, "__u", names=names)
    image: list[bytes | object | None] = [b"1", b"x", b"2"]
    key = orjson.loads(codec.key_bytes(codec.key(image)) or b"")
    return key, {"row": codec.row(image), "topic": codec.topic}


def test_the_codec_adjusts_names_but_not_the_topic() -> None:
    key, value = _blocks(("avro", "avro"))
    assert key["schema"]["name"] == "shop.public.my_table.Key"  # type: ignore[index]
    assert key["payload"] == {"order_id": 1}
    assert value == {"row": {"order_id": 1, "_1st": "x", "gr__e": 2}, "topic": "shop.public.my-table"}


def test_an_avro_illegal_name_is_refused_with_the_option_that_fixes_it() -> None:
    key, _ = _blocks(("none", "none"))
    with pytest.raises(ValueError, match="--capture-schema-name-adjustment avro"):
        _check_avro_names(key["schema"])  # type: ignore[arg-type]
    key, _ = _blocks(("avro", "none"))
    with pytest.raises(ValueError, match="column 'order-id' is no legal Avro name: set "
                                         "--capture-field-name-adjustment avro"):
        _check_avro_names(key["schema"])  # type: ignore[arg-type]
    key, _ = _blocks(("avro", "avro"))
    _check_avro_names(key["schema"])  # type: ignore[arg-type]


def test_a_topic_keeps_what_kafka_allows_and_has_the_rest_replaced_as_debezium_does() -> None:
    from cdc_relay.capture.names import topic_name

    assert topic_name("shop", "public", "my-table") == "shop.public.my-table"
    assert topic_name("shop", "Sales", "my table") == "shop.Sales.my_table"
    assert topic_name("shop", "public", "größe\"x") == "shop.public.gr__e_x"
    assert len(topic_name("shop", "public", "t" * 300)) == 249

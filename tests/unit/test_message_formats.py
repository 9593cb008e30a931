"""Golden bytes of every ``--message-format``, for rows decoded from wal2json, pgoutput and
polling rows, and for tableless-outbox messages (docs/messages.md).

No Debezium runs here. The expected bytes are written out by hand from Debezium's
documented behaviour for the outbox event router on PostgreSQL:

* key = the ``aggregateid`` column, a non-optional string; value = the ``payload``
  column, a jsonb, i.e. a non-optional string of semantic type ``io.debezium.data.Json``
  (version 1), left as JSON *text* with the router's default
  ``table.expand.json.payload=false``; header ``id`` = the event id as UTF-8 text
  (Kafka Connect's default SimpleHeaderConverter).
* ``raw`` = StringConverter for key and value: the text itself.
* ``debezium-json`` = JsonConverter with ``schemas.enable=true`` (the stock Debezium
  Connect image): ``{"schema":{...},"payload":...}``, schema fields in JsonConverter's
  order (type, optional, name, version), no whitespace, strings escaped as Jackson does
  (``"`` and backslash escaped, non-ASCII as raw UTF-8).
* ``debezium-json-schemaless`` = JsonConverter with ``schemas.enable=false``: the JSON
  string alone.
"""

from __future__ import annotations

import struct
from typing import Any

import orjson
import pytest

from cdc_relay.config import RouterConfig, TableRef
from cdc_relay.decoding.pgoutput import PgOutputDecoder
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.formats import json_string
from cdc_relay.model import Lsn, OutboxColumns, OutboxEvent
from cdc_relay.polling.sql import event_from_row
from cdc_relay.routing import Router

EVENT_ID = "4d47e190-0402-4048-bc2c-89dd54343cdc"
# jsonb's normal form of {"customerId": 123, "id": 1, "note": 'grüße "ok"'}: keys by length.
PAYLOAD = '{"id": 1, "note": "grüße \\"ok\\"", "customerId": 123}'
AT = Lsn.parse("0/19477A0")
OUTBOX = TableRef()

GOLDEN: dict[str, tuple[bytes, bytes]] = {
    "raw": (b"1", PAYLOAD.encode()),
    "debezium-json": (
        b'{"schema":{"type":"string","optional":false},"payload":"1"}',
        r'{"schema":{"type":"string","optional":false,"name":"io.debezium.data.Json",'
        r'"version":1},"payload":"{\"id\": 1, \"note\": \"grüße \\\"ok\\\"\", '
        r'\"customerId\": 123}"}'.encode(),
    ),
    "debezium-json-schemaless": (
        b'"1"',
        r'"{\"id\": 1, \"note\": \"grüße \\\"ok\\\"\", \"customerId\": 123}"'.encode(),
    ),
}
HEADERS = [("id", EVENT_ID.encode()), ("event_type", b"OrderCreated"), ("aggregate_type", b"order")]
ROW = {
    "id": EVENT_ID, "aggregate_type": "order", "aggregate_id": "1", "event_type": "OrderCreated",
    "payload": PAYLOAD, "attempts": "0", "created_at": "2019-05-03 13:31:34.484+00",
    "processed_at": None, "tenant": "acme", "shard": "3", "traceparent": None,
}
CREATED_MS = 1556890294484


def wal2json_insert(row: dict[str, Any]) -> bytes:
    return orjson.dumps({"action": "I", "xid": 7, "lsn": str(AT), "schema": "public",
                         "table": "outbox_events",
                         "columns": [{"name": k, "value": v} for k, v in row.items()]})


def pg_relation(names: list[str], relid: int = 16384) -> bytes:
    out = b"R" + struct.pack("!I", relid) + b"public\x00outbox_events\x00"
    out += struct.pack("!bH", ord("d"), len(names))
    for name in names:
        out += b"\x00" + name.encode() + b"\x00" + struct.pack("!Ii", 25, -1)
    return out


def pg_insert(values: list[str | None], relid: int = 16384) -> bytes:
    out = b"I" + struct.pack("!I", relid) + b"N" + struct.pack("!H", len(values))
    for value in values:
        if value is None:
            out += b"n"
        else:
            data = value.encode()
            out += b"t" + struct.pack("!I", len(data)) + data
    return out


def pg_message(content: bytes, *, transactional: bool = True, prefix: str = "cdc-relay") -> bytes:
    return (b"M" + struct.pack("!BQ", 1 if transactional else 0, int(AT)) + prefix.encode()
            + b"\x00" + struct.pack("!I", len(content)) + content)


def from_wal2json(row: dict[str, Any], extra: tuple[str, ...] = ()) -> OutboxEvent:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns(), extra_columns=extra)
    event = decoder.decode(wal2json_insert(row), AT)
    assert isinstance(event, OutboxEvent)
    return event


def from_pgoutput(row: dict[str, Any], extra: tuple[str, ...] = ()) -> OutboxEvent:
    decoder = PgOutputDecoder(OUTBOX, OutboxColumns(), extra)
    assert decoder.decode(pg_relation(list(row)), Lsn(0)) is None
    event = decoder.decode(pg_insert(list(row.values())), AT)
    assert isinstance(event, OutboxEvent)
    return event


def from_polling(row: dict[str, Any], extra: tuple[str, ...] = ()) -> OutboxEvent:
    carried = [row[name] for name in extra]
    return event_from_row((EVENT_ID, "order", "1", "OrderCreated", PAYLOAD, CREATED_MS, 0,
                           EVENT_ID, *carried), len(extra))


SOURCES = {"wal2json": from_wal2json, "pgoutput": from_pgoutput, "polling": from_polling}


def envelope(**overrides: Any) -> bytes:
    fields = {"v": 1, "id": EVENT_ID, "aggregate_type": "order", "aggregate_id": "1",
              "event_type": "OrderCreated", "payload": PAYLOAD, "created_at": CREATED_MS,
              "traceparent": None, "tracestate": None, **overrides}
    return orjson.dumps(fields)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("message_format", GOLDEN)
def test_each_format_gives_the_golden_key_value_and_headers(source: str,
                                                            message_format: str) -> None:
    message = Router(RouterConfig(message_format=message_format)).route(SOURCES[source](ROW))
    assert (message.key, message.value) == GOLDEN[message_format]
    assert message.headers == HEADERS
    assert message.timestamp_ms == CREATED_MS
    assert message.partition is None  # the producer's murmur2 partitioner hashes message.key


@pytest.mark.parametrize("message_format", GOLDEN)
def test_a_logical_decoding_message_gives_the_same_message_as_the_row(message_format: str) -> None:
    router = Router(RouterConfig(message_format=message_format))
    wal2json = Wal2JsonDecoder(OUTBOX, OutboxColumns()).decode(orjson.dumps({
        "action": "M", "xid": 7, "lsn": str(AT), "transactional": True, "prefix": "cdc-relay",
        "content": envelope().decode()}), AT)
    pgoutput = PgOutputDecoder(OUTBOX, OutboxColumns()).decode(pg_message(envelope()), AT)
    from_row = router.route(from_wal2json(ROW))
    for event in (wal2json, pgoutput):
        assert isinstance(event, OutboxEvent)
        assert router.route(event) == from_row


def test_json_strings_are_escaped_as_jackson_escapes_them() -> None:
    assert json_string('q" b\\ \b\t\n\f\r \x01\x1f \x7f é 🚀 \u2028') == (
        '"q\\" b\\\\ \\b\\t\\n\\f\\r \\u0001\\u001F \x7f é 🚀 \u2028"'.encode())


@pytest.mark.parametrize("source", SOURCES)
def test_header_columns_become_text_headers_and_null_means_no_header(source: str) -> None:
    config = RouterConfig(header_columns=(("tenant", "tenant-id"), ("processed_at", "done")))
    extra = config.extra_columns()
    message = Router(config).route(SOURCES[source](ROW, extra))
    assert message.headers == [*HEADERS, ("tenant-id", b"acme")]


@pytest.mark.parametrize("source", SOURCES)
def test_partition_column_picks_the_partition(source: str) -> None:
    config = RouterConfig(partition_column="shard", header_columns=(("shard", "shard"),))
    message = Router(config).route(SOURCES[source](ROW, config.extra_columns()))
    assert message.partition == 3
    assert message.headers[-1] == ("shard", b"3")

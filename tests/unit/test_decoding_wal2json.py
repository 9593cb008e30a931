"""The wal2json v2 decoder against real server output (tests/fixtures) and hand-built messages.

The fixtures were captured by tests/fixtures/capture_decoding.py from PostgreSQL 15 with
wal2json 2.5; expected_outbox.json is the database's own account of each committed row.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_relay.config import TableRef
from cdc_relay.decoding.wal2json import TimestampParser, Wal2JsonDecoder, plugin_options
from cdc_relay.errors import DecodeError
from cdc_relay.model import Begin, Commit, Lsn, OutboxColumns, OutboxEvent
from tests.unit.decoding_fixtures import (
    AT,
    DEBEZIUM,
    FIXTURES,
    OUTBOX,
    WAL2JSON_PATHS,
    WIDE,
    as_row,
    decode_all,
    events,
    expected_rows,
    load,
)


def insert_message(columns: dict[str, Any], **extra: Any) -> bytes:
    message = {
        "action": "I",
        "xid": 728,
        "lsn": str(AT),
        "schema": "public",
        "table": "outbox_events",
        "columns": [{"name": name, "value": value} for name, value in columns.items()],
    }
    message.update(extra)
    return orjson.dumps(message)


def outbox_row(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": "7616f707-0000-4000-8000-000000000001",
        "aggregate_type": "order",
        "aggregate_id": "o-1",
        "event_type": "OrderCreated",
        "payload": '{"amount": 12.5, "orderId": "o-1"}',
        "attempts": 0,
        "created_at": "2026-11-30 11:11:26.123456+00",
        "processed_at": None,
    }
    row.update(overrides)
    return row


# ---------------------------------------------------------------- the captured stream


@WAL2JSON_PATHS
def test_fixture_yields_every_committed_outbox_row_in_commit_order(compiled: bool) -> None:
    decoded = events(decode_all("wal2json_v2.jsonl", OUTBOX, OutboxColumns()))
    assert [as_row(event, OUTBOX) for event in decoded] == expected_rows(OUTBOX)
    assert len(decoded) == 113


@WAL2JSON_PATHS
def test_fixture_first_event_is_decoded_exactly(compiled: bool) -> None:
    first = events(decode_all("wal2json_v2.jsonl", OUTBOX, OutboxColumns()))[0]
    assert first == OutboxEvent(
        id="00000000-0000-4000-8000-000000000001",
        aggregate_type="order",
        aggregate_id="o-1",
        event_type="OrderCreated",
        payload=b'{"amount": 12.5, "orderId": "o-1"}',
        created_at_ms=1796037086123,
        lsn=load("wal2json_v2.jsonl")[1][0],
    )


@WAL2JSON_PATHS
def test_fixture_unicode_and_escapes_survive_byte_for_byte(compiled: bool) -> None:
    decoded = events(decode_all("wal2json_v2.jsonl", OUTBOX, OutboxColumns()))
    by_id = {e.id: e for e in decoded}
    unicode_row = by_id["00000000-0000-4000-8000-000000000003"]
    assert unicode_row.aggregate_type == "注文"
    assert unicode_row.aggregate_id == "注文-42 😀"
    assert unicode_row.event_type == "Créé ✓"
    assert "😀🚀👩‍👩‍👧‍👦".encode() in unicode_row.payload
    assert "漢字かなカナ한국어".encode() in unicode_row.payload
    escapes = by_id["00000000-0000-4000-8000-000000000004"].payload
    # jsonb's normal form: sorted-by-length keys, "\u00e9" resolved, "\/" unescaped,
    # control characters kept as escapes.
    assert b'"ctrl": "\\u0001\\u001f"' in escapes
    assert b'"escaped_e": "\xc3\xa9"' in escapes
    assert b'"solidus": "a/b"' in escapes
    assert b'"quote": "say \\"hi\\""' in escapes
    assert orjson.loads(escapes)["emoji_escaped"] == "😀"


@WAL2JSON_PATHS
def test_fixture_jsonb_payload_is_jsonb_normal_form_not_the_inserted_text(compiled: bool) -> None:
    decoded = events(decode_all("wal2json_v2.jsonl", OUTBOX, OutboxColumns()))
    by_id = {e.id: e for e in decoded}
    numbers = by_id["00000000-0000-4000-8000-000000000005"].payload
    assert numbers.startswith(b'{"a": 2, "n": [0, 0, 1.0, 1.50, 1' + b"0" * 100 + b", ")
    assert b'"dup": 2' in numbers and b'"dup": 1' not in numbers
    assert by_id["00000000-0000-4000-8000-000000000006"].payload == b'"just a string"'


@WAL2JSON_PATHS
def test_fixture_large_payload_arrives_whole(compiled: bool) -> None:
    big = events(decode_all("wal2json_v2.jsonl", OUTBOX, OutboxColumns()))[-1]
    assert big.event_type == "BigPayload"
    assert len(big.payload) == 200_046
    assert orjson.loads(big.payload)["tail"] == [1, 2, 3]


@WAL2JSON_PATHS
def test_fixture_event_lsn_is_the_wal_start_and_the_lsn_field_of_its_row(compiled: bool) -> None:
    messages = load("wal2json_v2.jsonl")
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    checked = 0
    for wal_start, payload in messages:
        change = decoder.decode(payload, wal_start)
        if isinstance(change, OutboxEvent):
            assert change.lsn == wal_start == Lsn.parse(orjson.loads(payload)["lsn"])
            checked += 1
    assert checked == 113


@WAL2JSON_PATHS
def test_fixture_commit_end_lsn_is_nextlsn_which_is_the_c_message_position(compiled: bool) -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    commits = 0
    for wal_start, payload in load("wal2json_v2.jsonl"):
        change = decoder.decode(payload, wal_start)
        if isinstance(change, Commit):
            message = orjson.loads(payload)
            assert change.end_lsn == wal_start == Lsn.parse(message["nextlsn"])
            assert change.end_lsn > Lsn.parse(message["lsn"])  # lsn = the commit's start
            assert change.xid == message["xid"]
            commits += 1
    assert commits > 0


@WAL2JSON_PATHS
def test_fixture_transactions_are_balanced_and_empty_ones_still_arrive(compiled: bool) -> None:
    changes = decode_all("wal2json_v2.jsonl", OUTBOX, OutboxColumns())
    open_xid: int | None = None
    sizes: list[int] = []
    for change in changes:
        if isinstance(change, Begin):
            assert open_xid is None
            open_xid = change.xid
            sizes.append(0)
        elif isinstance(change, OutboxEvent):
            assert open_xid is not None
            sizes[-1] += 1
        else:
            assert isinstance(change, Commit)
            assert change.xid == open_xid
            open_xid = None
    assert open_xid is None
    # orders only, UPDATE, DELETE, other outbox tables, TRUNCATE, ALTER TABLE,
    # reset of the origin session: transactions without outbox inserts, as empty pairs.
    assert sizes.count(0) >= 6
    assert [size for size in sizes if size] == [1, 1, 3, 1, 2, 1, 1, 1, 1, 100, 1]


def test_fixture_rolled_back_rows_never_reach_the_stream() -> None:
    raw = (FIXTURES / "wal2json_v2.jsonl").read_text(encoding="utf-8")
    assert "00000000-0000-4000-8000-000000000900" not in raw  # rolled-back savepoint
    assert "00000000-0000-4000-8000-000000000901" not in raw  # rolled-back transaction
    assert "RolledBack" not in raw


@WAL2JSON_PATHS
def test_all_tables_fixture_ignores_updates_deletes_truncates_messages_and_other_tables(
    compiled: bool,
) -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    seen: dict[str, int] = {}
    for wal_start, payload in load("wal2json_v2_all.jsonl"):
        message = orjson.loads(payload)
        action = message["action"]
        change = decoder.decode(payload, wal_start)
        if action in ("U", "D", "T", "M") or (
            action == "I" and message["table"] != "outbox_events"
        ):
            assert change is None
            key = action if action != "I" else "I-other"
            seen[key] = seen.get(key, 0) + 1
    assert set(seen) == {"U", "D", "T", "M", "I-other"}


@pytest.mark.parametrize(
    ("table", "columns"),
    [
        (OUTBOX, OutboxColumns()),
        (DEBEZIUM, OutboxColumns.debezium()),
        (WIDE, OutboxColumns()),
    ],
)
@WAL2JSON_PATHS
def test_all_tables_fixture_with_types_and_kolkata_offsets_matches_the_database(
    table: TableRef, columns: OutboxColumns, compiled: bool
) -> None:
    decoded = events(decode_all("wal2json_v2_all.jsonl", table, columns))
    assert [as_row(event, table) for event in decoded] == expected_rows(table, partial=True)
    assert decoded


@WAL2JSON_PATHS
def test_wide_table_rows_keep_json_text_integer_ids_and_odd_timestamps(compiled: bool) -> None:
    decoded = events(decode_all("wal2json_v2_all.jsonl", WIDE, OutboxColumns()))
    assert [e.id for e in decoded] == ["1", "2", "3", "4"]  # bigint identity, as text
    assert decoded[0].payload == b'{ "kept":  "as written",\n  "order": [3,1,2] }'
    assert decoded[1].created_at_ms is None  # NULL
    assert decoded[2].created_at_ms is None  # infinity
    assert decoded[3].created_at_ms == -2208988800000  # "1900-01-01 05:21:10+05:21:10"


# ---------------------------------------------------------------- hand-built messages


@WAL2JSON_PATHS
def test_memoryview_payloads_decode_like_bytes(compiled: bool) -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    message = insert_message(outbox_row())
    assert decoder.decode(memoryview(b"xxxx" + message)[4:], AT) == decoder.decode(message, AT)


@WAL2JSON_PATHS
def test_begin_and_commit_without_optional_fields_fall_back(compiled: bool) -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    assert decoder.decode(b'{"action":"B"}', AT) == Begin(None)
    assert decoder.decode(b'{"action":"C"}', AT) == Commit(AT, None)
    assert decoder.decode(b'{"action":"C","xid":9,"nextlsn":"0/10"}', AT) == Commit(Lsn(16), 9)


@WAL2JSON_PATHS
def test_begin_carries_the_commit_record_lsn(compiled: bool) -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    begin = b'{"action":"B","xid":9,"lsn":"0/192D598","nextlsn":"0/192D5C8"}'
    assert decoder.decode(begin, AT) == Begin(9, Lsn.parse("0/192D598"))


@WAL2JSON_PATHS
def test_insert_without_lsn_field_uses_wal_start(compiled: bool) -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    message = orjson.loads(insert_message(outbox_row()))
    del message["lsn"]
    event = decoder.decode(orjson.dumps(message), AT)
    assert isinstance(event, OutboxEvent) and event.lsn == AT


@WAL2JSON_PATHS
def test_columns_are_found_again_when_the_table_changes_shape(compiled: bool) -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    first = decoder.decode(insert_message(outbox_row()), AT)
    reordered = dict(reversed(list(outbox_row(aggregate_id="o-2").items())))
    second = decoder.decode(insert_message({"new_col": 1, **reordered}), AT)
    third = decoder.decode(insert_message(outbox_row(aggregate_id="o-3")), AT)
    assert isinstance(first, OutboxEvent) and first.aggregate_id == "o-1"
    assert isinstance(second, OutboxEvent) and second.aggregate_id == "o-2"
    assert isinstance(third, OutboxEvent) and third.aggregate_id == "o-3"
    assert second.payload == first.payload and second.created_at_ms == first.created_at_ms


@WAL2JSON_PATHS
def test_debezium_column_names_work_by_configuration(compiled: bool) -> None:
    decoder = Wal2JsonDecoder(DEBEZIUM, OutboxColumns.debezium())
    row = {
        "id": "a1",
        "aggregatetype": "customer",
        "aggregateid": "c-1",
        "type": "CustomerCreated",
        "payload": "{}",
        "created_at": "2026-11-30 11:11:26+00",
    }
    event = decoder.decode(insert_message(row, table="outbox_debezium"), AT)
    assert event == OutboxEvent("a1", "customer", "c-1", "CustomerCreated", b"{}",
                                1796037086000, AT)
    # the same row on the default table is not this decoder's business
    assert decoder.decode(insert_message(row), AT) is None


@WAL2JSON_PATHS
def test_a_table_without_created_at_can_be_mapped_with_an_empty_name(compiled: bool) -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns(created_at=""))
    row = outbox_row()
    del row["created_at"]
    event = decoder.decode(insert_message(row), AT)
    assert isinstance(event, OutboxEvent) and event.created_at_ms is None


@WAL2JSON_PATHS
def test_integer_ids_become_their_decimal_text(compiled: bool) -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    event = decoder.decode(insert_message(outbox_row(id=12345678901234, aggregate_id=7)), AT)
    assert isinstance(event, OutboxEvent)
    assert (event.id, event.aggregate_id) == ("12345678901234", "7")


@WAL2JSON_PATHS
def test_rows_of_other_tables_and_schemas_decode_to_none(compiled: bool) -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    assert decoder.decode(insert_message(outbox_row(), table="orders"), AT) is None
    assert decoder.decode(insert_message(outbox_row(), schema="audit"), AT) is None
    for action in ("U", "D", "T", "M"):
        assert decoder.decode(orjson.dumps({"action": action}), AT) is None


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"not json", "not JSON"),
        (b"", "not JSON"),
        (b'["action", "I"]', "expected a JSON object"),
        (b'{"xid": 1}', "without 'action'"),
        (b'{"action": "X"}', "unknown action 'X'"),
        (b'{"action": []}', "unknown action []"),
        (b'{"action": {"I": 1}}', "unknown action {'I': 1}"),
        (b'{"action": "I", "table": "outbox_events"}', "without 'schema' and 'table'"),
        (b'{"action": "I", "schema": "public", "table": "outbox_events"}', "columns"),
        (
            b'{"action":"I","schema":"public","table":"outbox_events","columns":[{"x":1}]}',
            "columns",
        ),
        (b'{"action": "C", "nextlsn": "nonsense"}', "bad 'nextlsn'"),
        (b'{"action": "C", "nextlsn": 42}', "bad 'nextlsn'"),
        (b'{"action": "B", "xid": "728"}', "bad 'xid'"),
    ],
)
@WAL2JSON_PATHS
def test_malformed_messages_raise_decode_error_naming_the_lsn(
    payload: bytes, problem: str, compiled: bool
) -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    with pytest.raises(DecodeError) as info:
        decoder.decode(payload, AT)
    assert "16/B374D848" in str(info.value)
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"aggregate_type": None}, "'aggregate_type' of public.outbox_events is NULL"),
        ({"payload": None}, "'payload' of public.outbox_events is NULL"),
        ({"id": None}, "'id' of public.outbox_events is NULL"),
        ({"event_type": True}, "JSON type bool"),
        ({"aggregate_id": 1.5}, "JSON type float"),
        ({"payload": {"a": 1}}, "JSON type dict"),
        ({"created_at": "30/11/2026 11:11:26 UTC"}, "DateStyle=ISO"),
        ({"created_at": "0044-03-15 12:00:00+00 BC"}, "unparseable timestamp"),
        ({"created_at": 1796037086}, "'created_at' of public.outbox_events has a value"),
        ({"aggregate_type": "__drop__"}, "'aggregate_type' of public.outbox_events is missing"),
        ({"created_at": "__drop__"}, "'created_at' of public.outbox_events is missing"),
    ],
)
@WAL2JSON_PATHS
def test_bad_column_values_raise_decode_error_naming_lsn_and_column(
    row: dict[str, Any], problem: str, compiled: bool
) -> None:
    columns = outbox_row(**row)
    columns = {name: value for name, value in columns.items() if value != "__drop__"}
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    with pytest.raises(DecodeError) as info:
        decoder.decode(insert_message(columns), AT)
    assert "16/B374D848" in str(info.value)
    assert problem in str(info.value)


@WAL2JSON_PATHS
def test_a_mapped_column_missing_after_a_good_row_is_still_reported(compiled: bool) -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    assert isinstance(decoder.decode(insert_message(outbox_row()), AT), OutboxEvent)
    row = outbox_row()
    del row["event_type"]
    with pytest.raises(DecodeError, match=re.escape("'event_type' of public.outbox_events is missing")):
        decoder.decode(insert_message(row), AT)


# ---------------------------------------------------------------- options and timestamps


def test_plugin_options_ask_for_v2_inserts_of_the_outbox_table_only() -> None:
    assert plugin_options(OUTBOX) == [
        ("format-version", "2"),
        ("include-transaction", "1"),
        ("include-xids", "1"),
        ("include-lsn", "1"),
        ("include-schemas", "1"),
        ("include-types", "0"),
        ("include-timestamp", "0"),
        ("include-type-oids", "0"),
        ("actions", "insert"),
        ("add-tables", "public.outbox_events"),
        ("add-msg-prefixes", "cdc-relay"),
    ]


def test_plugin_options_escape_what_wal2json_add_tables_treats_specially() -> None:
    options = dict(plugin_options(TableRef("my.schema", "out,box *")))
    assert options["add-tables"] == "my\\.schema.out\\,box\\ \\*"


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2026-11-30 11:11:26.123456+00", 1796037086123),
        ("2026-11-30 11:11:26+00", 1796037086000),
        ("2026-11-30 16:41:26.1234+05:30", 1796037086123),
        ("2026-11-30 08:11:26.9999-03", 1796037086999),
        ("1900-01-01 05:21:10+05:21:10", -2208988800000),
        ("1969-12-31 23:59:59.9995+00", -1),
        ("1970-01-01 00:00:00+00", 0),
        ("2026-11-30 11:11:26.123456", 1796037086123),  # timestamp without time zone: UTC
        ("infinity", None),
        ("-infinity", None),
    ],
)
def test_timestamps_in_any_iso_offset_become_epoch_milliseconds(text: str, ms: int | None) -> None:
    assert TimestampParser().parse(text) == ms


def test_timestamp_parser_cache_never_returns_a_stale_value() -> None:
    parser = TimestampParser()
    assert parser.parse("1970-01-01 00:00:01+00") == 1000
    assert parser.parse("1970-01-01 00:00:01+00") == 1000
    assert parser.parse("1970-01-01 00:00:02+00") == 2000
    with pytest.raises(ValueError, match="unparseable"):
        parser.parse("yesterday")
    assert parser.parse("1970-01-01 00:00:02+00") == 2000


# ---------------------------------------------------------------- properties

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
# Text PostgreSQL can store: no NUL, no lone surrogates.
pg_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(document=json_values, aggregate_id=pg_text, event_type=pg_text)
@WAL2JSON_PATHS
def test_any_json_payload_and_text_round_trip_exactly(
    document: object, aggregate_id: str, event_type: str, compiled: bool
) -> None:
    payload_text = json.dumps(document, ensure_ascii=False)  # stands in for jsonb's text
    row = outbox_row(payload=payload_text, aggregate_id=aggregate_id, event_type=event_type)
    event = Wal2JsonDecoder(OUTBOX, OutboxColumns()).decode(insert_message(row), AT)
    assert isinstance(event, OutboxEvent)
    assert event.payload == payload_text.encode()
    assert (event.aggregate_id, event.event_type) == (aggregate_id, event_type)

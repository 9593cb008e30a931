"""The pgoutput v1 decoder against real server output (tests/fixtures) and hand-built messages.

Also the cross-check the relay's two modes of WAL reading rely on: wal2json and pgoutput
turn the same rows into identical OutboxEvents.

Every test runs twice, once with the pure decoder and once with the compiled fast path
(``decoder_path``); test_decoding_pgoutput_compiled.py compares the two directly.
"""

from __future__ import annotations

import re
import struct
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_relay.config import TableRef
from cdc_relay.decoding.pgoutput import PgOutputDecoder, plugin_options
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.errors import DecodeError
from cdc_relay.model import Begin, Commit, Lsn, OutboxColumns, OutboxEvent
from tests.unit.decoding_fixtures import (
    AT,
    DEBEZIUM,
    OUTBOX,
    WIDE,
    as_row,
    decode_all,
    events,
    expected_rows,
    load,
)

OUTBOX_COLUMNS = [
    "id", "aggregate_type", "aggregate_id", "event_type", "payload", "attempts",
    "created_at", "processed_at", "retry_after", "last_error", "dead_lettered_at",
]  # fmt: skip


@pytest.fixture(autouse=True)
def decoder_path(compiled: bool) -> bool:
    """Every PgOutputDecoder of the test (decoding_fixtures' too) on the ``compiled``
    fixture's path (tests/conftest.py)."""
    assert PgOutputDecoder(OUTBOX, OutboxColumns()).compiled is compiled
    return compiled


# ---------------------------------------------------------------- message builders


def cstring(text: str) -> bytes:
    return text.encode() + b"\x00"


def begin(xid: int, final_lsn: int = 0x1000) -> bytes:
    return b"B" + struct.pack("!QqI", final_lsn, 0, xid)


def commit(end_lsn: int, commit_lsn: int = 0x0F00) -> bytes:
    return b"C" + struct.pack("!BQQq", 0, commit_lsn, end_lsn, 0)


def relation(relid: int, columns: list[str], schema: str = "public",
             name: str = "outbox_events") -> bytes:
    out = b"R" + struct.pack("!I", relid) + cstring(schema) + cstring(name)
    out += struct.pack("!bH", ord("d"), len(columns))
    for column in columns:
        out += b"\x00" + cstring(column) + struct.pack("!Ii", 25, -1)
    return out


Value = bytes | None | tuple[str, bytes]


def tuple_data(values: list[Value]) -> bytes:
    out = struct.pack("!H", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif isinstance(value, tuple):  # ("u", b"") or ("b", data)
            kind, data = value
            out += b"u" if kind == "u" else b"b" + struct.pack("!I", len(data)) + data
        else:
            out += b"t" + struct.pack("!I", len(value)) + value
    return out


def insert(relid: int, values: list[Value]) -> bytes:
    return b"I" + struct.pack("!I", relid) + b"N" + tuple_data(values)


def outbox_values(**overrides: Value) -> list[Value]:
    row: dict[str, Value] = {
        "id": b"7616f707-0000-4000-8000-000000000001",
        "aggregate_type": b"order",
        "aggregate_id": b"o-1",
        "event_type": b"OrderCreated",
        "payload": b'{"amount": 12.5, "orderId": "o-1"}',
        "attempts": b"0",
        "created_at": b"2026-11-30 11:11:26.123456+00",
        "processed_at": None,
        "retry_after": None,
        "last_error": None,
        "dead_lettered_at": None,
    }
    row.update(overrides)
    return list(row.values())


def _with_kind(kind: bytes, before: bytes) -> bytes:
    message = insert(16384, outbox_values())
    at = message.index(before) - 5  # the kind byte, then the 4-byte length
    return message[:at] + kind + message[at + 1 :]


def primed(columns: OutboxColumns | None = None) -> PgOutputDecoder:
    decoder = PgOutputDecoder(OUTBOX, columns or OutboxColumns())
    assert decoder.decode(relation(16384, OUTBOX_COLUMNS), Lsn(0)) is None
    return decoder


# ---------------------------------------------------------------- the captured stream


def test_fixture_yields_every_committed_outbox_row_in_commit_order() -> None:
    decoded = events(decode_all("pgoutput_v1.jsonl", OUTBOX, OutboxColumns()))
    assert [as_row(event, OUTBOX) for event in decoded] == expected_rows(OUTBOX)
    assert len(decoded) == 113


def test_fixture_event_lsn_is_the_insert_wal_start() -> None:
    decoder = PgOutputDecoder(OUTBOX, OutboxColumns())
    checked = 0
    for wal_start, payload in load("pgoutput_v1.jsonl"):
        change = decoder.decode(payload, wal_start)
        if isinstance(change, OutboxEvent):
            assert change.lsn == wal_start
            checked += 1
    assert checked == 113


def test_fixture_commit_end_lsn_is_read_at_offset_10_and_equals_the_c_position() -> None:
    decoder = PgOutputDecoder(OUTBOX, OutboxColumns())
    xids = []
    for wal_start, payload in load("pgoutput_v1.jsonl"):
        change = decoder.decode(payload, wal_start)
        if isinstance(change, Begin):
            xids.append(change.xid)
        if isinstance(change, Commit):
            assert change.end_lsn == wal_start == struct.unpack_from("!Q", payload, 10)[0]
            assert change.xid == xids[-1]
    assert len(xids) == 11  # pgoutput 15 skips transactions without published changes


def test_fixture_schema_change_mid_stream_resends_relation_and_is_followed() -> None:
    messages = load("pgoutput_v1.jsonl")
    relations = [payload for _, payload in messages if payload[:1] == b"R"]
    assert len(relations) == 2 and relations[0][1:5] == relations[1][1:5]  # same relid
    assert b"trace_id\x00" in relations[1] and b"trace_id\x00" not in relations[0]
    by_id = {e.id: e for e in events(decode_all("pgoutput_v1.jsonl", OUTBOX, OutboxColumns()))}
    assert by_id["00000000-0000-4000-8000-000000000012"].event_type == "AfterAlter"


def test_fixture_relation_type_and_origin_preceded_begin_have_no_position() -> None:
    # A fact of the protocol the relay must respect: only the last message of a write
    # carries a position; never treat a message's wal_start as one.
    kinds_at_zero = {payload[:1] for wal_start, payload in load("pgoutput_v1_all.jsonl")
                     if wal_start == 0}
    assert kinds_at_zero == {b"R", b"Y", b"B"}


def test_all_tables_fixture_ignores_origin_type_truncate_update_delete_messages() -> None:
    decoder = PgOutputDecoder(OUTBOX, OutboxColumns())
    seen = set()
    for wal_start, payload in load("pgoutput_v1_all.jsonl"):
        change = decoder.decode(payload, wal_start)
        kind = payload[:1]
        if kind in (b"O", b"Y", b"T", b"U", b"D", b"M", b"R"):
            assert change is None
            seen.add(kind)
    assert seen == {b"O", b"Y", b"T", b"U", b"D", b"M", b"R"}


@pytest.mark.parametrize(
    ("table", "columns"),
    [
        (OUTBOX, OutboxColumns()),
        (DEBEZIUM, OutboxColumns.debezium()),
        (WIDE, OutboxColumns()),
    ],
)
def test_all_tables_fixture_matches_the_database(table: TableRef, columns: OutboxColumns) -> None:
    decoded = events(decode_all("pgoutput_v1_all.jsonl", table, columns))
    assert [as_row(event, table) for event in decoded] == expected_rows(table, partial=True)
    assert decoded


def test_rolled_back_rows_never_reach_the_stream() -> None:
    for name in ("pgoutput_v1.jsonl", "pgoutput_v1_all.jsonl"):
        for _, payload in load(name):
            assert b"00000000-0000-4000-8000-00000000090" not in payload
            assert b"RolledBack" not in payload


# ---------------------------------------------------------------- wal2json == pgoutput


@pytest.mark.parametrize(
    ("wal2json", "pgoutput", "table", "columns"),
    [
        ("wal2json_v2.jsonl", "pgoutput_v1.jsonl", OUTBOX, OutboxColumns()),
        ("wal2json_v2_all.jsonl", "pgoutput_v1_all.jsonl", OUTBOX, OutboxColumns()),
        ("wal2json_v2_all.jsonl", "pgoutput_v1_all.jsonl", DEBEZIUM, OutboxColumns.debezium()),
        ("wal2json_v2_all.jsonl", "pgoutput_v1_all.jsonl", WIDE, OutboxColumns()),
    ],
)
def test_both_plugins_yield_identical_events_for_the_same_rows(
    wal2json: str, pgoutput: str, table: TableRef, columns: OutboxColumns
) -> None:
    from_wal2json = events(decode_all(wal2json, table, columns))
    from_pgoutput = events(decode_all(pgoutput, table, columns))
    assert from_wal2json
    # Identical including the lsn: both report the start of the row's WAL record.
    assert from_wal2json == from_pgoutput


def test_both_plugins_confirm_the_same_commit_positions() -> None:
    w2j = [c.end_lsn for c in decode_all("wal2json_v2.jsonl", OUTBOX, OutboxColumns())
           if isinstance(c, Commit)]
    pgo = [c.end_lsn for c in decode_all("pgoutput_v1.jsonl", OUTBOX, OutboxColumns())
           if isinstance(c, Commit)]
    # wal2json also sends the transactions without outbox rows (empty B/C pairs).
    assert set(pgo) < set(w2j)
    assert pgo == sorted(pgo)


# ---------------------------------------------------------------- hand-built messages


def test_begin_insert_commit_decode_to_changes() -> None:
    decoder = primed()
    assert decoder.decode(begin(728), AT) == Begin(728, Lsn(0x1000))
    assert decoder.decode(insert(16384, outbox_values()), AT) == OutboxEvent(
        "7616f707-0000-4000-8000-000000000001",
        "order",
        "o-1",
        "OrderCreated",
        b'{"amount": 12.5, "orderId": "o-1"}',
        1796037086123,
        AT,
    )
    assert decoder.decode(commit(0x2000), Lsn(0x2000)) == Commit(Lsn(0x2000), 728)


def test_memoryview_payloads_decode_like_bytes() -> None:
    decoder = primed()
    message = insert(16384, outbox_values())
    assert decoder.decode(memoryview(b"xx" + message)[2:], AT) == decoder.decode(message, AT)


def test_inserts_into_other_relations_decode_to_none() -> None:
    decoder = primed()
    decoder.decode(relation(500, ["id", "customer"], name="orders"), Lsn(0))
    assert decoder.decode(insert(500, [b"1", b"alice"]), AT) is None
    decoder.decode(relation(501, OUTBOX_COLUMNS, schema="audit"), Lsn(0))
    assert decoder.decode(insert(501, outbox_values()), AT) is None


def test_ignored_message_types_decode_to_none() -> None:
    decoder = primed()
    for message in (b"O" + struct.pack("!Q", 5) + cstring("upstream"),
                    b"Y" + struct.pack("!I", 7) + cstring("public") + cstring("mood"),
                    b"T" + struct.pack("!IbI", 1, 0, 16384),
                    b"U" + struct.pack("!I", 16384) + b"N" + tuple_data(outbox_values()),
                    b"D" + struct.pack("!I", 16384) + b"K" + tuple_data(outbox_values()),
                    b"M\x01" + struct.pack("!Q", 5) + cstring("other_tool") + struct.pack("!I", 2)
                    + b"hi"):
        assert decoder.decode(message, AT) is None


def test_reset_forgets_relations_until_they_are_sent_again() -> None:
    decoder = primed()
    decoder.reset()
    with pytest.raises(DecodeError, match="relation id 16384, which no Relation message"):
        decoder.decode(insert(16384, outbox_values()), AT)
    decoder.decode(relation(16384, OUTBOX_COLUMNS), Lsn(0))
    assert isinstance(decoder.decode(insert(16384, outbox_values()), AT), OutboxEvent)


def test_debezium_column_names_work_by_configuration() -> None:
    decoder = PgOutputDecoder(DEBEZIUM, OutboxColumns.debezium())
    columns = ["id", "aggregatetype", "aggregateid", "type", "payload", "created_at"]
    decoder.decode(relation(7, columns, name="outbox_debezium"), Lsn(0))
    event = decoder.decode(
        insert(7, [b"a1", b"customer", b"c-1", b"CustomerCreated", b"{}",
                   b"2026-11-30 11:11:26+00"]),
        AT,
    )
    assert event == OutboxEvent("a1", "customer", "c-1", "CustomerCreated", b"{}",
                                1796037086000, AT)


def test_columns_are_found_by_name_in_any_order_and_trailing_ones_are_skipped() -> None:
    decoder = PgOutputDecoder(OUTBOX, OutboxColumns())
    names = ["extra", "payload", "created_at", "id", "event_type", "aggregate_id",
             "aggregate_type", "tail"]
    decoder.decode(relation(9, names), Lsn(0))
    values: list[Value] = [None, b"[1]", b"1970-01-01 00:00:01+00", b"i", b"e", b"a", b"t",
                           ("b", b"\x00\x01")]
    event = decoder.decode(insert(9, values), AT)
    assert event == OutboxEvent("i", "t", "a", "e", b"[1]", 1000, AT)


def test_a_table_without_created_at_can_be_mapped_with_an_empty_name() -> None:
    decoder = PgOutputDecoder(OUTBOX, OutboxColumns(created_at=""))
    decoder.decode(relation(3, OUTBOX_COLUMNS[:5]), Lsn(0))
    event = decoder.decode(insert(3, outbox_values()[:5]), AT)
    assert isinstance(event, OutboxEvent) and event.created_at_ms is None


def test_null_created_at_and_infinity_give_no_timestamp() -> None:
    decoder = primed()
    for value in (None, b"infinity"):
        event = decoder.decode(insert(16384, outbox_values(created_at=value)), AT)
        assert isinstance(event, OutboxEvent) and event.created_at_ms is None


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        (b"", "empty message"),
        (b"Z", "unknown message type 'Z'"),
        (b"S\x00\x00\x00\x01\x01", "streaming is not enabled"),
        (b"E", "streaming is not enabled"),
        (b"c", "streaming is not enabled"),
        (b"A", "streaming is not enabled"),
        (b"P", "two_phase is not enabled"),
        (b"B\x00\x00", "truncated or malformed 'B'"),
        (b"C" + b"\x00" * 20, "truncated or malformed 'C'"),
        (b"R\x00\x00\x01\x00public", "truncated or malformed 'R'"),
        (relation(1, ["id"]) + b"junk", "unexpected trailing bytes"),
        (insert(16384, outbox_values())[:3], "truncated or malformed 'I'"),
        (insert(99, outbox_values()), "relation id 99, which no Relation message announced"),
        (insert(16384, outbox_values()[:10]), "insert with 10 columns but"),
        (insert(16384, outbox_values()).replace(b"N", b"K", 1), "tuple marker b'K'"),
        (insert(16384, outbox_values(id=None)), "'id' of public.outbox_events is NULL"),
        (insert(16384, outbox_values(payload=None)), "'payload' of public.outbox_events is NULL"),
        (insert(16384, outbox_values(payload=("u", b""))), "unchanged TOAST value"),
        (insert(16384, outbox_values(event_type=("b", b"x"))), "a binary value"),
        (insert(16384, outbox_values(aggregate_id=b"\xff\xfe")), "bad value in public.outbox"),
        (insert(16384, outbox_values(created_at=b"30/11/2026")), "DateStyle=ISO"),
        (insert(16384, outbox_values())[:-30], "insert truncated"),
        (_with_kind(b"x", before=b"OrderCreated"), "unknown tuple column kind"),
    ],
)
def test_malformed_messages_raise_decode_error_naming_the_lsn(
    message: bytes, problem: str
) -> None:
    decoder = primed()
    with pytest.raises(DecodeError) as info:
        decoder.decode(message, AT)
    assert "16/B374D848" in str(info.value)
    assert problem in str(info.value)


def test_every_truncation_of_an_insert_is_an_error_never_an_event() -> None:
    message = insert(16384, outbox_values())
    decoder = primed()
    # The columns after created_at are not parsed, so cut only within the mapped ones.
    last_mapped = message.index(b"2026-11-30") + len(b"2026-11-30 11:11:26.123456+00")
    for cut in range(1, last_mapped):
        with pytest.raises(DecodeError, match="16/B374D848"):
            decoder.decode(message[:cut], AT)


def test_a_mapped_column_missing_from_the_relation_is_reported_at_the_insert() -> None:
    decoder = PgOutputDecoder(OUTBOX, OutboxColumns())
    names = [name for name in OUTBOX_COLUMNS if name != "event_type"]
    assert decoder.decode(relation(5, names), Lsn(0)) is None
    with pytest.raises(DecodeError, match=re.escape("'event_type' missing from public.outbox_events")):
        decoder.decode(insert(5, [b"x"] * len(names)), AT)


def test_errors_in_messages_without_a_position_name_the_last_position() -> None:
    decoder = primed()
    decoder.decode(begin(7), AT)
    with pytest.raises(DecodeError, match=r"LSN 0/0 \(.*the last one was 16/B374D848\)"):
        decoder.decode(b"R\x00\x00", Lsn(0))


def test_the_last_position_named_is_the_last_message_s_on_either_path() -> None:
    decoder = primed()
    decoder.decode(begin(7), AT)
    decoder.decode(insert(16384, outbox_values()), AT + 0x100)  # the compiled path's, if built
    decoder.decode(insert(16384, outbox_values()), 0x16B374DA00)  # a plain int, as the session
    with pytest.raises(DecodeError, match=r"LSN 0/0 \(.*the last one was 16/B374DA00\)"):
        decoder.decode(b"R\x00\x00", 0)


def test_plugin_options_quote_the_publication_as_an_identifier() -> None:
    assert plugin_options("cdc_relay_outbox") == [
        ("proto_version", "1"),
        ("publication_names", '"cdc_relay_outbox"'),
        ("messages", "true"),
    ]
    assert plugin_options('Odd"Name') == [
        ("proto_version", "1"),
        ("publication_names", '"Odd""Name"'),
        ("messages", "true"),
    ]


# ---------------------------------------------------------------- properties

pg_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
    min_size=1,
    max_size=40,
)


@pytest.mark.slow  # a long property run
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # decoder_path: per test
@given(payload=pg_text, aggregate_id=pg_text, event_type=pg_text,
       ms=st.integers(min_value=-(10**12), max_value=10**13))
def test_pgoutput_and_wal2json_agree_on_any_row(
    payload: str, aggregate_id: str, event_type: str, ms: int
) -> None:
    seconds, millis = divmod(ms, 1000)
    created_at = f"{_iso(seconds)}.{millis:03d}+00"
    pgo = primed().decode(
        insert(16384, outbox_values(payload=payload.encode(), aggregate_id=aggregate_id.encode(),
                                    event_type=event_type.encode(),
                                    created_at=created_at.encode())),
        AT,
    )
    w2j_row = {
        "id": "7616f707-0000-4000-8000-000000000001", "aggregate_type": "order",
        "aggregate_id": aggregate_id, "event_type": event_type, "payload": payload,
        "created_at": created_at,
    }
    message = orjson.dumps({
        "action": "I", "schema": "public", "table": "outbox_events",
        "columns": [{"name": k, "value": v} for k, v in w2j_row.items()],
    })
    w2j = Wal2JsonDecoder(OUTBOX, OutboxColumns()).decode(message, AT)
    assert pgo == w2j
    assert isinstance(pgo, OutboxEvent) and pgo.created_at_ms == ms


def _iso(seconds: int) -> str:
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%d %H:%M:%S")

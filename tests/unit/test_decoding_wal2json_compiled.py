"""The compiled wal2json fast path against the pure-Python decoder (docs/design.md,
"The compiled decoders").

Differential properties: for every document, valid or damaged, a decoder on the compiled
path gives the same Change, or the same DecodeError message, as one on the pure path.
Direct tests of ``_cwal2json.Reader.row``: the OutboxEvent it returns for what it takes,
and that it declines (None) everything it must leave to the pure path. Rows with carried
columns: test_decoding_wal2json_compiled_carried.py; created_at in every shape, in
streams that repeat and change it: test_decoding_timestamps.py. These tests fail, not
skip, when the extension is not built: CI has a compiler, so a broken build must show.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from cdc_relay import accel
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.errors import DecodeError
from cdc_relay.model import TRACE_COLUMNS, OutboxColumns, OutboxEvent
from tests.unit.decoding_fixtures import AT, NOT_OUTBOX_EVENTS, OUTBOX, load
from tests.unit.paths import built
from tests.unit.wal2json_documents import (
    MAPPED,
    PLAN,
    SETTINGS,
    assert_same,
    clean_copy,
    columns_of,
    damaged,
    insert_document,
    plan_of,
    reader,
    serialize,
    spelled,
)


def test_the_compiled_wal2json_decoder_is_built() -> None:
    try:
        decoder = built(True, Wal2JsonDecoder, OUTBOX, OutboxColumns())
    except ImportError as exc:
        pytest.fail(f"{exc}: the build of cdc_relay/decoding/_cwal2json.c is broken")
    assert decoder.compiled


# ---------------------------------------------------------------- differential properties


@pytest.mark.slow  # a long property run
@SETTINGS
@given(data=st.data(), created_at=st.sampled_from(["created_at", ""]))
def test_any_document_decodes_alike_on_both_paths(data: st.DataObject, created_at: str) -> None:
    mapped = MAPPED if created_at else MAPPED[:5]
    document = data.draw(insert_document(mapped=mapped))
    # The first row of a shape always takes the pure path: it sets the plans. The next
    # ones, of the same shape, are the compiled path's.
    warm_up = serialize(clean_copy(document)).encode()
    text = data.draw(spelled(document))
    if data.draw(st.integers(0, 3)) == 0:
        text = data.draw(damaged(text))
    names = (*MAPPED[:5], created_at or "id")
    accepted = reader(names, bool(created_at)).row(
        text, AT, plan_of(document, names), (), len(columns_of(document))) is not None
    event(f"compiled path takes it: {accepted}")
    assert_same(OutboxColumns(created_at=created_at), [warm_up, text, warm_up])


@pytest.mark.slow  # a long property run
@SETTINGS
@given(data=st.data())
def test_well_formed_inserts_are_taken_by_the_compiled_path_with_the_pure_result(
    data: st.DataObject,
) -> None:
    document = data.draw(insert_document(odd_values=False, extra_keys=False))
    columns = columns_of(document)
    text = data.draw(spelled(document, escaped_keys=False))
    members = dict(document.members)
    ours = (members["action"], members["schema"], members["table"]) == (
        "I", "public", "outbox_events")
    single = all(len({key for key, _ in col.members}) == len(col.members) for col in columns)
    hit = reader().row(text, AT, plan_of(document), (), len(columns))
    pure = built(False, Wal2JsonDecoder, OUTBOX, OutboxColumns())
    try:
        expected = pure.decode(text, AT)
    except DecodeError:
        expected = None
    if ours and single and isinstance(expected, OutboxEvent):
        assert hit == expected  # every field, created_at_ms and the defaults included
        assert reader().row(text, AT, plan_of(document), (), len(columns) + 1) is None
    elif not ours:
        assert hit is None


@pytest.mark.slow  # a long property run
@SETTINGS
@given(data=st.data())
def test_a_row_of_another_shape_after_a_good_one_decodes_alike(data: st.DataObject) -> None:
    first = data.draw(spelled(data.draw(insert_document(odd_values=False))))
    second = data.draw(spelled(data.draw(insert_document())))
    assert_same(OutboxColumns(), [first, second, first, second])


def test_the_fixture_streams_decode_alike_and_every_insert_is_the_compiled_path_s() -> None:
    for name in ("wal2json_v2.jsonl", "wal2json_v2_all.jsonl"):
        messages = [payload for _, payload in load(name)]
        assert_same(OutboxColumns(), messages)
        assert_same(OutboxColumns.debezium(), messages)
    inserts = [payload for _, payload in load("wal2json_v2.jsonl")
               if orjson.loads(payload)["action"] == "I"]
    plan = (0, 1, 2, 3, 4, 6)
    assert len(inserts) == 113
    pure = built(False, Wal2JsonDecoder, OUTBOX, OutboxColumns())
    fast = reader()
    counts = [len(orjson.loads(payload)["columns"]) for payload in inserts]  # the table alters
    assert [fast.row(payload, AT, plan, (), n) for payload, n in zip(inserts, counts, strict=True)
            ] == [pure.decode(payload, AT) for payload in inserts]


# ---------------------------------------------------------------- Reader.row, directly

COLUMNS = (
    '{"name":"id","value":"7616f707"},{"name":"aggregate_type","value":"order"},'
    '{"name":"aggregate_id","value":"o-1"},{"name":"event_type","value":"Placed"},'
    '{"name":"payload","value":"{\\"n\\": 1}"},'
    '{"name":"created_at","value":"2026-01-10 00:00:00+00"}'
)
GOOD = '{"action":"I","xid":7,"schema":"public","table":"outbox_events","columns":[%s]}'


def good(columns: str = COLUMNS, template: str = GOOD) -> bytes:
    return (template % columns).encode()


def take(payload: bytes | bytearray | memoryview, plan: tuple[int, ...] = PLAN,
         ncols: int = 6, **kwargs: Any) -> Any:
    """What a fresh Reader's ``row`` gives for a row of ``ncols`` columns (6: COLUMNS')."""
    return reader(**kwargs).row(payload, AT, plan, (), ncols)


def test_row_returns_the_finished_event() -> None:
    event_ = take(good())
    assert type(event_) is OutboxEvent
    assert event_ == OutboxEvent("7616f707", "order", "o-1", "Placed", b'{"n": 1}',
                                 1768003200000, AT, 1, (), None, None)
    assert event_.lsn is AT


def test_row_declines_a_row_of_another_column_count_than_the_plans() -> None:
    assert take(good(), ncols=7) is None
    assert take(good(), ncols=-1) is None  # no row has set the plans yet


@pytest.mark.parametrize(
    "payload",
    [
        good(template='{"columns":[%s],"table":"outbox_events","schema":"public","action":"I"}'),
        good(template=' {\n "action" : "I" , "schema":"public","table":"outbox_events",'
                      '"new_key":[1,{"a":null}],"columns":[%s]}\r\n'),
        good(COLUMNS.replace('"o-1"', '"\\u006f-\\ud83d\\ude00\\/\\u00e9"')),
        good(COLUMNS.replace('{"name":"id","value":"7616f707"}',
                             '{"value":"7616f707","type":"uuid","name":"\\u0069d"}')),
        good(template=GOOD.replace('"I"', '"\\u0049"')),
        good(COLUMNS + ',{"name":"extra","value":[1.5e3,true,{"k":"\\ud83d\\ude00"}]}'),
    ],
    ids=["reordered-keys", "whitespace-unknown-key", "escapes", "column-keys-reordered",
         "escaped-action", "nested-skipped"],
)
def test_row_takes_any_spelling_of_the_common_insert(payload: bytes) -> None:
    hit = take(payload, ncols=len(orjson.loads(payload)["columns"]))
    pure = built(False, Wal2JsonDecoder, OUTBOX, OutboxColumns()).decode(payload, AT)
    assert isinstance(pure, OutboxEvent)
    assert hit == pure


@pytest.mark.parametrize("special", ['\\"', "\\\\", "\\u00e9", "é", "\U0001f600", "\x01"],
                         ids=["quote", "backslash", "u-escape", "utf8-2", "utf8-4", "control"])
def test_a_string_is_scanned_alike_whatever_byte_of_a_word_needs_a_look(special: str) -> None:
    # The scan skips a string 8 bytes at a time and jumps to the first byte of a word that
    # needs a look: that byte at every offset, with a word before it and at the end.
    for before in range(18):
        for after in (0, 1, 7, 8, 9):
            value = "a" * before + special + "b" * after
            payload = good(COLUMNS.replace('"o-1"', f'"{value}"'))
            assert_same(OutboxColumns(), [good(), payload])
            if special != "\x01":  # a raw control character is the pure path's to refuse
                hit = take(payload)
                assert hit is not None and hit.aggregate_id == orjson.loads(f'"{value}"'), value


def test_escapes_after_runs_of_every_length_unescape_alike() -> None:
    # The unescape copies a word at a time up to the next backslash: runs of 0-17 plain
    # bytes between escapes, the escape at every offset of a word, and a tail after it.
    for run in range(18):
        for tail in ("", "x", "tail-of-9"):
            value = ("a" * run + '\\"') * 3 + "a" * run + "\\\\" + "\\u00e9" + tail
            payload = good(COLUMNS.replace('"o-1"', f'"{value}"'))
            assert_same(OutboxColumns(), [good(), payload])
            hit = take(payload)
            assert hit is not None and hit.aggregate_id == orjson.loads(f'"{value}"'), value


# A key's or a column name's spellings: plain, escaped, multi-byte, DEL, and a raw
# control character (the pure path's to refuse). PLAIN ones the compiled path takes itself.
SPELLINGS = pytest.mark.parametrize(
    "special", ["", '\\"', "\\u0061", "é", "\x7f", "\x01"],
    ids=["plain", "quote", "u-escape", "utf8", "del", "control"])
PLAIN = ("", "é", "\x7f")


@SPELLINGS
def test_a_skipped_column_and_a_column_name_are_read_alike_whatever_their_spelling(
        special: str) -> None:
    # A column the plan does not read is skipped with its keys taken by the short-key
    # path where it applies; a column's name is read that way too, up to two words.
    for before in range(18):
        for after in (0, 1, 7):
            word = "k" * before + special + "y" * after
            skipped = good(COLUMNS + f',{{"name":"{word}","value":null,"{word}":1}}')
            assert_same(OutboxColumns(), [good(), skipped])
            named = good(COLUMNS.replace('"name":"aggregate_id"', f'"name":"{word}"'))
            mapped = word if special == "\x01" else orjson.loads(f'"{word}"')  # raw: refused
            assert_same(OutboxColumns(aggregate_id=mapped), [named])
            if special in PLAIN:
                assert take(skipped, ncols=7) is not None, word


@SPELLINGS
def test_a_key_is_read_alike_whatever_its_length_and_where_a_byte_needs_a_look(
        special: str) -> None:
    # A short plain key is read without the general string scan when its closing quote is
    # the first byte of the next word that needs a look; every other key takes the scan.
    for before in range(11):
        for after in (0, 1, 7):
            key = "k" * before + special + "y" * after
            top = good(template=GOOD.replace('"xid":7', f'"{key}":1,"xid":7'))
            column = good(COLUMNS.replace('{"name":"id",', f'{{"{key}":0,"name":"id",'))
            assert_same(OutboxColumns(), [good(), top, column])
            if special in PLAIN:  # of any length
                assert take(top) is not None and take(column) is not None, key


def test_a_repeated_aggregate_type_and_event_type_is_the_same_str_again() -> None:
    # As on the pgoutput path: the reader keeps the last two texts; a repeat is the same
    # str, anything else (an escaped spelling included) is decoded and compared anew.
    row = reader().row
    spellings = [("order", "Placed"), ("order", "Placed"), ("orders", "Place"),
                 ("\\u006frder", "Placed"), ("order", "Placed"), ("caf\u00e9", "Placed")]
    events = [row(good(COLUMNS.replace('"order"', f'"{a}"').replace('"Placed"', f'"{e}"')),
                  AT, PLAN, (), 6) for a, e in spellings]
    assert [(e.aggregate_type, e.event_type) for e in events] == [
        ("order", "Placed"), ("order", "Placed"), ("orders", "Place"), ("order", "Placed"),
        ("order", "Placed"), ("caf\u00e9", "Placed")]
    assert events[1].aggregate_type is events[0].aggregate_type
    assert events[1].event_type is events[0].event_type
    assert events[3].aggregate_type is not events[1].aggregate_type, "escaped: decoded anew"


def test_row_takes_integer_ids_as_their_decimal_text_and_reads_any_buffer() -> None:
    payload = good(COLUMNS.replace('"7616f707"', "-1234567").replace('"o-1"', "0"))
    hit = take(payload)
    assert hit is not None and (hit.id, hit.aggregate_type, hit.aggregate_id) == (
        "-1234567", "order", "0")
    assert take(memoryview(b"xx" + payload)[2:]) == hit
    assert take(bytearray(payload)) == hit


def test_row_without_a_created_at_column_neither_reads_nor_checks_the_sixth_value() -> None:
    payload = good(COLUMNS.replace('"2026-01-10 00:00:00+00"', "1.5"))
    assert take(payload, timestamped=False).created_at_ms is None
    assert take(payload) is None
    null = good(COLUMNS.replace('"2026-01-10 00:00:00+00"', "null"))
    assert take(null).created_at_ms is None
    assert take(good(COLUMNS.replace("2026-01-10 00:00:00+00", "infinity"))).created_at_ms is None


DECLINED = {
    "begin": b'{"action":"B","xid":7}',
    "update": good(template=GOOD.replace('"I"', '"U"')),
    "other-table": good(template=GOOD.replace("outbox_events", "orders")),
    "other-schema": good(template=GOOD.replace("public", "audit")),
    "table-not-text": good(template=GOOD.replace('"outbox_events"', "7")),
    "no-action": good(template=GOOD.replace('"action":"I",', "")),
    "no-columns": b'{"action":"I","schema":"public","table":"outbox_events"}',
    "columns-object": good(template=GOOD.replace("[%s]", "{%s}")),
    "float-value": good(COLUMNS.replace('"o-1"', "1.5")),
    "bool-value": good(COLUMNS.replace('"o-1"', "true")),
    "null-value": good(COLUMNS.replace('"o-1"', "null")),
    "nested-value": good(COLUMNS.replace('"o-1"', '["o-1"]')),
    "minus-zero": good(COLUMNS.replace('"o-1"', "-0")),
    "19-digit-int": good(COLUMNS.replace('"o-1"', "1234567890123456789")),
    "created-at-int": good(COLUMNS.replace('"2026-01-10 00:00:00+00"', "1")),
    "created-at-unparseable": good(COLUMNS.replace("2026-01-10 00:00:00+00", "yesterday")),
    # read alike by fromisoformat, so the pure path takes these: not shapes PostgreSQL prints
    "created-at-iso-t": good(COLUMNS.replace("2026-01-10 00:00:00+00", "2026-01-10T00:00:00+00")),
    "created-at-7-digits": good(COLUMNS.replace("00:00:00+00", "00:00:00.1234567+00")),
    "created-at-long-escape": good(COLUMNS.replace("2026-01-10 00:00:00+00",
                                                   "\\u0032" * 10 + "26-01-10 00:00:00+00")),
    "name-elsewhere": good(COLUMNS.replace('"aggregate_id"', '"aggregate_ref"')),
    "no-value": good(COLUMNS.replace(',"value":"o-1"', "")),
    "column-not-object": good(COLUMNS.replace('{"name":"aggregate_id","value":"o-1"}', '"x"')),
    "too-few-columns": good(COLUMNS.rsplit(",{", 1)[0]),
    "duplicate-action": good(template=GOOD.replace('"xid":7', '"action":"I"')),
    "duplicate-table": good(template=GOOD.replace('"xid":7', '"table":"outbox_events"')),
    "duplicate-value": good(COLUMNS.replace('"value":"o-1"', '"value":"o-1","value":"o-2"')),
    "duplicate-name": good(COLUMNS.replace('"value":"o-1"', '"value":"o-1","name":"x"')),
    "escaped-key": good(template=GOOD.replace('"table"', '"t\\u0061ble"')),
    "lone-surrogate": good(COLUMNS.replace('"o-1"', '"\\ud800"')),
    "lone-low-surrogate": good(template=GOOD.replace('"xid":7', '"xid":"\\udc00"')),
    "bad-escape": good(template=GOOD.replace('"xid":7', '"xid":"\\x41"')),
    "raw-control": good(COLUMNS.replace('"o-1"', '"o\x01"')),
    "invalid-utf8-skipped": good().replace(b'"xid":7', b'"xid":"\xff"'),
    "utf8-surrogate": good().replace(b'"o-1"', b'"\xed\xbf\xbf"'),
    "overlong-utf8": good().replace(b'"o-1"', b'"\xc0\xaf"'),
    "infinite-number": good(template=GOOD.replace('"xid":7', '"xid":1e400')),
    "huge-integer": good(template=GOOD.replace('"xid":7', '"xid":1' + "0" * 309)),
    "leading-zero": good(template=GOOD.replace('"xid":7', '"xid":07')),
    "trailing-comma": good(template=GOOD.replace("]}", ",]}")),
    "trailing-garbage": good() + b" x",
    "two-documents": good() + good(),
    "bom": b"\xef\xbb\xbf" + good(),
    "truncated": good()[:-1],
    "too-deep": good(template=GOOD.replace('"xid":7', '"xid":' + "[" * 80 + "]" * 80)),
    "not-an-object": b'["action","I"]',
    "empty": b"",
}


@pytest.mark.parametrize("payload", list(DECLINED.values()), ids=list(DECLINED))
def test_row_declines_what_it_must_leave_to_the_pure_path(payload: bytes) -> None:
    assert take(payload) is None
    assert_same(OutboxColumns(), [good(), payload])


def test_row_declines_a_plan_past_the_row() -> None:
    assert take(good(), (0, 1, 2, 3, 4, 6)) is None
    assert take(good(), (0, 1, 2, 3, 4, -1)) is None


@pytest.mark.parametrize("event_class", list(NOT_OUTBOX_EVENTS.values()), ids=list(NOT_OUTBOX_EVENTS))
def test_the_reader_refuses_a_class_that_is_not_the_outbox_event(event_class: Any) -> None:
    from cdc_relay.decoding._cwal2json import Reader

    with pytest.raises(TypeError):
        Reader("public", "outbox_events", MAPPED, True, (), TRACE_COLUMNS, event_class)


def test_the_process_s_choice_forces_the_pure_path() -> None:
    assert not built(False, Wal2JsonDecoder, OUTBOX, OutboxColumns()).compiled
    with accel.forced({"_cwal2json"}):
        assert not Wal2JsonDecoder(OUTBOX, OutboxColumns()).compiled
    with accel.forced(False):
        assert Wal2JsonDecoder(OUTBOX, OutboxColumns()).compiled  # the default takes it


def test_without_the_extension_the_decoder_is_pure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cdc_relay.decoding._cwal2json", None)  # not built
    assert not Wal2JsonDecoder(OUTBOX, OutboxColumns()).compiled



@pytest.mark.parametrize("position", [1.0, "1", None, 2.5])
def test_a_position_that_is_not_an_int_is_refused_alike_on_both_paths(position: Any) -> None:
    payload = b'{"action":"B","xid":1}'
    refusals = []
    for compiled in (True, False):
        decoder = built(compiled, Wal2JsonDecoder, OUTBOX, OutboxColumns())
        with pytest.raises(TypeError) as refused:
            decoder.decode(payload, position)
        refusals.append(str(refused.value))
    assert refusals[0] == refusals[1] == (
        f"decode: the position must be an int, not {type(position).__name__}")


def test_an_int_or_an_lsn_or_a_bool_position_is_taken_alike_on_both_paths() -> None:
    from cdc_relay.model import Begin, Lsn

    for position in (7, Lsn(7), True):
        changes = [built(compiled, Wal2JsonDecoder, OUTBOX, OutboxColumns()).decode(
            b'{"action":"B","xid":1}', position) for compiled in (True, False)]
        assert changes[0] == changes[1] and isinstance(changes[0], Begin)

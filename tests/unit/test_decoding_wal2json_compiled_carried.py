"""The compiled wal2json fast path on rows with carried columns (``--header`` /
``--partition-column`` extras, the trace context) against the pure-Python decoder
(docs/design.md, "The compiled decoders"; decoding/carried.py).

Differential properties as in test_decoding_wal2json_compiled.py, with carried columns
present, missing, null, integers or of other JSON types, repeated names and shapes that
change mid-stream; a test that such rows really take the compiled path once the first
of their shape has set the plans; direct tests of what ``Reader.row`` reads and declines
at carried positions. They fail, not skip, when the extension is not built.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.model import TRACE_COLUMNS, Lsn, OutboxColumns, OutboxEvent
from tests.unit.decoding_fixtures import AT, OUTBOX, load
from tests.unit.paths import built
from tests.unit.wal2json_documents import (
    EXTRAS,
    MAPPED,
    PLAN,
    SETTINGS,
    assert_same,
    clean_copy,
    damaged,
    insert_document,
    reader,
    serialize,
    spelled,
)

# Extras as a decoder is given them: none (trace columns only), one, two, one that is
# also a mapped column (two slots read one column).
EXTRA_CHOICES = st.sampled_from([(), EXTRAS[:1], EXTRAS, ("aggregate_id",)])
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


# ---------------------------------------------------------------- differential properties


def carried_row(names: list[str], values: dict[str, Any] | None = None) -> bytes:
    """An outbox insert whose columns are the mapped ones, then ``names`` in that order."""
    base = {"id": "e1", "aggregate_type": "order", "aggregate_id": "o1",
            "event_type": "created", "payload": "{}", "created_at": None}
    values = {**{name: f"{name}-value" for name in names}, **(values or {})}
    columns = [{"name": n, "type": "text", "value": v} for n, v in base.items()]
    columns += [{"name": n, "type": "text", "value": values[n]} for n in names]
    return orjson.dumps({"action": "I", "schema": OUTBOX.schema, "table": OUTBOX.name,
                         "columns": columns})


def test_a_row_replanned_then_rejected_leaves_both_paths_with_the_same_plans() -> None:
    """The pure path replans the carried columns of a row, then rejects its traceparent;
    the next row, of the same column count, must read tracestate alike on both paths."""
    assert_same(OutboxColumns(), [
        carried_row(["traceparent", "other"], {"traceparent": TRACEPARENT}),
        carried_row(["tracestate", "traceparent"], {"traceparent": {"not": "text"}}),
        carried_row(["traceparent", "tracestate"], {"traceparent": TRACEPARENT}),
    ])


@settings(SETTINGS, max_examples=60)
@given(data=st.data(), extras=EXTRA_CHOICES)
def test_a_stream_that_goes_on_after_rejected_rows_decodes_alike(
    data: st.DataObject, extras: tuple[str, ...],
) -> None:
    carried = (*extras, *TRACE_COLUMNS)
    documents = data.draw(st.lists(insert_document(carried=carried, extra_keys=False),
                                   min_size=2, max_size=2))
    pool = [serialize(clean_copy(document)).encode() for document in documents]
    pool += [data.draw(damaged(serialize(clean_copy(document)).encode()))
             for document in documents]
    pool += [serialize(document).encode() for document in documents]  # odd values: rejected
    messages = data.draw(st.lists(st.sampled_from(pool), min_size=3, max_size=12))
    assert_same(OutboxColumns(), messages, extras)


@pytest.mark.slow  # a long property run
@SETTINGS
@given(data=st.data(), extras=EXTRA_CHOICES, created_at=st.sampled_from(["created_at", ""]))
def test_any_document_with_carried_columns_decodes_alike_on_both_paths(
    data: st.DataObject, extras: tuple[str, ...], created_at: str,
) -> None:
    mapped = MAPPED if created_at else MAPPED[:5]
    document = data.draw(insert_document(mapped=mapped, carried=(*extras, *TRACE_COLUMNS)))
    warm_up = serialize(clean_copy(document)).encode()  # sets both plans to this shape
    text = data.draw(spelled(document))
    if data.draw(st.integers(0, 4)) == 0:
        text = data.draw(damaged(text))
    fast = built(True, CountingDecoder, OUTBOX, OutboxColumns(created_at=created_at),
                           extra_columns=extras)
    try:
        fast.decode(warm_up, AT)
        taken = counted(fast, text)[1] == 0
    except Exception:  # only labels the example; assert_same compares the outcomes
        taken = False
    event(f"compiled path takes it: {taken}")
    assert_same(OutboxColumns(created_at=created_at), [warm_up, text, warm_up], extras)


@pytest.mark.slow  # a long property run
@SETTINGS
@given(data=st.data(), extras=EXTRA_CHOICES)
def test_a_stream_whose_row_shape_changes_decodes_alike(
    data: st.DataObject, extras: tuple[str, ...],
) -> None:
    carried = (*extras, *TRACE_COLUMNS)
    documents = data.draw(st.lists(insert_document(carried=carried, extra_keys=False),
                                   min_size=2, max_size=3))
    pool = [serialize(clean_copy(document)).encode() for document in documents]
    pool += [data.draw(spelled(document)) for document in documents]
    messages = data.draw(st.lists(st.sampled_from(pool), min_size=2, max_size=10))
    assert_same(OutboxColumns(), messages, extras)


def trace_rows(extra: bool = False) -> list[bytes]:
    """The fixture's inserts with trace columns (tracestate null) and, if ``extra``, a
    tenant column (an integer every third row)."""
    rows = []
    for number, (_, payload) in enumerate(load("wal2json_v2.jsonl")):
        msg = orjson.loads(payload)
        if msg["action"] != "I":
            continue
        msg["columns"][3:3] = [{"name": "traceparent", "type": "text", "value": TRACEPARENT},
                               {"name": "tracestate", "type": "text", "value": None}]
        if extra:
            msg["columns"].append({"name": "tenant", "type": "text",
                                   "value": number if number % 3 == 0 else f"t-{number}"})
        rows.append(orjson.dumps(msg))
    return rows


def test_fixture_rows_with_carried_columns_decode_alike() -> None:
    messages = [payload for _, payload in load("wal2json_v2_all.jsonl")]
    assert_same(OutboxColumns(), messages, EXTRAS[:1])
    assert_same(OutboxColumns(), trace_rows())
    assert_same(OutboxColumns(), trace_rows(extra=True), EXTRAS[:1])
    assert_same(OutboxColumns(), trace_rows(extra=True), EXTRAS)  # region is missing


# ---------------------------------------------------------------- the compiled path is taken


class CountingDecoder(Wal2JsonDecoder):
    """Counts the rows the pure path decodes (``_insert``)."""

    __slots__ = ("pure_inserts",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pure_inserts = 0

    def _insert(self, columns: Any, wal_start: Lsn) -> OutboxEvent:
        self.pure_inserts += 1
        return super()._insert(columns, wal_start)


def counted(decoder: Wal2JsonDecoder, payload: bytes) -> tuple[Any, int]:
    """(the decoded Change, how many rows the pure path decoded for it)."""
    before = getattr(decoder, "pure_inserts", 0)
    change = decoder.decode(payload, AT)
    return change, getattr(decoder, "pure_inserts", 0) - before


def test_carried_rows_after_the_first_of_their_shape_take_the_compiled_path() -> None:
    decoder = built(True, CountingDecoder, OUTBOX, OutboxColumns(), extra_columns=("tenant",))
    pure = built(False, Wal2JsonDecoder, OUTBOX, OutboxColumns(), extra_columns=("tenant",))
    rows = trace_rows(extra=True)
    names = [[column["name"] for column in orjson.loads(row)["columns"]] for row in rows]
    shape_changes = [i for i in range(len(rows)) if i == 0 or names[i] != names[i - 1]]
    assert len(shape_changes) == 2  # the fixture alters the table once
    taken_by_pure = [i for i, row in enumerate(rows) if counted(decoder, row)[1]]
    assert taken_by_pure == shape_changes  # the first row of a shape; the others: compiled
    events = [decoder.decode(row, AT) for row in rows]
    assert events == [pure.decode(row, AT) for row in rows]
    texts = {event_.extra[0] for event_ in events if isinstance(event_, OutboxEvent)}
    assert len(texts) == len(rows) and any(text.isdigit() for text in texts)  # ints as text
    assert {(e.traceparent, e.tracestate) for e in events if isinstance(e, OutboxEvent)} == {
        (TRACEPARENT, None)}
    # a new shape (the trace columns gone) is the pure path's once, then compiled again
    plain = [payload for _, payload in load("wal2json_v2.jsonl")
             if orjson.loads(payload)["action"] == "I"]
    tenant = [orjson.dumps({**msg, "columns": [*msg["columns"], {"name": "tenant",
                                                                  "value": "t"}]})
              for msg in map(orjson.loads, plain[:3])]
    assert [counted(decoder, row)[1] for row in tenant] == [1, 0, 0]
    change = decoder.decode(tenant[2], AT)
    assert isinstance(change, OutboxEvent) and change.traceparent is None
    assert change.extra == ("t",)


def test_a_carried_name_moved_within_the_same_column_count_is_replanned() -> None:
    decoder = built(True, CountingDecoder, OUTBOX, OutboxColumns())
    row = trace_rows()[0]
    swapped = row.replace(b'"traceparent"', b'"x"').replace(b'"tracestate"', b'"traceparent"')
    assert [counted(decoder, payload)[1] for payload in (row, row, swapped, swapped)] == [
        1, 0, 1, 0]
    change = decoder.decode(swapped, AT)
    assert isinstance(change, OutboxEvent) and change.traceparent is None  # now the null one


@pytest.mark.parametrize(("extras", "before", "after"), [
    ((), ["note"], ["traceparent"]),  # nothing carried before: no plan at all
    ((), ["tracestate", "note"], ["tracestate", "traceparent"]),  # a plan without it
    (("tenant",), ["tenant", "note"], ["tenant", "traceparent"]),
    ((), ["note", "memo"], ["tracestate", "traceparent"]),  # both, one rename each
])
@pytest.mark.parametrize("compiled", [True, False])
def test_a_trace_column_that_appears_by_a_rename_in_the_same_column_count_is_read(
        compiled: bool, extras: tuple[str, ...], before: list[str], after: list[str]) -> None:
    decoder = built(compiled, Wal2JsonDecoder, OUTBOX, OutboxColumns(), extra_columns=extras)
    old = carried_row(before, {"tracestate": "k=v"})
    renamed = carried_row(after, {"traceparent": TRACEPARENT, "tracestate": "k=v"})
    for payload in (old, old):  # the second of a shape is the compiled path's
        change = decoder.decode(payload, AT)
        assert isinstance(change, OutboxEvent) and change.traceparent is None
    for payload in (renamed, renamed):
        change = decoder.decode(payload, AT)
        assert isinstance(change, OutboxEvent)
        state = "k=v" if "tracestate" in after else None
        assert (change.traceparent, change.tracestate) == (TRACEPARENT, state), payload
    assert_same(OutboxColumns(), [old, old, renamed, renamed, old, renamed], extras)


# ---------------------------------------------------------------- Reader.row, directly

COLUMNS = (
    '{"name":"id","value":"7616f707"},{"name":"aggregate_type","value":"order"},'
    '{"name":"aggregate_id","value":"o-1"},{"name":"event_type","value":"Placed"},'
    '{"name":"payload","value":"{}"},{"name":"created_at","value":null},'
    '{"name":"tenant","value":"t-1"},{"name":"traceparent","value":"00-ab"},'
    '{"name":"tracestate","value":null}'
)
GOOD = '{"action":"I","schema":"public","table":"outbox_events","columns":[%s]}'
CARRIED = (6, 7, 8)  # tenant, traceparent, tracestate


def good(columns: str = COLUMNS) -> bytes:
    return (GOOD % columns).encode()


def row(payload: bytes, carried: tuple[int, ...] = CARRIED,
        extras: tuple[str, ...] = ("tenant",)) -> Any:
    """The event a Reader with ``extras`` makes of a row of COLUMNS' 9 columns, or None."""
    return reader(extras=extras).row(payload, AT, PLAN, carried, 9)


def carried_of(event_: Any) -> tuple[Any, ...]:
    return (event_.extra, event_.traceparent, event_.tracestate)


def test_row_reads_the_carried_texts_at_their_positions() -> None:
    assert carried_of(row(good())) == (("t-1",), "00-ab", None)
    assert row(good()) == OutboxEvent("7616f707", "order", "o-1", "Placed", b"{}", None, AT,
                                      extra=("t-1",), traceparent="00-ab")
    assert row(good(COLUMNS.replace('"t-1"', "-42"))).extra == ("-42",)
    escaped = good(COLUMNS.replace('"00-ab"', '"\\u0030\\/\\ud83d\\ude00"'))
    assert row(escaped).traceparent == "0/\U0001f600"
    # absent trace columns (-1) are None, as is everything for an empty carried plan
    untraced = good(COLUMNS.replace('"traceparent"', '"note"').replace('"tracestate"', '"memo"'))
    assert carried_of(row(untraced, (6, -1, -1))) == (("t-1",), None, None)
    assert carried_of(reader().row(untraced, AT, PLAN, (), 9)) == ((), None, None)
    # two slots on one column: an extra naming a mapped column
    no_state = good(COLUMNS.replace('"tracestate"', '"memo"'))
    assert carried_of(row(no_state, (2, 7, -1), ("aggregate_id",))) == (("o-1",), "00-ab", None)


def test_row_declines_a_row_where_a_carried_column_the_plan_lacks_appears() -> None:
    """A rename that keeps the column count: the pure path replans (decoding/carried.py)."""
    assert row(good(), (6, -1, -1)) is None
    assert reader().row(good(), AT, PLAN, (), 9) is None
    assert row(good(), (2, 7, -1), ("aggregate_id",)) is None
    spelled_out = good(COLUMNS.replace('"tracestate"', '"trace\\u0073tate"'))
    assert row(spelled_out, (6, 7, -1)) is None
    escaped_key = good(COLUMNS.replace('{"name":"tracestate"', '{"n\\u0061me":"tracestate"'))
    assert row(escaped_key, (6, 7, -1)) is None
    assert row(good(COLUMNS.replace('"tracestate"', '"tracestates"')), (6, 7, -1)) is not None


DECLINED = {
    "float": good(COLUMNS.replace('"t-1"', "1.5")),
    "bool": good(COLUMNS.replace('"00-ab"', "true")),
    "object": good(COLUMNS.replace('"00-ab"', '{"a":1}')),
    "19-digit-int": good(COLUMNS.replace('"t-1"', "1234567890123456789")),
    "minus-zero": good(COLUMNS.replace('"t-1"', "-0")),
    "other-name": good(COLUMNS.replace('"tenant"', '"tenant2"')),
    "escaped-other-name": good(COLUMNS.replace('"tenant"', '"tenan\\u0074s"')),
    "no-value": good(COLUMNS.replace(',"value":"t-1"', "")),
    "duplicate-value": good(COLUMNS.replace('"value":"t-1"', '"value":"t-1","value":"t-2"')),
    "duplicate-name": good(COLUMNS.replace('"value":"t-1"', '"value":"t-1","name":"tenant"')),
    "column-not-object": good(COLUMNS.replace('{"name":"tenant","value":"t-1"}', "null")),
    "past-the-row": good(COLUMNS.rsplit(",{", 1)[0]),
}


@pytest.mark.parametrize("payload", list(DECLINED.values()), ids=list(DECLINED))
def test_row_declines_carried_values_it_must_leave_to_the_pure_path(payload: bytes) -> None:
    assert row(payload) is None
    assert row(good()) is not None
    assert_same(OutboxColumns(), [good(), good(), payload, good()], ("tenant",))


def test_row_declines_when_a_carried_name_is_not_at_its_position() -> None:
    assert row(good(), (6, 8, 7)) is None  # traceparent is not at 8
    assert row(good(), (7, -1, -1)) is None  # nor tenant at 7


def test_row_refuses_a_carried_plan_of_the_wrong_length() -> None:
    with pytest.raises(TypeError, match="carried"):
        row(good(), (6, 7))
    with pytest.raises(TypeError, match="carried"):
        reader().row(good(), AT, PLAN, [7, 8], 9)

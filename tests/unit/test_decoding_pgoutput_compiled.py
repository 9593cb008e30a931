"""The compiled pgoutput fast path (_cpgoutput) against the pure decoder it must equal.

The differential properties feed both decoders the same Relation and Insert messages -
valid ones and mutated ones - and require the same Change or the same DecodeError text:
the fast path may only decline, never accept what the pure path rejects or decode
differently (docs/design.md, "The compiled decoders"). The direct tests pin down the
OutboxEvent ``Reader.insert`` itself returns and what it declines. created_at in every
shape, in streams that repeat and change it: test_decoding_timestamps.py. The extension
must be built: CI has a compiler.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_relay import accel
from cdc_relay.decoding.pgoutput import PgOutputDecoder
from cdc_relay.errors import DecodeError
from cdc_relay.model import TRACE_COLUMNS, Change, Lsn, OutboxColumns, OutboxEvent
from tests.unit.decoding_fixtures import AT, NOT_OUTBOX_EVENTS, OUTBOX
from tests.unit.paths import built
from tests.unit.test_decoding_pgoutput import (
    OUTBOX_COLUMNS,
    begin,
    insert,
    outbox_values,
    relation,
)

try:
    from cdc_relay.decoding import _cpgoutput
except ImportError:  # the test below says so; the others fail on the fixture
    _cpgoutput = None  # type: ignore[assignment]

MAPPED = ("id", "aggregate_type", "aggregate_id", "event_type", "payload", "created_at")
RELID = 16384
DEFAULT = OutboxColumns()
Column = tuple[str, bytes, int]  # kind ('t', 'n', 'u', 'b', other), data, length lie


def test_the_compiled_decoder_is_built() -> None:
    assert _cpgoutput is not None, (
        "cdc_relay.decoding._cpgoutput is not built: run `make bootstrap` (it reinstalls, "
        "building the extensions) "
        "(CI builds it; a missing compiler must not silently drop the fast path's tests)"
    )
    assert built(True, PgOutputDecoder, OUTBOX, OutboxColumns()).compiled


def test_without_the_extension_or_when_turned_off_the_decoder_is_pure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not built(False, PgOutputDecoder, OUTBOX, OutboxColumns()).compiled
    with accel.forced({"_cpgoutput"}):
        assert not PgOutputDecoder(OUTBOX, OutboxColumns()).compiled
    monkeypatch.setitem(sys.modules, "cdc_relay.decoding._cpgoutput", None)  # import fails
    assert not PgOutputDecoder(OUTBOX, OutboxColumns()).compiled


# ---------------------------------------------------------------- the two decoders, compared


def outcome(decoder: PgOutputDecoder, message: bytes | memoryview) -> Change | str | None:
    """What decoding gives: the Change (or None) or the DecodeError's text."""
    try:
        return decoder.decode(message, AT)
    except DecodeError as exc:
        return f"DecodeError: {exc}"


def in_a_larger_buffer(message: bytes) -> memoryview:
    """A view as wal/stream/replication.py passes (``data[25:]``), with bytes after it that would read as
    a NULL column and an empty text column if the fast path read past the message."""
    return memoryview(b"\x00" * 25 + message + b"nt\x00\x00\x00\x00")[25 : 25 + len(message)]


def same_outcomes(messages: list[bytes], columns: OutboxColumns = DEFAULT,
                  extra: tuple[str, ...] = ()) -> list[Change | str | None]:
    pure = built(False, PgOutputDecoder, OUTBOX, columns, extra)
    compiled = built(True, PgOutputDecoder, OUTBOX, columns, extra)
    expected = [outcome(pure, message) for message in messages]
    assert [outcome(compiled, in_a_larger_buffer(message)) for message in messages] == expected
    return expected


def encode_insert(columns: list[Column], count: int | None = None, relid: int = RELID) -> bytes:
    out = b"I" + struct.pack("!I", relid) + b"N" + struct.pack("!H", len(columns) if count is None
                                                             else count)
    for kind, data, lie in columns:
        out += kind.encode("latin-1")
        if kind in ("t", "b"):
            out += struct.pack("!I", max(0, len(data) + lie)) + data
    return out


TIMESTAMPS = [b"2026-11-30 11:11:26.123456+00", b"1970-01-01 00:00:01+05:30", b"infinity"]
BAD_TEXT = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"o-1\x80"]
# (a truncated sequence, a surrogate, an overlong '/', past U+10FFFF, a stray continuation)
BAD_TIMESTAMPS = [b"30/11/2026", b"2026-11-30 25:00:00+00", b"infinity\xff", b""]


@st.composite
def a_value(draw: st.DrawFn, name: str) -> Column:
    """A well-formed text value (NULL now and then) for the named column."""
    if draw(st.integers(0, 9)) == 0:
        return ("n", b"", 0)
    if name == "created_at":
        return ("t", draw(st.sampled_from(TIMESTAMPS)), 0)
    return ("t", draw(st.text(max_size=8)).encode(), 0)


def column_mutation(columns: list[Column], draw: st.DrawFn, mutation: str) -> None:
    """Make one column odd: NULL, another kind, bad UTF-8, a bad timestamp, a wrong length."""
    at = draw(st.integers(0, len(columns) - 1))
    kind, data, _ = columns[at]
    if mutation == "null":
        columns[at] = ("n", b"", 0)
    elif mutation == "kind":
        odd = draw(st.sampled_from(["u", "b", "x", "\x00", "T"]))
        columns[at] = (odd, draw(st.binary(max_size=3)) if odd == "b" else b"", 0)
    elif mutation == "utf8":
        columns[at] = ("t", draw(st.sampled_from(BAD_TEXT) | st.binary(min_size=1, max_size=6)), 0)
    elif mutation == "timestamp":
        columns[at] = ("t", draw(st.sampled_from(BAD_TIMESTAMPS)), 0)
    elif mutation == "length" and kind == "t":
        columns[at] = (kind, data, draw(st.sampled_from([-2, -1, 1, 2, 1 << 20])))


@st.composite
def a_table(draw: st.DrawFn) -> tuple[list[str], OutboxColumns, tuple[str, ...]]:
    """Relation column names, the mapping and the carried columns of one scenario."""
    mapping = dict(zip(MAPPED, MAPPED, strict=True))
    if draw(st.booleans()):  # a column feeding two fields
        field = draw(st.sampled_from(MAPPED[1:]))
        mapping[field] = draw(st.sampled_from([n for n in MAPPED if n != field]))
    if draw(st.booleans()):
        mapping["created_at"] = ""
    extra = tuple(draw(st.lists(st.sampled_from(["tenant", "region", "event_type", "id"]),
                                unique=True, max_size=2)))
    names = {*mapping.values(), *extra} - {""}
    names |= set(draw(st.lists(st.sampled_from([*TRACE_COLUMNS, "attempts", "note"]),
                               unique=True, max_size=3)))
    if draw(st.integers(0, 19)) == 0:  # a mapped column missing: reported at the Insert
        names.discard(draw(st.sampled_from(sorted(names))))
    return draw(st.permutations(sorted(names))), OutboxColumns(**mapping), extra


MUTATIONS = ["none", "none", "none", "null", "kind", "kind", "utf8", "timestamp", "length", "truncate",
             "trailing", "byte", "count", "marker", "relid"]


@st.composite
def a_mutated_insert(draw: st.DrawFn, names: list[str]) -> bytes:
    """A valid Insert for the relation's columns, then (mostly) one mutation."""
    columns = [draw(a_value(name)) for name in names]
    mutation = draw(st.sampled_from(MUTATIONS))
    if columns:
        column_mutation(columns, draw, mutation)
    count = len(columns) + draw(st.sampled_from([-1, 1])) if mutation == "count" else None
    message = encode_insert(columns, count, relid=RELID + 1 if mutation == "relid" else RELID)
    if mutation == "truncate":
        message = message[: draw(st.integers(0, len(message)))]
    elif mutation == "trailing":
        message += draw(st.binary(min_size=1, max_size=4))
    elif mutation == "byte":
        at = draw(st.integers(0, len(message) - 1))
        message = message[:at] + bytes([draw(st.integers(0, 255))]) + message[at + 1 :]
    elif mutation == "marker":
        message = message[:5] + draw(st.sampled_from([b"K", b"O", b"n"])) + message[6:]
    return message


@pytest.mark.slow  # a long property run
@settings(max_examples=1000, deadline=None)
@given(data=st.data())
def test_compiled_and_pure_agree_on_any_relation_and_inserts(data: st.DataObject) -> None:
    names, columns, extra = data.draw(a_table())
    inserts = data.draw(st.lists(a_mutated_insert(names), min_size=1, max_size=3))
    same_outcomes([relation(RELID, names), *inserts], columns, extra)


@pytest.mark.slow  # a long property run
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_compiled_and_pure_agree_when_the_relation_changes_under_them(data: st.DataObject) -> None:
    first, columns, extra = data.draw(a_table())
    second = data.draw(st.sampled_from([first[:-1], [*first, "added"], first[::-1]]))
    name = data.draw(st.sampled_from(["outbox_events", "orders"]))  # orders: not the outbox
    messages = [relation(RELID, first), data.draw(a_mutated_insert(first)),
                relation(RELID, second, name=name), data.draw(a_mutated_insert(second)),
                data.draw(a_mutated_insert(first))]
    same_outcomes(messages, columns, extra)


CREATED_AT = b"2026-11-30 11:11:26.123456+00"


@pytest.mark.parametrize(
    ("extra", "trace"),
    [((), ()), (("tenant",), (b"00-ab-cd-01", None)), ((), (b"00-ab-cd-01", b"k=v"))],
)
def test_every_truncation_and_every_byte_flip_of_an_insert_decodes_alike(
    extra: tuple[str, ...], trace: tuple[bytes | None, ...],
) -> None:
    names = [*OUTBOX_COLUMNS, *extra, *TRACE_COLUMNS[: len(trace)]]
    message = insert(RELID, [*outbox_values(), *[b"x"] * len(extra), *trace])
    variants = [message[:cut] for cut in range(len(message) + 1)]
    for at in range(len(message)):
        for value in {0x00, 0xFF, message[at] ^ 0x01, message[at] + 1 & 0xFF}:
            variants.append(message[:at] + bytes([value]) + message[at + 1 :])
    outcomes = same_outcomes([relation(RELID, names), *variants], extra=extra)
    traceparent, tracestate = [None if t is None else t.decode() for t in trace] + [None] * (
        2 - len(trace))
    uncut = OutboxEvent("7616f707-0000-4000-8000-000000000001", "order", "o-1", "OrderCreated",
                        b'{"amount": 12.5, "orderId": "o-1"}', 1796037086123, AT,
                        extra=("x",) * len(extra), traceparent=traceparent, tracestate=tracestate)
    # Columns are read up to the last one used: cut before its end is an error, after is not.
    read = len(message) if trace else message.index(CREATED_AT) + len(CREATED_AT)
    assert all(isinstance(o, str) for o in outcomes[1 : 1 + read])
    assert outcomes[1 + read : 2 + len(message)] == [uncut] * (len(message) + 1 - read)


def test_the_fast_path_decodes_common_inserts_without_the_pure_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = [*OUTBOX_COLUMNS, *TRACE_COLUMNS]
    expected = same_outcomes([relation(RELID, names),
                              insert(RELID, [*outbox_values(), b"00-ab-cd-01", None])],
                             extra=("event_type",))
    decoder = built(True, PgOutputDecoder, OUTBOX, OutboxColumns(), ("event_type",))
    decoder.decode(relation(RELID, names), Lsn(0))

    def pure_insert(*_: Any) -> None:
        raise AssertionError("the pure path ran")

    monkeypatch.setattr(PgOutputDecoder, "_insert", pure_insert)
    event = decoder.decode(insert(RELID, [*outbox_values(), b"00-ab-cd-01", None]), AT)
    assert event == expected[1]
    assert isinstance(event, OutboxEvent) and event.extra == ("OrderCreated",)


# ---------------------------------------------------------------- Reader.insert itself

PLAN = ((0, 1, 2, 3, 4, -1, 5), 11, 6, ())  # OUTBOX_COLUMNS: created_at is the 7th column
PLANS: dict[int, Any] = {RELID: PLAN}
VALID = insert(RELID, outbox_values())


def c_insert(message: bytes | memoryview, plans: dict[int, Any] | None = None) -> Any:
    """What a fresh Reader's ``insert`` gives for ``message`` (lsn AT)."""
    assert _cpgoutput is not None
    return _cpgoutput.Reader(PLANS if plans is None else plans, OutboxEvent).insert(message, AT)


def test_c_insert_returns_the_finished_event() -> None:
    event = c_insert(VALID)
    assert type(event) is OutboxEvent
    assert event == OutboxEvent("7616f707-0000-4000-8000-000000000001", "order", "o-1",
                                "OrderCreated", b'{"amount": 12.5, "orderId": "o-1"}',
                                1796037086123, AT, 1, (), None, None)
    assert event.lsn is AT
    assert c_insert(memoryview(b"xx" + VALID + b"trailing")[2:]) == event


def test_a_repeated_aggregate_type_and_event_type_is_the_same_str_again() -> None:
    # The reader keeps the last aggregate_type and event_type: a row that repeats them gets
    # those very str objects (no allocation, the router's hash cached); any other text,
    # shorter, longer, non-ASCII, is decoded anew and kept in turn.
    assert _cpgoutput is not None
    reader = _cpgoutput.Reader(PLANS, OutboxEvent)
    rows = [(b"order", b"OrderCreated"), (b"order", b"OrderCreated"), (b"ord", b"OrderCreatedX"),
            (b"order", b"OrderCreated"), ("caf\u00e9".encode(), "\u00e9v".encode()),
            ("caf\u00e9".encode(), "\u00e9v".encode()), (b"order", b"Order\x00")]
    events = [reader.insert(insert(RELID, outbox_values(aggregate_type=a, event_type=e)), AT)
              for a, e in rows]
    assert [(e.aggregate_type, e.event_type) for e in events] == [
        (a.decode(), e.decode()) for a, e in rows]
    assert events[1].aggregate_type is events[0].aggregate_type
    assert events[1].event_type is events[0].event_type
    assert events[3].aggregate_type is not events[0].aggregate_type, "'ord' came between"
    assert events[4].aggregate_type is not events[3].aggregate_type


def test_the_reader_reads_the_plans_the_decoder_keeps_adding() -> None:
    assert _cpgoutput is not None
    plans: dict[int, Any] = {}
    reader = _cpgoutput.Reader(plans, OutboxEvent)
    assert reader.insert(VALID, AT) is None  # no plan (yet): the pure path's
    plans[RELID] = PLAN
    assert reader.insert(VALID, AT) == c_insert(VALID)
    plans.clear()
    assert reader.insert(VALID, AT) is None


def test_a_replaced_plan_or_another_relation_is_read_anew() -> None:
    """The Reader reads a plan into C once and keeps it while the decoder's dict holds the
    same tuple: a new tuple for the relation (a new Relation message), another relation
    in between, or a plan that failed must each be read afresh."""
    assert _cpgoutput is not None
    carried = ((0, 1, 2, 3, 4, -1, 5, -1, -1, -1, -1, 6), 12, 8, ((7, 3),))
    plans: dict[int, Any] = {RELID: PLAN, RELID + 1: carried}
    reader = _cpgoutput.Reader(plans, OutboxEvent)
    plain, wide = VALID, insert(RELID, [*outbox_values(), b"tp"])
    assert reader.insert(plain, AT) == c_insert(plain)
    plans[RELID] = carried  # the same relation, a new plan: 12 columns now
    assert reader.insert(plain, AT) is None  # 11 columns: not this plan's
    assert reader.insert(wide, AT).tracestate == "OrderCreated"
    other = insert(RELID + 1, [*outbox_values(), b"tp"])
    assert reader.insert(other, AT).traceparent == "tp"
    plans[RELID] = (PLAN[0], 11, 6, ((6, -1),))  # malformed: raises, and keeps nothing
    with pytest.raises(ValueError):
        reader.insert(plain, AT)
    with pytest.raises(ValueError):
        reader.insert(plain, AT)
    plans[RELID] = PLAN
    assert reader.insert(plain, AT) == c_insert(plain)
    assert reader.insert(other, AT) == c_insert(other, plans)


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (b"", "empty"),
        (b"B" + VALID[1:], "not an Insert"),
        (VALID[:7], "shorter than the header"),
        (insert(RELID + 1, outbox_values()), "no plan for the relation"),
        (VALID[:5] + b"K" + VALID[6:], "not the 'N' marker"),
        (insert(RELID, outbox_values()[:10]), "column count differs from the plan's"),
        (insert(RELID, outbox_values(id=None)), "NULL in a required field"),
        (insert(RELID, outbox_values(payload=("u", b""))), "a mapped unchanged TOAST value"),
        (insert(RELID, outbox_values(event_type=("b", b"x"))), "a mapped binary value"),
        (insert(RELID, outbox_values(created_at=("u", b""))), "unchanged TOAST in created_at"),
        (insert(RELID, outbox_values(created_at=("b", b"x"))), "a binary created_at"),
        (insert(RELID, outbox_values(aggregate_id=b"\xff")), "invalid UTF-8 in a text field"),
        (insert(RELID, outbox_values(created_at=b"\xed\xa0\x80")), "a UTF-8 surrogate"),
        (VALID.replace(b"t\x00\x00\x00\x0cOrderCreated", b"x\x00\x00\x00\x0cOrderCreated"),
         "an unknown kind"),
        (VALID[: VALID.index(b"2026-11-30") + 3], "a value cut short"),
        (insert(RELID, outbox_values(created_at=b"yesterday")), "an unparseable created_at"),
        (insert(RELID, outbox_values(created_at=b"2026-11-30T11:11:26+00")),
         "a created_at fromisoformat reads but PostgreSQL does not print"),
        (insert(RELID, outbox_values(created_at=b"2026-11-30 11:11:26.1234567+00")),
         "7 fractional digits"),
        (insert(RELID, outbox_values(created_at=b"Infinity")), "not PostgreSQL's infinity"),
    ],
)
def test_c_insert_declines(message: bytes, why: str) -> None:
    assert c_insert(message) is None, why


def test_c_insert_accepts_what_the_pure_path_accepts_in_unused_columns() -> None:
    odd_tail = outbox_values(attempts=("b", b"\x00\x01"), processed_at=("u", b""))
    assert c_insert(insert(RELID, odd_tail)) == c_insert(VALID)
    assert c_insert(insert(RELID, outbox_values(payload=b"\xff"))).payload == b"\xff"  # as sent
    assert c_insert(insert(RELID, outbox_values(created_at=None))).created_at_ms is None
    for infinity in (b"infinity", b"-infinity"):
        assert c_insert(insert(RELID, outbox_values(created_at=infinity))).created_at_ms is None


def test_c_insert_applies_aliases_and_fills_carried_fields() -> None:
    # fields 6, 7: traceparent (the 12th column), tracestate (event_type's column)
    plan = ((0, 1, 2, 3, 4, -1, 5, -1, -1, -1, -1, 6), 12, 8, ((7, 3),))
    event = c_insert(insert(RELID, [*outbox_values(), b"tp"]), {RELID: plan})
    assert (event.extra, event.traceparent, event.tracestate) == ((), "tp", "OrderCreated")
    # fields 6-8: an extra (the 12th column), traceparent (NULL), tracestate (absent)
    plan = ((0, 1, 2, 3, 4, -1, 5, -1, -1, -1, -1, 6, 7), 13, 9, ())
    event = c_insert(insert(RELID, [*outbox_values(), b"t-1", None]), {RELID: plan})
    assert (event.extra, event.traceparent, event.tracestate) == (("t-1",), None, None)


def test_c_insert_declines_a_non_contiguous_buffer_and_rejects_bad_arguments() -> None:
    assert c_insert(memoryview(VALID + VALID)[::2]) is None  # the pure path copies it
    assert c_insert(VALID, {RELID: (PLAN[0], 11, 65, ())}) is None  # > 64 fields: pure
    with pytest.raises(TypeError):
        c_insert("I not bytes")  # type: ignore[arg-type]
    for plan in [(), (PLAN[0], 11, 6), (list(PLAN[0]), 11, 6, ()), (PLAN[0], 11, 5, ()),
                 (PLAN[0], 11, 7, ()), ((0, 1, 2, 3, 4, -1, 9), 11, 6, ()),
                 (PLAN[0], 11, 6, ((6, -1),))]:
        with pytest.raises((TypeError, ValueError)):
            c_insert(VALID, {RELID: plan})


@pytest.mark.parametrize("event_class", list(NOT_OUTBOX_EVENTS.values()), ids=list(NOT_OUTBOX_EVENTS))
def test_the_reader_refuses_a_class_that_is_not_the_outbox_event(event_class: Any) -> None:
    assert _cpgoutput is not None
    with pytest.raises(TypeError):
        _cpgoutput.Reader(PLANS, event_class)
    with pytest.raises(TypeError):
        _cpgoutput.Reader([], OutboxEvent)  # plans: the decoder's dict


@pytest.mark.parametrize("position", [1.0, "1", None])
def test_a_position_that_is_not_an_int_is_refused_alike_on_both_paths(position: Any) -> None:
    refusals = []
    for compiled in (True, False):
        decoder = built(compiled, PgOutputDecoder, OUTBOX, OutboxColumns())
        with pytest.raises(TypeError) as refused:
            decoder.decode(begin(1), position)
        refusals.append(str(refused.value))
    assert refusals[0] == refusals[1] == (
        f"decode: the position must be an int, not {type(position).__name__}")

"""The compiled timestamp parse (_ctimestamp) against the pure TimestampParser it must equal.

The differential properties give both parsers the same texts - PostgreSQL's ISO shapes
across the whole year range and every offset, fields out of range, fraction lengths 0-9,
single mutations, garbage and non-ASCII digits - and require the same epoch milliseconds
or the same ValueError text: the fast path may only decline, never accept what the pure
path rejects or give another value (docs/design.md, "The compiled decoders",
"Timestamps"). The direct tests pin down what ``epoch_ms`` itself accepts and declines.
The extension must be built: CI has a compiler.
"""

from __future__ import annotations

import re
import sys
import types
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cdc_relay.decoding.pgoutput import PgOutputDecoder
from cdc_relay.decoding.values import TimestampParser
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.model import Lsn, OutboxColumns, OutboxEvent
from tests.unit.decoding_fixtures import AT, OUTBOX
from tests.unit.test_decoding_pgoutput import OUTBOX_COLUMNS, insert, outbox_values, relation
from tests.unit.test_decoding_wal2json import insert_message, outbox_row

try:
    from cdc_relay.decoding._ctimestamp import epoch_ms
except ImportError:  # the test below says so; the others fail on the fixture
    epoch_ms = None  # type: ignore[assignment]

MODULE = "cdc_relay.decoding._ctimestamp"


@pytest.fixture
def compiled_epoch_ms() -> Any:
    assert epoch_ms is not None, f"{MODULE} is not built"
    return epoch_ms


def test_the_compiled_timestamp_parse_is_built() -> None:
    assert epoch_ms is not None, (
        f"{MODULE} is not built: run `make bootstrap` (it reinstalls, building the extensions) "
        "(CI builds it; a missing compiler must not silently drop the fast path's tests)"
    )
    assert TimestampParser(compiled=True).compiled
    assert TimestampParser().compiled


def test_compiled_none_falls_back_and_true_refuses_without_the_extension(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, MODULE, None)  # import fails
    assert not TimestampParser().compiled
    assert not TimestampParser(compiled=False).compiled
    assert TimestampParser().parse("1970-01-01 00:00:01+00") == 1000
    with pytest.raises(ImportError, match=re.escape("_ctimestamp) is not built: reinstall")):
        TimestampParser(compiled=True)


# ---------------------------------------------------------------- the two parsers, compared


def outcome(parser: TimestampParser, text: str) -> int | str | None:
    """What parsing gives: the epoch milliseconds (or None) or the ValueError's text."""
    try:
        return parser.parse(text)
    except ValueError as exc:
        return f"ValueError: {exc}"


def reference_ms(text: str) -> int:
    """The epoch ms by datetime arithmetic, independent of either parser's code."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def pg_offset(seconds: int, width: int) -> str:
    """An offset as PostgreSQL prints it (``width`` 0) or padded to +HH:MM / +HH:MM:SS."""
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{sign}{hours:02d}"
    if minutes or secs or width >= 1:
        text += f":{minutes:02d}"
    if secs or width >= 2:
        text += f":{secs:02d}"
    return text


@st.composite
def pg_timestamps(draw: st.DrawFn) -> str:
    """A text in the shape PostgreSQL's ISO DateStyle prints, any year 1-9999."""
    moment = draw(st.datetimes(min_value=datetime.min, max_value=datetime.max))
    text = (f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d} "
            f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}")
    digits = draw(st.integers(0, 6))
    if digits:
        text += "." + f"{moment.microsecond:06d}"[:digits]
    if draw(st.booleans()):  # timestamptz; else a timestamp column (UTC)
        seconds = draw(st.sampled_from([0, 3600, -10800, 19800, 20008, -34200])
                       | st.integers(-86399, 86399))
        text += pg_offset(seconds, draw(st.integers(0, 2)))
    return text


@st.composite
def raw_fields(draw: st.DrawFn) -> str:
    """The ISO layout with each field drawn past its range (month 13, Feb 29, hour 24...)."""
    year = draw(st.integers(0, 10001))
    fields = [draw(st.integers(0, 13)), draw(st.integers(0, 32)), draw(st.integers(0, 25)),
              draw(st.integers(0, 61)), draw(st.integers(0, 61))]
    text = "{:04d}-{:02d}-{:02d} {:02d}:{:02d}:{:02d}".format(year, *fields)
    text += draw(st.sampled_from(["", "."])) + "7" * draw(st.integers(0, 9))
    if draw(st.booleans()):
        parts = [draw(st.integers(0, 25)), draw(st.integers(0, 61)), draw(st.integers(0, 61))]
        count = draw(st.integers(1, 3))
        text += draw(st.sampled_from("+-")) + ":".join(f"{part:02d}" for part in parts[:count])
    return text


# Non-ASCII digits (Arabic-Indic, extended, fullwidth, superscript), NUL, a lone surrogate.
ODD = "0123456789-+:. TZz,\x00\t\n\u0663\u06f3\uff10\u00b9\ud800\u00e9"


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A valid text with one change: a character inserted, deleted, replaced; cut; extended."""
    text = draw(pg_timestamps() | raw_fields())
    at = draw(st.integers(0, len(text)))
    char = draw(st.sampled_from(ODD))
    how = draw(st.sampled_from(["insert", "delete", "replace", "cut", "append", "prefix"]))
    if how == "insert":
        return text[:at] + char + text[at:]
    if how == "delete":
        return text[:at] + text[at + 1:]
    if how == "replace":
        return text[:at] + char + text[at + 1:]
    if how == "cut":
        return text[:at]
    if how == "append":
        return text + draw(st.sampled_from([" BC", "Z", "0", " ", ".5", ":00", "+00", char]))
    return char + text


any_text = (pg_timestamps() | raw_fields() | mutated()
            | st.sampled_from(["infinity", "-infinity", "epoch", "now", ""])
            | st.text(alphabet=st.sampled_from(ODD), max_size=36) | st.text(max_size=36))


@settings(max_examples=3000, deadline=None)
@given(pg_timestamps())
def test_every_postgresql_shaped_text_is_accepted_with_the_pure_value(text: str) -> None:
    assert epoch_ms is not None, f"{MODULE} is not built"
    assert epoch_ms(text) == reference_ms(text) == TimestampParser(compiled=False).parse(text)


@settings(max_examples=4000, deadline=None)
@given(any_text)
@example("2026-02-29 00:00:00+00")
@example("1969-12-31 23:59:59.9995-00")
@example("2026-01-01 00:00:00.1234567")
@example("٢٠٢٦-01-01 00:00:00")
@example("2026-01-01 00:00:00+05:60")
def test_compiled_parse_declines_or_agrees_with_the_pure_one(text: str) -> None:
    assert epoch_ms is not None, f"{MODULE} is not built"
    pure = outcome(TimestampParser(compiled=False), text)
    assert outcome(TimestampParser(compiled=True), text) == pure
    fast = epoch_ms(text)
    assert fast is None or fast == pure


@settings(max_examples=500, deadline=None)
@given(st.lists(any_text, max_size=6))
def test_a_sequence_parses_alike_through_the_cache_on_both_paths(texts: list[str]) -> None:
    pure, compiled = TimestampParser(compiled=False), TimestampParser(compiled=True)
    assert [outcome(compiled, t) for t in texts] == [outcome(pure, t) for t in texts]


# ---------------------------------------------------------------- epoch_ms itself


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1970-01-01 00:00:00+00", 0),
        ("1970-01-01 00:00:00", 0),
        ("2026-11-30 11:11:26.123456+00", 1796037086123),
        ("2026-11-30 16:41:26.1234+05:30", 1796037086123),
        ("2026-11-30 08:11:26.9999-03", 1796037086999),
        ("1900-01-01 05:21:10+05:21:10", -2208988800000),
        ("1969-12-31 23:59:59.9995+00", -1),
        ("1969-12-31 23:59:59.999999", -1),
        ("1969-12-31 23:59:59.0015", -999),
        ("1969-12-31 23:59:59", -1000),
        ("1969-12-31 23:59:58.9995", -1001),
        ("1970-01-01 00:00:00.000001-00", 0),
        ("0001-01-01 00:00:00+00", -62135596800000),
        ("0001-01-01 00:00:00-23:59:59", -62135510401000),
        ("9999-12-31 23:59:59.999999+23:59:59", 253402214400999),
        ("2000-02-29 12:00:00.5", 951825600500),
        ("2024-02-29 00:00:00+00", 1709164800000),
    ],
)
def test_epoch_ms_of_postgresql_texts(compiled_epoch_ms: Any, text: str, ms: int) -> None:
    assert compiled_epoch_ms(text) == ms == reference_ms(text)


@pytest.mark.parametrize(
    "text",
    [
        "infinity", "-infinity", "", "2026-11-30",
        "2026-11-30 11:11:26 BC", "0044-03-15 12:00:00+00 BC",  # BC
        "10000-01-01 00:00:00+00", "0000-01-01 00:00:00+00",  # years past 9999, year 0
        "2026-11-30T11:11:26+00", "2026-11-30 11:11:26Z", "2026-11-30 11:11:26+0530",
        "2026-11-30 11:11", "2026-11-30 11:11:26.", "2026-11-30 11:11:26,5",
        "2026-11-30 11:11:26.1234567", "2026-11-30 11:11:26.123456789+00",  # 7+ digits
        "2026-02-29 00:00:00", "2100-02-29 00:00:00", "2026-04-31 00:00:00",  # no such day
        "2026-00-10 00:00:00", "2026-13-10 00:00:00", "2026-01-00 00:00:00",
        "2026-01-01 24:00:00", "2026-01-01 23:60:00", "2026-01-01 23:59:60",
        "2026-01-01 00:00:00+24", "2026-01-01 00:00:00-24:00", "2026-01-01 00:00:00+05:60",
        "2026-01-01 00:00:00+05:30:60", "2026-01-01 00:00:00+5", "2026-01-01 00:00:00+05:3",
        "2026-01-01 00:00:00+05:30:00.5", "2026-01-01 00:00:00 +05",
        "2026-01-01 00:00:00 ", " 2026-01-01 00:00:00", "2026-01-01 00:00:00\x00",
        "2026-01-01 00:00:00+00 ", "2026-01-01 00:00:00.+05",
        "٢٠٢٦-01-01 00:00:00", "2026-01-0٣ 00:00:00", "2026-01-01 00:00:0\uff10",
        "2026-01-01 00:00:00\ud800", "+026-01-01 00:00:00", "-026-01-01 00:00:00",
    ],
)
def test_epoch_ms_declines_every_other_text(compiled_epoch_ms: Any, text: str) -> None:
    assert compiled_epoch_ms(text) is None


def test_epoch_ms_declines_what_is_not_a_str(compiled_epoch_ms: Any) -> None:
    for value in (b"1970-01-01 00:00:00+00", None, 0, ["1970-01-01 00:00:00+00"]):
        assert compiled_epoch_ms(value) is None


# ---------------------------------------------------------------- the decoders' setting


def test_compiled_false_decoders_never_call_the_compiled_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in extension that answers 42 for everything: only compiled decoders see it."""
    fake = types.ModuleType(MODULE)
    fake.epoch_ms = lambda text: 42  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MODULE, fake)
    text = "2026-11-30 11:11:26.123456+00"

    def wal2json_ms(compiled: bool | None) -> int | None:
        decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns(), compiled=compiled)
        event = decoder.decode(insert_message(outbox_row(created_at=text)), AT)
        assert isinstance(event, OutboxEvent)
        return event.created_at_ms

    def pgoutput_ms(compiled: bool | None) -> int | None:
        decoder = PgOutputDecoder(OUTBOX, OutboxColumns(), compiled=compiled)
        assert decoder.decode(relation(16384, OUTBOX_COLUMNS), Lsn(0)) is None
        event = decoder.decode(insert(16384, outbox_values(created_at=text.encode())), AT)
        assert isinstance(event, OutboxEvent)
        return event.created_at_ms

    for decoded_ms in (wal2json_ms, pgoutput_ms):
        assert decoded_ms(None) == 42  # the stand-in is what a compiled parser calls
        assert decoded_ms(False) == 1796037086123

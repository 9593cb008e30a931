"""The compiled decoders' created_at parse (decoding/_ctimestamp.h, through _coutbox.h)
against the pure TimestampParser it must equal (decoding/values.py).

The C parse has no Python entry of its own: every test reaches it through a compiled
decoder, whose row it either decodes on its C path or declines to the pure path (counted
by the pure path's ``_insert`` calls). The differential properties give both paths the
same texts - PostgreSQL's ISO shapes across the whole year range and every offset, fields
out of range, fraction lengths 0-9, single mutations, garbage and non-ASCII digits - and
require the same epoch milliseconds or the same error text: the C parse may only
decline, never accept what the pure path rejects or give another value (docs/design.md,
"The compiled decoders", "Timestamps"). The direct tests pin down what it accepts and
declines, for both decoders. The stream properties feed rows whose created_at texts repeat
and change (the compiled decoders' one-entry cache) to both paths of both decoders and
require the same OutboxEvents, created_at_ms included, or the same DecodeError text;
PostgreSQL's shapes must never leave the compiled path. The extensions must be built: CI
has a compiler.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from random import Random
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cdc_relay.decoding.pgoutput import PgOutputDecoder
from cdc_relay.decoding.values import TimestampParser
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.errors import DecodeError
from cdc_relay.model import Change, OutboxColumns, OutboxEvent
from tests.unit.decoding_fixtures import AT, OUTBOX
from tests.unit.paths import built
from tests.unit.test_decoding_pgoutput import OUTBOX_COLUMNS, insert, outbox_values, relation
from tests.unit.test_decoding_wal2json import insert_message, outbox_row
from tests.unit.wal2json_documents import json_string

PLUGINS = ("wal2json", "pgoutput")
DECLINED = "declined"  # compiled_parse: the C parse left the row to the pure path

RELID = 16384
WARM_UP = "2026-11-30 11:11:26.123456+00"  # the first row: it sets wal2json's plans
INFINITIES = ("infinity", "-infinity")
_PLACEHOLDER = "created-at-goes-here"

def wal2json_rows(texts: list[str], rnd: Random | None = None) -> list[bytes]:
    """An insert per created_at text, after a first row of the same shape; ``rnd`` spells
    each text with drawn escapes, or not (None: plain; lone surrogates always escaped)."""
    template = insert_message(outbox_row(created_at=_PLACEHOLDER))
    spelled = [json_string(text, rnd if rnd is None or rnd.random() < 0.5 else None)
               for text in [WARM_UP, *texts]]
    return [template.replace(orjson.dumps(_PLACEHOLDER), text.encode()) for text in spelled]


def pgoutput_rows(texts: list[str]) -> list[bytes]:
    """The Relation, then an insert per created_at text (lone surrogates as their invalid
    UTF-8 bytes) after a first row."""
    return [relation(RELID, OUTBOX_COLUMNS)] + [
        insert(RELID, outbox_values(created_at=text.encode("utf-8", "surrogatepass")))
        for text in [WARM_UP, *texts]]


class CountingWal2Json(Wal2JsonDecoder):
    """Counts the rows the pure path decodes."""

    __slots__ = ("pure_inserts",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pure_inserts = 0

    def _insert(self, *args: Any) -> OutboxEvent:
        self.pure_inserts += 1
        return super()._insert(*args)


class CountingPgOutput(PgOutputDecoder):
    """Counts the rows the pure path decodes."""

    __slots__ = ("pure_inserts",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pure_inserts = 0

    def _insert(self, *args: Any) -> OutboxEvent | None:
        self.pure_inserts += 1
        return super()._insert(*args)


def decoded(decoder: Wal2JsonDecoder | PgOutputDecoder, messages: list[bytes]) -> list[Any]:
    """Each message's Change (or None), or its DecodeError's text, in order."""
    out: list[Change | str | None] = []
    for message in messages:
        try:
            out.append(decoder.decode(message, AT))
        except DecodeError as exc:
            out.append(f"DecodeError: {exc}")
    return out


def both_paths(texts: list[str], rnd: Random | None = None) -> list[list[Any]]:
    """For each decoder, the compiled path's outcomes of the rows of ``texts``, after
    asserting they are the pure path's (whole events: created_at_ms and every field)."""
    results = []
    for make, messages in ((Wal2JsonDecoder, wal2json_rows(texts, rnd)),
                           (PgOutputDecoder, pgoutput_rows(texts))):
        fast = built(True, make, OUTBOX, OutboxColumns())
        pure = built(False, make, OUTBOX, OutboxColumns())
        assert fast.compiled
        results.append(decoded(fast, messages))
        assert results[-1] == decoded(pure, messages), messages
    return results



def compiled_parse(plugin: str, text: str, compiled: bool = True) -> int | str | None:
    """``text``'s epoch milliseconds as the compiled ``plugin`` decoder's C path reads a
    row's created_at (after a first row, which sets wal2json's plans), or DECLINED when
    that row went to the pure path (which may refuse it before its ``_insert``). With
    ``compiled`` False: the pure decoder's value, or its DecodeError's text."""
    if plugin == "pgoutput":
        decoder: CountingWal2Json | CountingPgOutput = built(
            compiled, CountingPgOutput, OUTBOX, OutboxColumns())
        messages, planning = pgoutput_rows([text]), 0
    else:
        decoder = built(compiled, CountingWal2Json, OUTBOX, OutboxColumns())
        messages, planning = wal2json_rows([text]), 1
    last = decoded(decoder, messages)[-1]
    if not compiled:
        return last.created_at_ms if isinstance(last, OutboxEvent) else last
    if decoder.pure_inserts > planning or not isinstance(last, OutboxEvent):
        return DECLINED  # an error is always the pure path's wording
    return last.created_at_ms


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

@pytest.mark.slow  # a long property run
@settings(max_examples=1500, deadline=None)
@given(pg_timestamps())
def test_every_postgresql_shaped_text_is_accepted_with_the_pure_value(text: str) -> None:
    pure = TimestampParser().parse(text)
    assert [compiled_parse(plugin, text) for plugin in PLUGINS] == [reference_ms(text)] * 2
    assert pure == reference_ms(text)


@pytest.mark.slow  # a long property run
@settings(max_examples=2000, deadline=None)
@given(any_text)
@example("2026-02-29 00:00:00+00")
@example("1969-12-31 23:59:59.9995-00")
@example("2026-01-01 00:00:00.1234567")
@example("٢٠٢٦-01-01 00:00:00")
@example("2026-01-01 00:00:00+05:60")
def test_compiled_parse_declines_or_agrees_with_the_pure_one(text: str) -> None:
    pure = outcome(TimestampParser(), text)
    for plugin in PLUGINS:
        fast = compiled_parse(plugin, text)
        assert fast in (DECLINED, pure), plugin


@pytest.mark.slow  # a long property run
@settings(max_examples=500, deadline=None)
@given(st.lists(any_text, max_size=6))
def test_the_pure_parsers_cache_answers_as_a_fresh_parse(texts: list[str]) -> None:
    cached = TimestampParser()
    assert [outcome(cached, t) for t in texts] == [outcome(TimestampParser(), t) for t in texts]


# ---------------------------------------------------------------- what the C parse reads


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
@pytest.mark.parametrize("plugin", PLUGINS)
def test_the_decoders_read_postgresql_texts(compiled: bool, plugin: str, text: str,
                                            ms: int) -> None:
    """On the compiled path, in C: the row never leaves it."""
    assert compiled_parse(plugin, text, compiled) == ms == reference_ms(text)


@pytest.mark.parametrize(
    "text",
    [
        *INFINITIES, "", "2026-11-30",
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
@pytest.mark.parametrize("plugin", PLUGINS)
def test_the_c_parse_declines_every_other_text(compiled: bool, plugin: str, text: str) -> None:
    """PostgreSQL's infinities are decided in C (None, as on the pure path); every other
    text here leaves its row to the pure path, which decides as TimestampParser does."""
    if compiled:
        assert compiled_parse(plugin, text) == (None if text in INFINITIES else DECLINED)
        return
    pure = outcome(TimestampParser(), text)
    got = compiled_parse(plugin, text, compiled=False)
    assert got == pure if not isinstance(pure, str) else "DecodeError" in str(got)


# ---------------------------------------------------------------- streams on both paths


@pytest.mark.slow  # a long property run
@settings(max_examples=500, deadline=None)
@given(data=st.data())
def test_rows_decode_alike_on_both_paths_as_their_created_at_repeats_and_changes(
    data: st.DataObject,
) -> None:
    pool = data.draw(st.lists(any_text | st.sampled_from(INFINITIES), min_size=1, max_size=4))
    texts = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=10))
    both_paths(texts, data.draw(st.randoms()))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_postgresql_shaped_created_at_never_leaves_the_compiled_path(data: st.DataObject) -> None:
    pool = data.draw(st.lists(pg_timestamps() | st.sampled_from(INFINITIES), min_size=1,
                              max_size=4))
    texts = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=10))
    expected = [None if text in INFINITIES else reference_ms(text) for text in texts]
    rnd = data.draw(st.randoms())
    for decoder, messages, pure_rows in (
        (built(True, CountingWal2Json, OUTBOX, OutboxColumns()), wal2json_rows(texts, rnd), 1),
        (built(True, CountingPgOutput, OUTBOX, OutboxColumns()), pgoutput_rows(texts), 0),
    ):
        changes = [decoder.decode(message, AT) for message in messages]
        assert [c.created_at_ms for c in changes if isinstance(c, OutboxEvent)][1:] == expected
        assert decoder.pure_inserts == pure_rows  # wal2json: the first row, which plans


def test_a_stream_of_repeated_changed_infinite_and_bad_created_at_decodes_alike() -> None:
    first, second, iso_t = WARM_UP, "2026-11-30 16:41:27+05:30", "2026-11-30T11:11:26+00"
    texts = [first, first, second, second, first, "infinity", "infinity", "-infinity",
             "yesterday", first, "yesterday", iso_t, iso_t, first, "2026-11-30 11:11:26"]
    expected = [1796037086123, 1796037086123, 1796037087000, 1796037087000, 1796037086123,
                None, None, None, "DecodeError", 1796037086123, "DecodeError", 1796037086000,
                1796037086000, 1796037086123, 1796037086000]
    for outcomes in both_paths(texts):
        rows = [o for o in outcomes if o is not None][1:]  # not the Relation, nor the first
        assert [o.created_at_ms if isinstance(o, OutboxEvent) else o.split(":")[0]
                for o in rows] == expected

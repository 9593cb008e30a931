"""Hypothesis strategies for wal2json-like v2 documents, valid and mutated, and the
comparison of the two decoding paths on them (``assert_same``).

Used by test_decoding_wal2json_compiled*.py to compare the compiled fast path with the
pure-Python decoder. Documents are serialized here, not by a JSON library, so that they
can carry what a library never writes: any escape spelling (``\\u`` escapes, surrogate
pairs, ``\\/``), odd whitespace, duplicate keys, escaped keys, number tokens such as
``-0`` or ``1e400``, and byte-level damage (truncation, garbage, invalid UTF-8).
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.errors import DecodeError
from cdc_relay.model import TRACE_COLUMNS, OutboxColumns, OutboxEvent
from tests.unit.decoding_fixtures import AT, OUTBOX
from tests.unit.paths import built

# The default mapping's six columns and the other columns of the outbox table.
MAPPED = ("id", "aggregate_type", "aggregate_id", "event_type", "payload", "created_at")
OTHERS = ("attempts", "processed_at", "retry_after", "last_error", "dead_lettered_at")
# The mapped columns' plan of a row that lists them first, in MAPPED order.
PLAN = (0, 1, 2, 3, 4, 5)
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# --header / --partition-column columns the carried tests name (not outbox columns).
EXTRAS = ("tenant", "region")
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n",
                  "\r": "\\r", "\t": "\\t"}


@dataclass(frozen=True)
class Raw:
    """A token written as is (a number spelling no int or float gives)."""

    text: str


@dataclass(frozen=True)
class Obj:
    """A JSON object as a list of members: keys may repeat."""

    members: tuple[tuple[str, Any], ...]


def _u(code: int) -> str:
    return f"\\u{code:04x}" if code % 2 else f"\\u{code:04X}"


def json_string(text: str, rnd: Random | None) -> str:
    """``text`` as a JSON string literal, each character spelled one of the valid ways
    (``rnd`` picks; None: the plain way)."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        way = rnd.randrange(4) if rnd is not None else 0
        if way == 1 or (code < 0x20 and ch not in _SHORT_ESCAPES) or 0xD800 <= code <= 0xDFFF:
            if code > 0xFFFF:
                code -= 0x10000
                out.append(_u(0xD800 + (code >> 10)) + _u(0xDC00 + (code & 0x3FF)))
            else:
                out.append(_u(code))
        elif ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ch == "/" and way == 2:
            out.append("\\/")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


_WS = ("", "", "", "", " ", "\n", "\t ", "\r\n  ")


def serialize(value: Any, rnd: Random | None = None, *, escaped_keys: bool = True) -> str:
    """One JSON text of ``value`` (Raw, Obj, list, str, int, float, bool, None); ``rnd``
    picks escapes and whitespace (None: compact, no escapes), ``escaped_keys`` whether
    keys may be escaped too."""
    def ws() -> str:
        return _WS[rnd.randrange(len(_WS))] if rnd is not None else ""

    def text(item: Any) -> str:
        return ws() + serialize(item, rnd, escaped_keys=escaped_keys) + ws()

    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Obj):
        keys = [json_string(key, rnd if escaped_keys and rnd and rnd.randrange(100) == 0 else None)
                for key, _ in value.members]
        return "{" + ",".join(f"{ws()}{key}{ws()}:{text(member)}"
                              for key, (_, member) in zip(keys, value.members, strict=True)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(text(item) for item in value) + "]"
    if isinstance(value, str):
        return json_string(value, rnd)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value) if isinstance(value, float) else str(value)


def spelled(value: Any, *, escaped_keys: bool = True) -> st.SearchStrategy[bytes]:
    """``value`` serialized with drawn escapes and whitespace, as UTF-8 (lone surrogates
    are always written as escapes)."""
    return st.randoms().map(
        lambda rnd: serialize(value, rnd, escaped_keys=escaped_keys).encode())


# Text as PostgreSQL would store it, and any text (lone surrogates included).
pg_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
any_text = st.text(max_size=8)
odd_numbers = st.sampled_from([
    "-0", "0", "-0.0", "1E2", "1e-400", "1e400", "-1e400", "1.5e+3", "18446744073709551615",
    "18446744073709551616", "-9223372036854775809", "123456789012345678", "1234567890123456789",
    "1" + "0" * 300, "1" + "0" * 310, "0.1e309", "2.5",
]).map(Raw)
scalars = st.one_of(
    pg_text, any_text, st.integers(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.none(), odd_numbers,
)
plain_scalars = st.one_of(pg_text, st.integers(-(10**18), 10**18), st.booleans(), st.none(),
                          st.floats(allow_nan=False, allow_infinity=False, width=32))
nested = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3)
    | st.lists(st.tuples(any_text, children), max_size=3).map(lambda m: Obj(tuple(m))),
    max_leaves=6,
)
timestamps = st.sampled_from([
    "2026-11-30 11:11:26.123456+00", "2026-11-30 16:41:26.1234+05:30", "infinity",
    "1900-01-01 05:21:10+05:21:10", "2026-11-30 11:11:26", "yesterday", "",
])
good_values = {
    "id": st.one_of(pg_text.filter(bool), st.integers(0, 10**18 - 1)),
    "aggregate_type": pg_text,
    "aggregate_id": st.one_of(pg_text, st.integers(-(2**40), 2**40)),
    "event_type": pg_text,
    "payload": pg_text,
    "created_at": st.one_of(timestamps, st.none()),
}

# What a carried column holds (text_value takes them all); odd ones come from ``scalars``.
carried_values = st.one_of(
    pg_text, st.integers(-(10**18), 10**18), st.none(),
    st.sampled_from(["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "congo=t61rcWkgMzE"]),
)


@st.composite
def column(draw: st.DrawFn, name: str, value: Any, rnd: Random) -> Obj:
    """A column object; sometimes with a "type", reordered, or a repeated key."""
    members: list[tuple[str, Any]] = [("name", name), ("value", value)]
    if rnd.random() < 0.5:
        members.insert(1, ("type", rnd.choice(["text", "uuid", "jsonb"])))
    if rnd.random() < 0.2:
        members.reverse()
    if rnd.random() < 0.02:
        members.append(rnd.choice([("value", draw(scalars)), ("name", "id")]))
    return Obj(tuple(members))


@st.composite
def insert_document(draw: st.DrawFn, *, mapped: tuple[str, ...] = MAPPED,
                    odd_values: bool = True, extra_keys: bool = True,
                    carried: tuple[str, ...] = ()) -> Obj:
    """An I message of public.outbox_events (mostly), its columns in a drawn order.

    ``carried`` names columns that each are there or not, mostly with a carried value
    (text, int, null), and may repeat a column's name. The rare variations (another action
    or table, an odd value, a repeated key) are picked by a drawn Random, so that they
    stay rare: hypothesis favours small integers.
    """
    rnd = draw(st.randoms())
    names = list(mapped) + draw(st.lists(st.sampled_from(OTHERS), unique=True))
    names += [name for name in carried if rnd.random() < 0.8]
    if carried and rnd.random() < 0.1:  # a repeated name (the last one is the column)
        names.append(rnd.choice(names))
    names = draw(st.permutations(names))
    columns = []
    for name in names:
        strategy = good_values.get(name, scalars if odd_values else plain_scalars)
        if name in carried:
            odd = odd_values and rnd.random() < 0.15
            strategy = scalars if odd else carried_values
        if odd_values and rnd.random() < 0.03:
            strategy = nested
        columns.append(draw(column(name, draw(strategy), rnd)))
    members: list[tuple[str, Any]] = [
        ("action", "I" if rnd.random() < 0.9 else rnd.choice("BCUDTMX")),
        ("xid", draw(st.integers(0, 2**32))),
        ("lsn", "16/B374D848"),
        ("schema", "public" if rnd.random() < 0.95 else draw(pg_text)),
        ("table", "outbox_events" if rnd.random() < 0.95 else draw(pg_text)),
        ("columns", columns),
    ]
    if extra_keys:
        members += draw(st.lists(st.tuples(any_text, nested), max_size=2))
        if rnd.random() < 0.05:  # a repeated key, with another value
            key = rnd.choice([key for key, _ in members])
            members.append((key, draw(nested)))
    return Obj(tuple(draw(st.permutations(members))))


@st.composite
def damaged(draw: st.DrawFn, document: bytes) -> bytes:
    """``document`` truncated, or with bytes replaced, inserted or removed."""
    if not document:
        return document
    at = draw(st.integers(0, len(document) - 1))
    how = draw(st.integers(0, 3))
    garbage = draw(st.binary(min_size=1, max_size=3) | st.sampled_from(
        [b"\xed\xa0\x80", b"\xc0\xaf", b"\xff", b"\x00", b"\\", b'"', b",", b"}", b"\xef\xbb\xbf"]))
    if how == 0:
        return document[:at]
    if how == 1:
        return document[:at] + garbage + document[at + 1:]
    if how == 2:
        return document[:at] + garbage + document[at:]
    return document[:at] + document[at + 1:]


_CLEAN = {"id": "7616f707", "aggregate_type": "order", "aggregate_id": "o-1",
          "event_type": "Placed", "payload": '{"n": 1}', "created_at": "2026-01-10 00:00:00+00"}


def columns_of(document: Obj) -> list[Any]:
    """The last "columns" list of ``document`` (the one a JSON parser keeps), or []."""
    lists = [value for key, value in document.members if key == "columns" and type(value) is list]
    return lists[-1] if lists else []


def column_names(document: Obj) -> list[Any]:
    """The first "name" of each column object of ``document`` (None where there is none)."""
    return [dict(col.members).get("name") if isinstance(col, Obj) else None
            for col in columns_of(document)]


def clean_copy(document: Obj) -> Obj:
    """A good insert with ``document``'s column names in its order: decoded first, it
    sets the decoder's plans to ``document``'s shape."""
    columns = [Obj((("name", name), ("value", _CLEAN.get(name) if isinstance(name, str)
                                      else None))) for name in column_names(document)]
    return Obj((("action", "I"), ("schema", "public"), ("table", "outbox_events"),
                ("columns", columns)))


def plan_of(document: Obj, names: tuple[str, ...] = MAPPED) -> tuple[int, ...]:
    """Where ``names`` sit in ``document``'s columns (0 for a missing one)."""
    found = column_names(document)
    return tuple(found.index(name) if name in found else 0 for name in names)


def reader(names: tuple[str, str, str, str, str, str] = MAPPED, timestamped: bool = True,
           extras: tuple[str, ...] = ()) -> Any:
    """A ``_cwal2json.Reader`` of public.outbox_events (ImportError when not built)."""
    from cdc_relay.decoding._cwal2json import Reader

    return Reader("public", "outbox_events", names, timestamped, extras, TRACE_COLUMNS,
                  OutboxEvent)


def outcome(decoder: Wal2JsonDecoder, payload: bytes) -> tuple[str, Any]:
    """The Change of one decode, or the error's type and text."""
    try:
        return ("change", decoder.decode(payload, AT))
    except DecodeError as exc:
        return ("DecodeError", str(exc))
    except Exception as exc:  # the pure path's own behaviour, whatever it is, must match
        return (type(exc).__name__, str(exc))


def assert_same(columns: OutboxColumns, messages: list[bytes],
                extras: tuple[str, ...] = ()) -> None:
    """Both paths, fed the same messages in order, give the same outcome for each."""
    pure = built(False, Wal2JsonDecoder, OUTBOX, columns, extra_columns=extras)
    fast = built(True, Wal2JsonDecoder, OUTBOX, columns, extra_columns=extras)
    assert fast.compiled and not pure.compiled
    for message in messages:
        assert outcome(fast, message) == outcome(pure, message), message

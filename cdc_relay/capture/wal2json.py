"""wal2json with captured tables: their rows as the same CapturedRow pgoutput's give.

Owns ``Wal2JsonCaptureDecoder``, which sits in front of the outbox's Wal2JsonDecoder when
``run --capture`` streams with ``--plugin wal2json``, and ``capture_options``, the wal2json
options it needs (``add-tables`` names the outbox and the captured tables). Per v2 message:

* ``B``: the transaction's xid and commit time (``include-timestamp``, the text of
  ``timestamptz_out``); ``C``: the end of the commit (``nextlsn``, Debezium's
  ``sequence``) when the transaction had a change: wal2json writes a B/C pair for every
  transaction, pgoutput (PostgreSQL 15+) none for one without a published change, so the
  previous commit in ``sequence`` is the same for both. Both are forwarded: the outbox
  decoder returns Begin / Commit.
* ``I`` / ``U`` / ``D`` of a selected table: a CapturedRow whose images are what
  pgoutput's tuples would be - each value as the type's text output (UTF-8 bytes), None
  for NULL, ``UNCHANGED`` for an unchanged TOASTed value - so the capture room's codecs
  (capture/envelope.py, capture/types.py) read both plugins' rows alike.
* ``T`` with ``CodecOptions.truncate``: one CapturedRow of ``op`` ``t`` per message (wal2json
  writes one per table of a TRUNCATE, all at the statement's LSN, in pgoutput's order).

wal2json has no Relation message; each change lists its columns (name, type as
``format_type`` prints it, type OID, attribute number). The *layout* of a change - the
columns the table had at its moment - is rebuilt from that, and when the layout differs
from the table's last one, a codec is made from the catalog as pgoutput's Relation
would make it (capture/shape.py, ``shape_at``). What wal2json leaves out is inferred:

* An unchanged TOASTed value is left out of an update's ``columns``. A column of the
  catalog, of a type that can be TOASTed, whose attribute number the change lacks is such
  a value when it is older than a column the change has, or was in an earlier complete
  row of the stream; otherwise it was added after the change (attribute numbers are
  never reused).
* ``identity`` of an update under REPLICA IDENTITY DEFAULT or INDEX is the key, from the
  new row when the key did not change: it is an old image (pgoutput's ``K``) only when its
  values differ from the new row's. Under FULL it is always the old row (``O``).
* A delete under DEFAULT or INDEX names the key's columns only: its layout is the table's
  last one when that has them, else the catalog's.
* A typmod (``numeric(10,2)``) is the catalog's when the catalog prints the same type for
  the column, else read from the type's text (``parse_typmod``).
* Numbers arrive as JSON numbers and are read as their text, never as floats. wal2json
  writes NaN and the infinities of ``real``, ``double precision`` and ``numeric`` as JSON
  null: in a NOT NULL column that cannot be NULL, so the value is marked unreadable and
  the row becomes a dead letter (docs/table-cdc.md, wal2json).

Must not: do I/O (``shapes`` and ``positions`` are the PostgreSQL edge's lookups), or skip
a message it cannot read: DecodeError naming the LSN (docs/design.md, failure rules).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from cdc_relay.capture.decoder import CodecOptions, OutboxDecoder, ShapeLookup
from cdc_relay.capture.envelope import TableCodec
from cdc_relay.capture.selection import Selection
from cdc_relay.capture.shape import RelationColumn, TableShape, TypeLookup, shape_at
from cdc_relay.config import TableRef
from cdc_relay.decoding.wal2json import escape_add_tables, plugin_options
from cdc_relay.errors import DecodeError
from cdc_relay.model import UNCHANGED, CapturedRow, Change, Lsn

__all__ = ["Wal2JsonCaptureDecoder", "capture_options", "parse_typmod"]

PositionLookup = Callable[[str, str], dict[str, int]]  # column name -> attnum, today
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
_NUMBERS = frozenset({20, 21, 23, 26, 700, 701, 1700})
_NOT_A_NUMBER = b"NaN, Infinity or -Infinity (wal2json writes them as null)"
# types whose values are never TOASTed (fixed length): never an absent unchanged value
_FIXED = frozenset({16, 18, 19, 20, 21, 23, 26, 28, 600, 601, 603, 628, 718, 700, 701, 774,
                    790, 829, 1082, 1083, 1114, 1184, 1186, 1266, 2950, 3220})
_TYPMOD = re.compile(r"^(?P<base>[a-z ]+?)(?:\((?P<a>\d+)(?:,(?P<b>\d+))?\))?"
                     r"(?P<rest>(?: with(?:out)? time zone)?)(?:\[\])*$")
_FIELDS = {"year": 2, "month": 1, "day": 3, "hour": 10, "minute": 11, "second": 12}  # in order


def capture_options(outbox: TableRef | None, tables: list[tuple[str, str]], *,
                    truncate: bool, partitioned: bool = False) -> list[tuple[str, str]]:
    """The outbox's wal2json options (decoding/wal2json.py) with what capture needs:
    updates and deletes (and truncates with ``truncate``), column types, type OIDs and
    positions, the primary key, commit times, and ``add-tables`` naming the captured
    tables beside the outbox (none for a partitioned outbox: every table then comes)."""
    base = plugin_options(outbox or TableRef("public", "cdc_relay_none"), partitioned=True)
    names = [] if outbox is None else [outbox]
    names += [TableRef(schema, table) for schema, table in tables]
    extra = {
        "include-types": "1", "include-type-oids": "1", "include-typmod": "1",
        "include-column-positions": "1", "include-pk": "1", "include-timestamp": "1",
        "actions": "insert,update,delete" + (",truncate" if truncate else ""),
    }
    options = [(key, extra.pop(key, value)) for key, value in base]
    options += list(extra.items())
    if not partitioned:
        options.append(("add-tables", ",".join(
            f"{escape_add_tables(t.schema)}.{escape_add_tables(t.name)}" for t in names)))
    return options


def parse_typmod(type_name: str) -> int:
    """The typmod ``format_type`` printed into ``type_name`` (``numeric(10,2)``,
    ``character varying(5)``, ``timestamp(3) with time zone``, ``interval day to
    second(3)``, their arrays); -1 when it shows none or is not one of these."""
    match = _TYPMOD.match(type_name)
    if match is None:
        return -1
    base, a, b = match["base"], match["a"], match["b"]
    words = base.split()
    if words[0] == "interval":
        fields = _range_fields(words[1:])
        if fields is None or (a is None and not words[1:]):
            return -1
        mask = sum(1 << _FIELDS[name] for name in fields) if fields else 0x7FFF
        return (mask << 16) | (0xFFFF if a is None else int(a))
    if a is None:
        return -1
    if base == "numeric":
        return ((int(a) << 16) | int(b or 0)) + 4
    if base in ("character varying", "character"):
        return int(a) + 4
    if base in ("bit", "bit varying", "time", "timestamp"):
        return int(a)
    return -1


def _range_fields(words: list[str]) -> list[str] | None:
    """An interval's fields (``day to second``: day, hour, minute, second); None: not
    fields."""
    order = list(_FIELDS)
    if not words:
        return []
    if len(words) == 1 and words[0] in order:
        return words
    if len(words) == 3 and words[1] == "to" and words[0] in order and words[2] in order:
        return order[order.index(words[0]):order.index(words[2]) + 1]
    return None


@dataclass(frozen=True, slots=True)
class _Column:
    """One column of a change as wal2json lists it (position 0: not given, identity)."""

    name: str
    oid: int
    type_name: str
    position: int = field(default=0, compare=False)


@dataclass(slots=True)
class _Table:
    """What the decoder remembers of one captured table."""

    layout: tuple[_Column, ...]
    codec: TableCodec
    identity: str  # the catalog's replica identity when the layout was made
    seen: dict[int, _Column] = field(default_factory=dict)  # complete rows' columns by position
    partial: dict[tuple[_Column, ...], tuple[_Column, ...]] = field(default_factory=dict)


class Wal2JsonCaptureDecoder:
    """See the module docstring. ``outbox`` is the Wal2JsonDecoder."""

    def __init__(self, outbox: OutboxDecoder, selection: Selection, shapes: ShapeLookup,
                 options: CodecOptions, types: TypeLookup = lambda oid, typmod: None,
                 positions: PositionLookup = lambda schema, table: {}) -> None:
        self._outbox = outbox
        self._forward = outbox.decode
        self._selection = selection
        self._shapes = shapes
        self._types = types
        self._positions = positions
        self._options = options
        self._tables: dict[tuple[str, str], _Table] = {}
        self._xid: int | None = None
        self._commit_us = 0
        self._last_commit: Lsn | None = None
        self._written = False  # the open transaction had a change (not only B and C)

    def reset(self) -> None:
        """Forget the open transaction (every reconnect); layouts are kept (they are hints
        checked against each change)."""
        self._outbox.reset()
        self._xid = None

    def decode(self, payload: bytes | memoryview, wal_start: int) -> Change | None:
        """One wal2json v2 message (see the module docstring)."""
        buf = payload if type(payload) is bytes else bytes(payload)
        lsn = Lsn(int(wal_start))
        try:
            msg = orjson.loads(buf)
            action = msg.get("action") if type(msg) is dict else None
            if action not in ("B", "C"):
                self._written = True
            if action in ("I", "U", "D", "T"):
                key = (msg.get("schema"), msg.get("table"))
                if type(key[0]) is str and type(key[1]) is str and \
                        self._selection.matches(key[0], key[1]):
                    return self._change(action, buf, lsn)
            elif action == "B":
                self._written = False
                self._xid = msg.get("xid")
                self._commit_us = _micros(msg.get("timestamp"))
            elif action == "C":
                change = self._forward(buf, wal_start)
                if self._written:
                    self._last_commit = Lsn.parse(msg["nextlsn"])
                return change
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise DecodeError(f"cannot decode the wal2json message at LSN {lsn}: {exc} "
                              "(docs/table-cdc.md, wal2json)") from exc
        return self._forward(buf, wal_start)

    def _change(self, action: str, buf: bytes, lsn: Lsn) -> CapturedRow | None:
        # again, numbers as their text: a numeric's digits must not go through a float
        msg = json.loads(buf, parse_float=str, parse_int=str)
        schema, table = msg["schema"], msg["table"]
        if action == "T":
            if not self._options.truncate:
                return None
            known = self._tables.get((schema, table)) or self._from_catalog(schema, table)
            return CapturedRow((known.codec,), "t", None, None, lsn, self._xid,
                               self._commit_us, self._last_commit)
        pk = {c["name"] for c in msg.get("pk") or ()}
        if action == "I":
            present = _columns(msg["columns"])
            known = self._complete(schema, table, present, pk)
            return self._row(known, "c", _values(msg["columns"], present, known.layout), None, lsn)
        if action == "U":
            present = _columns(msg["columns"])
            known = self._updated(schema, table, present, pk)
            new = _values(msg["columns"], present, known.layout)
            return self._row(known, "u", new, self._old(known, msg.get("identity"), new), lsn)
        identity = _columns(msg["identity"])
        known = self._deleted(schema, table, identity, pk)
        return self._row(known, "d", None, _values(msg["identity"], identity, known.layout,
                                                   absent=None), lsn)

    def _row(self, known: _Table, op: str, new: list[bytes | object | None] | None,
             old: list[bytes | object | None] | None, lsn: Lsn) -> CapturedRow:
        for image in (new, old if known.identity == "f" else None):
            if image is not None:
                _mark_null_numbers(known.codec.shape, image)
        return CapturedRow(known.codec, op, new, old, lsn, self._xid, self._commit_us,
                           self._last_commit)

    def _old(self, known: _Table, identity: Any, new: list[bytes | object | None]
             ) -> list[bytes | object | None] | None:
        """The old image of an update: FULL's whole row; DEFAULT's or INDEX's key only when
        it differs from the new row's (else wal2json took it from the new row)."""
        if not identity:
            return None
        columns = _columns(identity)
        old = _values(identity, columns, known.layout, absent=None)
        if known.identity != "f" and all(
                o == n for o, n in zip(old, new, strict=True) if o is not None):
            return None
        return old

    def _complete(self, schema: str, table: str, present: tuple[_Column, ...],
                  pk: set[str]) -> _Table:
        """An insert's (or a FULL old row's) columns: the whole layout of its moment."""
        known = self._tables.get((schema, table))
        if known is None or known.layout != present:
            known = self._make(schema, table, present, pk)
        known.seen.update((c.position, c) for c in present if c.position)
        return known

    def _updated(self, schema: str, table: str, present: tuple[_Column, ...],
                 pk: set[str]) -> _Table:
        """An update's layout: its columns and, by position, the unchanged TOASTed ones."""
        known = self._tables.get((schema, table))
        if known is not None and (known.layout == present or present in known.partial):
            layout = present if known.layout == present else known.partial[present]
            if layout == known.layout:
                return known
        catalog = self._shapes(schema, table)
        layout = _with_unchanged(present, catalog, self._positions(schema, table),
                                 {} if known is None else known.seen)
        if known is None or known.layout != layout:
            known = self._make(schema, table, layout, pk, catalog)
        if layout != present:
            known.partial[present] = layout
        else:
            known.seen.update((c.position, c) for c in present if c.position)
        return known

    def _deleted(self, schema: str, table: str, identity: tuple[_Column, ...],
                 pk: set[str]) -> _Table:
        """A delete's layout: the old row's under FULL, else the last layout with the key."""
        known = self._tables.get((schema, table))
        if known is not None and ((known.identity == "f" and known.layout == identity) or
                                  (known.identity != "f" and _covers(known.layout, identity))):
            return known
        catalog = self._shapes(schema, table)
        if catalog is not None and catalog.replica_identity == "f":
            return self._make(schema, table, identity, pk, catalog)
        if known is not None and _covers(known.layout, identity):
            return known
        return self._from_catalog(schema, table, catalog)

    def _from_catalog(self, schema: str, table: str,
                      catalog: TableShape | None = None) -> _Table:
        """The layout the catalog has now (a delete's or truncate's first sight)."""
        catalog = catalog or self._shapes(schema, table)
        if catalog is None:
            raise ValueError(f"{schema}.{table} is not in the catalog and no change of it "
                             "showed its columns")
        layout = tuple(_Column(c.name, c.type_oid, c.type_name) for c in catalog.columns)
        return self._make(schema, table, layout, set(catalog.key), catalog)

    def _make(self, schema: str, table: str, layout: tuple[_Column, ...], pk: set[str],
              catalog: TableShape | None = None) -> _Table:
        """The codec of a layout (see capture/shape.py, ``shape_at``)."""
        if catalog is None:
            catalog = self._shapes(schema, table)
        facts = {} if catalog is None else {c.name: c for c in catalog.columns}
        columns = []
        for column in layout:
            fact = facts.get(column.name)
            typmod = fact.typmod if fact is not None and fact.type_oid == column.oid and \
                fact.type_name.replace('"', "") == column.type_name.replace('"', "") \
                else parse_typmod(column.type_name)
            columns.append(RelationColumn(column.name, column.oid, typmod, column.name in pk))
        identity = "d" if catalog is None else catalog.replica_identity
        shape = shape_at(schema, table, tuple(columns), identity, catalog, self._types)
        options = self._options
        codec = TableCodec(shape, tuple(c.name for c in layout), options.prefix,
                           options.schemas, options.placeholder, modes=options.modes,
                           names=options.names)
        known = _Table(layout, codec, identity)
        previous = self._tables.get((schema, table))
        if previous is not None:
            known.seen = previous.seen
        self._tables[(schema, table)] = known
        return known


def _columns(items: Any) -> tuple[_Column, ...]:
    return tuple(_Column(c["name"], int(c["typeoid"]), c["type"], int(c.get("position", 0)))
                 for c in items)


def _covers(layout: tuple[_Column, ...], identity: tuple[_Column, ...]) -> bool:
    by_name = {c.name: c.oid for c in layout}
    return all(by_name.get(c.name) == c.oid for c in identity)


def _with_unchanged(present: tuple[_Column, ...], catalog: TableShape | None,
                    positions: dict[str, int], seen: dict[int, _Column]) -> tuple[_Column, ...]:
    """``present`` with the columns left out as unchanged TOASTed values, by position."""
    if catalog is None:
        return present
    have = {c.position for c in present}
    last = max(have, default=0)
    absent = []
    for column in catalog.columns:
        position = positions.get(column.name, 0)
        fixed = column.type_oid in _FIXED or (column.labels is not None and not column.element_oid)
        if not position or position in have or fixed:
            continue
        if position < last or position in seen:
            earlier = seen.get(position)
            absent.append(earlier if earlier is not None else
                          _Column(column.name, column.type_oid, column.type_name, position))
    if not absent:
        return present
    return tuple(sorted(present + tuple(absent), key=lambda c: c.position))


def _values(items: Any, columns: tuple[_Column, ...], layout: tuple[_Column, ...], *,
            absent: object = UNCHANGED) -> list[bytes | object | None]:
    """A row image in ``layout``'s order: pgoutput's text values; a layout column the
    message lacks is ``absent`` (an update's unchanged TOAST value; None for an old key)."""
    by_name = {column.name: (column, item["value"]) for column, item in zip(columns, items,
                                                                            strict=True)}
    image: list[bytes | object | None] = []
    for column in layout:
        found = by_name.get(column.name)
        image.append(absent if found is None else _text(found[0], found[1]))
    return image


def _text(column: _Column, value: Any) -> bytes | None:
    """A wal2json value as the type's text output (what pgoutput sends)."""
    if value is None:
        return None
    if value is True or value is False:
        return b"t" if value else b"f"
    if column.oid == 17:  # bytea: wal2json drops the \x
        return b"\\x" + str(value).encode()
    return str(value).encode()


def _mark_null_numbers(shape: TableShape, image: list[bytes | object | None]) -> None:
    """A JSON null in a NOT NULL number column is NaN or an infinity wal2json could not
    write: marked, so the codec refuses it and the row is a dead letter naming it."""
    for i, column in enumerate(shape.columns):
        if image[i] is None and column.not_null and column.type_oid in _NUMBERS:
            image[i] = _NOT_A_NUMBER


def _micros(text: Any) -> int:
    """``timestamptz_out``'s text (``2026-12-06 17:00:00.123456+00``) as µs since 1970."""
    if type(text) is not str:
        raise ValueError("begin without 'timestamp' (include-timestamp=1?)")
    moment = datetime.fromisoformat(text)
    return (moment - _EPOCH) // _ONE_US


"""pgoutput with captured tables: their rows as CapturedRow, everything else to the outbox's.

Owns ``CaptureDecoder``, which sits in front of the outbox's PgOutputDecoder (only when
``run --capture`` is given: without it the outbox decoder and its compiled fast path run
alone, untouched). Per message it reads the kind byte and:

* Relation ``R``: when the table is selected (capture/selection.py), builds its
  TableCodec from the shape of that moment (capture/shape.py, ``shape_at``): the
  Relation's columns, type OIDs, typmods and replica identity, with what only the
  catalog says (``shapes``: as read at start-up, asked again only when the table's
  Relation differs from the last one; ``types``: a type's facts by OID) - so the events
  after a DDL carry the new shape and those before it the old one; always forwards the
  message, so the outbox decoder knows every relation id.
* Begin ``B`` / Commit ``C``: notes the transaction's xid and commit time, and the end of
  the last commit (Debezium's ``sequence``); forwards (the outbox decoder returns
  Begin / Commit).
* Insert / Update / Delete of a captured relation: the CapturedRow - the new image, the
  old one (``K``: the replica identity's columns, the others NULL; ``O``: the whole
  row), unchanged TOASTed values as ``UNCHANGED``. Other relations' go to the outbox
  decoder (which publishes outbox inserts and ignores the rest).
* Insert into the signal table (``signals``, incremental snapshots): a SnapshotSignal;
  a transactional logical decoding message with the snapshots' prefix: the high
  watermark's SnapshotMark (capture/incremental.py).
* Truncate ``T``, with ``CodecOptions.truncate`` (``--capture-truncate``): one CapturedRow
  of ``op`` ``t`` whose ``table`` is the tuple of the captured tables it names (one
  message names every table of one TRUNCATE statement the publication has); without it,
  or naming no captured table, forwarded (the outbox decoder ignores it).

Must not: do I/O itself (``shapes`` is the PostgreSQL edge's lookup, injected), skip a
message it cannot read: a truncated buffer or a row of a relation no Relation message
announced raises DecodeError naming the LSN (docs/design.md, failure rules).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cdc_relay.capture.envelope import TableCodec
from cdc_relay.capture.modes import TypeModes
from cdc_relay.capture.selection import Selection
from cdc_relay.capture.shape import RelationColumn, TableShape, TypeLookup, shape_at
from cdc_relay.capture.types import DEFAULT_MODES
from cdc_relay.decoding.compiled import DecodeFunction
from cdc_relay.errors import DecodeError
from cdc_relay.model import UNCHANGED, CapturedRow, Change, Lsn, SnapshotMark, SnapshotSignal

__all__ = ["CaptureDecoder", "CodecOptions"]

_UINT32 = struct.Struct("!I")
_UINT16 = struct.Struct("!H")
_OID_TYPMOD = struct.Struct("!Ii")
_BEGIN = struct.Struct("!QqI")  # final_lsn, commit timestamp (µs since 2000-01-01), xid
_COMMIT = struct.Struct("!BQQq")
_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in microseconds since 1970-01-01
MARK_PREFIX = b"cdc-relay-snapshot\x00"  # an incremental snapshot's high watermark message

ShapeLookup = Callable[[str, str], TableShape | None]


@dataclass(frozen=True, slots=True)
class CodecOptions:
    """How codecs are built: the topic prefix, schema blocks on or off, the placeholder,
    truncate events, the type modes."""

    prefix: str
    schemas: bool
    placeholder: str = "__debezium_unavailable_value"
    truncate: bool = False
    modes: TypeModes = DEFAULT_MODES
    names: tuple[str, str] = ("none", "none")  # schema, field name adjustment (capture/names.py)


class OutboxDecoder(Protocol):
    """What the capture decoder needs of the outbox decoder (decoding/pgoutput.py)."""

    @property
    def decode(self) -> DecodeFunction: ...
    def reset(self) -> None: ...


class CaptureDecoder:
    """See the module docstring. ``outbox`` is the PgOutputDecoder (any object with
    ``decode`` and ``reset``)."""

    def __init__(self, outbox: OutboxDecoder, selection: Selection, shapes: ShapeLookup,
                 options: CodecOptions, types: TypeLookup = lambda oid, typmod: None,
                 signals: tuple[str, str] | None = None) -> None:
        """``signals``: the signal table (schema, table) of incremental snapshots."""
        self._outbox = outbox
        self._forward = outbox.decode
        self._selection = selection
        self._shapes = shapes
        self._types = types
        self._options = options
        self._codecs: dict[int, TableCodec] = {}
        # per table: the last Relation's (columns, replica identity) and the codec made of it
        self._known: dict[tuple[str, str], tuple[tuple[RelationColumn, ...], str, TableCodec]] = {}
        self._xid: int | None = None
        self._commit_us = 0
        self._last_commit: Lsn | None = None
        self._signals = signals
        self._signal_columns: dict[int, tuple[int, int, int]] = {}  # relid: id, type, data

    def reset(self) -> None:
        """Forget relations and the open transaction (every reconnect)."""
        self._outbox.reset()
        self._codecs.clear()
        self._xid = None

    @property
    def codecs(self) -> dict[int, TableCodec]:
        """The captured relations' codecs by relation id (for tests and doctor)."""
        return self._codecs

    def decode(self, payload: bytes | memoryview, wal_start: int) -> Change | None:
        """One pgoutput message (see the module docstring)."""
        buf = payload if type(payload) is bytes else bytes(payload)
        kind = buf[0] if buf else 0
        try:
            if kind in (0x49, 0x55, 0x44):  # 'I' 'U' 'D'
                codec = self._codecs.get(_UINT32.unpack_from(buf, 1)[0])
                if codec is not None:
                    return self._row(kind, buf, codec, Lsn(wal_start))
                if kind == 0x49 and self._signal_columns:
                    signal = self._signal(buf, Lsn(wal_start))
                    if signal is not None:
                        return signal
            elif kind == 0x4D and buf.startswith(MARK_PREFIX, 10):  # 'M', the snapshots'
                return SnapshotMark(buf[14 + len(MARK_PREFIX):].decode(), Lsn(wal_start))
            elif kind == 0x42:  # 'B'
                _, commit_ts, self._xid = _BEGIN.unpack_from(buf, 1)
                self._commit_us = commit_ts + _PG_EPOCH_US
            elif kind == 0x43:  # 'C'
                change = self._forward(buf, wal_start)
                self._last_commit = Lsn(_COMMIT.unpack_from(buf, 1)[2])
                return change
            elif kind == 0x52:  # 'R'
                self._relation(buf)
            elif kind == 0x54 and self._options.truncate:  # 'T'
                row = self._truncate(buf, Lsn(wal_start))
                if row is not None:
                    return row
        except (struct.error, IndexError, ValueError) as exc:
            raise DecodeError(f"cannot decode the pgoutput message at LSN {Lsn(wal_start)}: "
                              f"truncated or malformed {chr(kind)!r} message ({exc})") from exc
        return self._forward(buf, wal_start)

    def _relation(self, buf: bytes) -> None:
        relid = _UINT32.unpack_from(buf, 1)[0]
        namespace, pos = _cstring(buf, 5)
        name, pos = _cstring(buf, pos)
        self._codecs.pop(relid, None)
        schema = namespace or "pg_catalog"
        if (schema, name) == self._signals:
            self._signal_relation(relid, buf, pos)
            return
        if not self._selection.matches(schema, name):
            return
        identity = chr(buf[pos])
        ncols = _UINT16.unpack_from(buf, pos + 1)[0]
        pos += 3
        columns: list[RelationColumn] = []
        for _ in range(ncols):
            flags = buf[pos]
            column, pos = _cstring(buf, pos + 1)
            oid, typmod = _OID_TYPMOD.unpack_from(buf, pos)
            columns.append(RelationColumn(column, oid, typmod, bool(flags & 1)))
            pos += 8
        known = self._known.get((schema, name))
        if known is not None and known[0] == tuple(columns) and known[1] == identity:
            self._codecs[relid] = known[2]
            return
        shape = shape_at(schema, name, tuple(columns), identity, self._shapes(schema, name),
                         self._types)
        options = self._options
        codec = TableCodec(shape, tuple(c.name for c in columns), options.prefix,
                           options.schemas, options.placeholder, modes=options.modes,
                           names=options.names)
        self._known[(schema, name)] = (tuple(columns), identity, codec)
        self._codecs[relid] = codec

    def _signal_relation(self, relid: int, buf: bytes, pos: int) -> None:
        """The signal table's columns ``id``, ``type``, ``data`` by position."""
        ncols = _UINT16.unpack_from(buf, pos + 1)[0]
        pos += 3
        names = []
        for _ in range(ncols):
            column, pos = _cstring(buf, pos + 1)
            names.append(column)
            pos += 8
        if {"id", "type", "data"} <= set(names):
            self._signal_columns[relid] = (names.index("id"), names.index("type"),
                                           names.index("data"))

    def _signal(self, buf: bytes, lsn: Lsn) -> SnapshotSignal | None:
        columns = self._signal_columns.get(_UINT32.unpack_from(buf, 1)[0])
        if columns is None or buf[5] != 0x4E:  # 'N'
            return None
        values, _ = _tuple(buf, 6)
        ident, kind, data = (v.decode() if isinstance(v, bytes) else None
                             for v in (values[i] for i in columns))
        return SnapshotSignal(ident or "", kind or "", data, lsn)

    def _truncate(self, buf: bytes, lsn: Lsn) -> CapturedRow | None:
        """Truncate: relation count, options (CASCADE, RESTART IDENTITY), relation ids."""
        count = _UINT32.unpack_from(buf, 1)[0]
        if len(buf) != 6 + 4 * count:
            raise ValueError(f"{count} relations in {len(buf)} bytes")
        relids = struct.unpack_from(f"!{count}I", buf, 6)
        codecs = tuple(c for c in map(self._codecs.get, relids) if c is not None)
        if not codecs:
            return None
        return CapturedRow(codecs, "t", None, None, lsn, self._xid, self._commit_us,
                           self._last_commit)

    def _row(self, kind: int, buf: bytes, codec: TableCodec, lsn: Lsn) -> CapturedRow:
        pos = 5
        old = None
        if kind != 0x49 and buf[pos] in (0x4B, 0x4F):  # 'K' / 'O': an old image
            old, pos = _tuple(buf, pos + 1)
        new = None
        if kind != 0x44:
            if buf[pos] != 0x4E:  # 'N'
                raise ValueError(f"expected a new tuple, found {chr(buf[pos])!r}")
            new, pos = _tuple(buf, pos + 1)
        if pos != len(buf):
            raise ValueError(f"{len(buf) - pos} unexpected trailing bytes")
        op = "c" if kind == 0x49 else "u" if kind == 0x55 else "d"
        return CapturedRow(codec, op, new, old, lsn, self._xid, self._commit_us, self._last_commit)


def _tuple(buf: bytes, pos: int) -> tuple[list[bytes | object | None], int]:
    ncols = _UINT16.unpack_from(buf, pos)[0]
    pos += 2
    values: list[bytes | object | None] = []
    for _ in range(ncols):
        kind = buf[pos]
        if kind == 0x74:  # 't'
            end = pos + 5 + _UINT32.unpack_from(buf, pos + 1)[0]
            if end > len(buf):
                raise ValueError("tuple value truncated")
            values.append(buf[pos + 5 : end])
            pos = end
        elif kind == 0x6E:  # 'n'
            values.append(None)
            pos += 1
        elif kind == 0x75:  # 'u'
            values.append(UNCHANGED)
            pos += 1
        else:
            raise ValueError(f"tuple column kind {chr(kind)!r} (binary values are not requested)")
    return values, pos


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(b"\x00", pos)
    return buf[pos:end].decode(), end + 1

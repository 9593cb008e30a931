"""Decode pgoutput (logical replication protocol version 1) messages into Changes.

Owns: the pgoutput option list (``plugin_options``), the relation cache (Relation
messages map relation ids to tables; they are sent again after every reconnect, so the
source calls ``reset()`` when it reconnects), a per-relation plan of which tuple columns
feed which OutboxEvent field (built once, when the Relation message arrives), and the
binary parsing of Begin / Relation / Insert / Commit.

Must not: do I/O, import a driver, or skip anything it cannot read. A truncated buffer,
an unknown message type, an Insert for a relation it was never told about, or NULL in a
required column raises ``DecodeError`` naming the LSN (docs/design.md, WAL mode: never confirm past a
change that was not understood). Well-formed messages that are not outbox inserts
(Origin, Type, Truncate, Update, Delete, other prefixes' Messages, other tables'
inserts) decode to None.

Logical decoding messages (``messages 'true'``; pgoutput sends every prefix, so the
decoder keeps only the relay's): a transactional Message (flags bit 1) with the
``cdc-relay`` prefix is an outbox event of its transaction (``decode_envelope``, shared
with wal2json), a non-transactional one is ``IgnoredMessage``. Layout in protocol 1 (no
streaming, so no xid): ``'M'``, flags (1), message LSN (8), prefix (C string), content
length (4), content.

Carried columns (``--header``, ``--partition-column``; ``traceparent`` / ``tracestate``
when the relation has them) are planned with the Relation like the mapped ones: a named
column missing from the relation is reported at its first Insert, a trace column is
optional.

Row positions: the XLogData ``wal_start`` of an Insert is the start of the row's WAL
record - the same value wal2json reports as the row's ``lsn`` - and becomes
``OutboxEvent.lsn``. A Commit's ``end_lsn`` (byte offset 10 of the message) is the end of
the commit record, the position to confirm; ``commit_lsn`` is its start, and the
Commit's ``wal_start`` equals ``end_lsn``. A Begin's ``wal_start`` is its first
*published* change (not the transaction's first record, as with wal2json). Messages
that are not the last of one write - Relation, Type, and a Begin followed by Origin -
arrive with ``wal_start`` 0/0: never treat a message's ``wal_start`` as a position.

Only the tuple columns up to the last mapped one are parsed (the column count is checked
against the Relation; the bytes after the last mapped column are not read).

Values arrive in text format (``binary`` is not requested), produced by the same output
functions wal2json calls, so payload bytes (jsonb's normal form), ids and timestamps are
identical to wal2json's; the timestamp parsing is shared with the wal2json decoder
(decoding/values.py). The payload bytes are passed on as received: the database encoding
must be UTF8.

The optional compiled fast path (``_cpgoutput``; docs/design.md, "The compiled decoders")
reads the common outbox Insert straight from the message buffer into the finished
OutboxEvent, created_at parsed in C, with a plan per outbox relation kept beside the
relation cache. It declines whatever the code below would not accept exactly as it does
(a created_at its parse does not read included); that code then runs unchanged and words
every error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cdc_relay import accel
from cdc_relay.config import TableRef
from cdc_relay.decoding.compiled import CompiledDecode, DecodeFunction, position_lsn
from cdc_relay.decoding.envelope import decode_envelope
from cdc_relay.decoding.values import TimestampParser
from cdc_relay.errors import DecodeError
from cdc_relay.model import (
    MESSAGE_PREFIX,
    TRACE_COLUMNS,
    Begin,
    Change,
    Commit,
    IgnoredMessage,
    Lsn,
    OutboxColumns,
    OutboxEvent,
)

__all__ = ["PgOutputDecoder", "plugin_options"]

_BEGIN = struct.Struct("!QqI")  # final_lsn, commit timestamp, xid
_COMMIT = struct.Struct("!BQQq")  # flags, commit_lsn, end_lsn, commit timestamp
_INSERT_HEAD = struct.Struct("!IcH")  # relation id, 'N', column count
_UINT32 = struct.Struct("!I")
_REL_HEAD = struct.Struct("!bH")  # replica identity, column count
_COL_TYPMOD = struct.Struct("!Ii")  # type oid, type modifier

_IGNORED = frozenset(b"OYTUD")  # Origin, Type, Truncate, Update, Delete
_MESSAGE_HEAD = struct.Struct("!BQ")  # flags (1 = transactional), message LSN
_PREFIX = MESSAGE_PREFIX.encode() + b"\x00"
_FIELDS = 6  # OutboxEvent fields read from mapped columns; carried columns follow
_STREAMING = frozenset(b"SEcA")  # protocol 2: stream start / stop / commit / abort
_TWO_PHASE = frozenset(b"bPKrp")  # protocol 3: begin prepare, prepare, commit/rollback, ...

# Tuple column kinds.
_TEXT = ord("t")
_NULL = ord("n")
_UNCHANGED = ord("u")
_BINARY = ord("b")

# What the compiled Reader reads per outbox relation id: (slots, ncols, nfields, aliases).
_Plan = tuple[tuple[int, ...], int, int, tuple[tuple[int, int], ...]]


def plugin_options(publication: str) -> list[tuple[str, str]]:
    """The pgoutput options to pass to ``START_REPLICATION``.

    Protocol version 1 (no streaming of in-progress transactions, so every change
    arrives after its commit and a rolled-back transaction never arrives), text values
    (no ``binary``), logical decoding messages on (``messages 'true'``, PostgreSQL 14+:
    the tableless outbox; other prefixes are dropped by the decoder). The publication
    name is double-quoted, as the relay quotes it in ``CREATE PUBLICATION``: pgoutput
    parses the list as SQL identifiers and would fold an unquoted name to lower case.
    The publication should be ``FOR TABLE <outbox> WITH (publish = 'insert')`` so the
    walsender does not send updates and deletes the relay ignores anyway.
    """
    return [
        ("proto_version", "1"),
        ("publication_names", '"' + publication.replace('"', '""') + '"'),
        ("messages", "true"),
    ]


@dataclass(frozen=True, slots=True)
class _Relation:
    """What an Insert for this relation id needs.

    ``slots`` maps tuple column index -> OutboxEvent field index (-1: not used), up to
    the last used column; ``problem`` is set when the relation is the outbox table but
    lacks a mapped column (reported at the first Insert, like wal2json would).
    """

    name: str
    ncols: int
    outbox: bool
    slots: tuple[int, ...] = ()
    problem: str | None = None
    aliases: tuple[tuple[int, int], ...] = ()  # (field, field whose column it shares)
    carried: bool = False  # a carried column (extra or trace) is among the slots


class PgOutputDecoder:
    """Decodes pgoutput v1 messages for one outbox table (see the module docstring)."""

    __slots__ = ("_compiled_entry", "_entry", "_extra_count", "_fields", "_plans", "_position",
                 "_relations", "_table", "_timestamps", "_xid")

    def __init__(self, table: TableRef, columns: OutboxColumns,
                 extra_columns: tuple[str, ...] = ()) -> None:
        """The compiled fast path is used where the process's choice allows (accel.py)."""
        self._table = table
        # The fast path's view of the outbox relations; changed in place, never replaced
        # (the compiled Reader holds this dict).
        self._plans: dict[int, _Plan] = {}
        self._compiled_entry = _compiled_entry(self._plans, self._decode)
        self._entry: DecodeFunction = self._compiled_entry or self._decode
        # Column names in OutboxEvent field order; created_at sixth (may be "": none), then
        # the carried columns: the named extras (required), then the trace columns (optional).
        self._fields = (
            columns.id,
            columns.aggregate_type,
            columns.aggregate_id,
            columns.event_type,
            columns.payload,
            columns.created_at,
            *extra_columns,
            *TRACE_COLUMNS,
        )
        self._extra_count = len(extra_columns)
        self._relations: dict[int, _Relation] = {}
        self._xid: int | None = None
        # The last non-zero wal_start: pgoutput sends 0/0 with messages that are not the
        # last of a write (Relation, Type, a Begin followed by Origin); errors about those
        # name this position instead.
        self._position = Lsn(0)
        self._timestamps = TimestampParser()

    @property
    def compiled(self) -> bool:
        """Whether Inserts take the compiled fast path."""
        return self._compiled_entry is not None

    def reset(self) -> None:
        """Forget relations and the open transaction (call on every reconnect)."""
        self._relations.clear()
        self._plans.clear()
        self._xid = None

    @property
    def decode(self) -> DecodeFunction:
        """``decode(payload, wal_start)``: one message (``wal_start`` an int or Lsn) as a
        Change, or None for messages that are not outbox Changes. Where the compiled fast
        path is built this is its entry point (``Decode``, no Python frame for a common
        Insert), else the pure decoder (docs/design.md, "The compiled decoders")."""
        return self._entry

    def _decode(self, payload: bytes | memoryview, wal_start: int) -> Change | None:
        """The pure decoder: every message, or those the compiled fast path declined."""
        if type(wal_start) is not Lsn:
            wal_start = position_lsn(wal_start)
        if wal_start:
            self._position = wal_start
        buf = payload if type(payload) is bytes else bytes(payload)
        if not buf:
            raise self._error(wal_start, "empty message")
        kind = buf[0]
        try:
            if kind == 0x49:  # 'I'
                return self._insert(buf, wal_start)
            if kind == 0x42:  # 'B'
                final_lsn, _, xid = _BEGIN.unpack_from(buf, 1)
                self._xid = xid
                return Begin(xid, Lsn(final_lsn))
            if kind == 0x43:  # 'C'
                end_lsn = _COMMIT.unpack_from(buf, 1)[2]
                xid, self._xid = self._xid, None
                return Commit(Lsn(end_lsn), xid)
            if kind == 0x52:  # 'R'
                self._relation(buf, wal_start)
                self._plan(_UINT32.unpack_from(buf, 1)[0])
                return None
            if kind == 0x4D:  # 'M'
                return self._message(buf, wal_start)
        except (struct.error, IndexError, ValueError) as exc:
            what = f"truncated or malformed {chr(kind)!r} message ({exc})"
            raise self._error(wal_start, what) from exc
        if kind in _IGNORED:
            return None
        if kind in _STREAMING:
            raise self._error(
                wal_start,
                f"streaming message {chr(kind)!r}, but streaming is not enabled "
                "(proto_version 1 without 'streaming'): check the replication options",
            )
        if kind in _TWO_PHASE:
            raise self._error(
                wal_start, f"two-phase message {chr(kind)!r}, but two_phase is not enabled"
            )
        raise self._error(wal_start, f"unknown message type {chr(kind)!r}")

    def _error(self, wal_start: Lsn, what: str) -> DecodeError:
        entry = self._compiled_entry  # it saw the positions of the messages it decoded too
        return _error(wal_start, what, self._position if entry is None else entry.position)

    def _plan(self, relid: int) -> None:
        """Give the fast path the plan of an outbox relation it can decode (not the others:
        their Inserts are the pure path's, to ignore or to report)."""
        relation = self._relations[relid]
        if self._compiled_entry is None or not relation.outbox or relation.problem is not None:
            self._plans.pop(relid, None)
            return
        nfields = len(self._fields) if relation.carried else _FIELDS
        self._plans[relid] = (relation.slots, relation.ncols, nfields, relation.aliases)

    def _relation(self, buf: bytes, wal_start: Lsn) -> None:
        relid = _UINT32.unpack_from(buf, 1)[0]
        namespace, pos = _cstring(buf, 5)
        name, pos = _cstring(buf, pos)
        ncols = _REL_HEAD.unpack_from(buf, pos)[1]
        pos += _REL_HEAD.size
        names = []
        for _ in range(ncols):
            column, pos = _cstring(buf, pos + 1)  # skip the flags byte
            _COL_TYPMOD.unpack_from(buf, pos)
            pos += _COL_TYPMOD.size
            names.append(column)
        if pos != len(buf):
            raise ValueError(f"{len(buf) - pos} unexpected trailing bytes")
        qualified = f"{namespace or 'pg_catalog'}.{name}"
        if namespace != self._table.schema or name != self._table.name:
            self._relations[relid] = _Relation(qualified, ncols, outbox=False)
            return
        index = {column: i for i, column in enumerate(names)}
        optional = len(self._fields) - len(TRACE_COLUMNS)
        wanted = [name for name in self._fields[:optional] if name]
        missing = [column for column in wanted if column not in index]
        if missing:
            problem = (
                f"column(s) {', '.join(map(repr, missing))} missing from {qualified}: check the "
                "column mapping (--columns) against the table"
            )
            self._relations[relid] = _Relation(qualified, ncols, True, problem=problem)
            return
        wanted += [name for name in self._fields[optional:] if name in index]
        last = max(index[column] for column in wanted)
        slots = [-1] * (last + 1)
        aliases = []  # a column feeding two fields (e.g. --header event_type): copy it
        for field, column in enumerate(self._fields):
            if column and column in index:
                first = slots[index[column]]
                if first < 0:
                    slots[index[column]] = field
                else:
                    aliases.append((field, first))
        self._relations[relid] = _Relation(qualified, ncols, True, tuple(slots), None,
                                           tuple(aliases),
                                           max(slots + [f for f, _ in aliases]) >= _FIELDS)

    def _insert(self, buf: bytes, wal_start: Lsn) -> OutboxEvent | None:
        relid, new, ncols = _INSERT_HEAD.unpack_from(buf, 1)
        relation = self._relations.get(relid)
        if relation is None:
            raise self._error(
                wal_start,
                f"insert for relation id {relid}, which no Relation message announced "
                "(the decoder must be reset on reconnect, not in the middle of a stream)",
            )
        if not relation.outbox:
            return None
        if relation.problem is not None:
            raise self._error(wal_start, relation.problem)
        if new != b"N":
            raise self._error(wal_start, f"insert with tuple marker {new!r}, expected b'N'")
        if ncols != relation.ncols:
            raise self._error(
                wal_start,
                f"insert with {ncols} columns but {relation.name} has {relation.ncols}",
            )
        # Without carried columns only the six mapped fields are filled (and read).
        values: list[bytes | None] = [None] * (len(self._fields) if relation.carried else _FIELDS)
        pos = 8  # after 'I', relation id, 'N', column count
        for column, field in enumerate(relation.slots):
            kind = buf[pos]
            if kind == _TEXT:
                end = pos + 5 + _UINT32.unpack_from(buf, pos + 1)[0]
                if field >= 0:
                    values[field] = buf[pos + 5 : end]
                pos = end
            elif kind == _NULL:
                pos += 1
            elif kind in (_UNCHANGED, _BINARY):
                if field >= 0:
                    what = "an unchanged TOAST value" if kind == _UNCHANGED else "a binary value"
                    raise self._error(
                        wal_start, f"column {self._fields[field]!r} of {relation.name} is {what}"
                    )
                pos += 1 if kind == _UNCHANGED else 5 + _UINT32.unpack_from(buf, pos + 1)[0]
            else:
                raise self._error(wal_start, f"unknown tuple column kind {kind!r} in column {column}")
        if pos > len(buf):
            raise self._error(wal_start, f"insert truncated: {pos - len(buf)} bytes missing")
        for field, first in relation.aliases:
            values[field] = values[first]
        return self._event(values, relation, wal_start)

    def _message(self, buf: bytes, wal_start: Lsn) -> Change | None:
        """A logical decoding message: an outbox event if transactional with our prefix."""
        flags = _MESSAGE_HEAD.unpack_from(buf, 1)[0]
        start = 1 + _MESSAGE_HEAD.size
        if not buf.startswith(_PREFIX, start):
            _cstring(buf, start)  # well formed, another tool's prefix: not ours to publish
            return None
        pos = start + len(_PREFIX)
        length = _UINT32.unpack_from(buf, pos)[0]
        content = buf[pos + 4 :]
        if len(content) != length:
            raise ValueError(f"message content is {len(content)} bytes, header says {length}")
        if not flags & 1:
            return IgnoredMessage(MESSAGE_PREFIX)
        try:
            return decode_envelope(content, wal_start, self._extra_count)
        except ValueError as exc:
            raise self._error(wal_start, str(exc)) from exc

    def _event(
        self, values: list[bytes | None], relation: _Relation, wal_start: Lsn
    ) -> OutboxEvent:
        id_, aggregate_type, aggregate_id, event_type, payload, raw_ts = values[:_FIELDS]
        if (
            id_ is None
            or aggregate_type is None
            or aggregate_id is None
            or event_type is None
            or payload is None
        ):
            column = self._fields[values.index(None)]
            raise self._error(
                wal_start,
                f"column {column!r} of {relation.name} is NULL: outbox rows need id, "
                "aggregate type and id, event type, payload",
            )
        created_at_ms = None
        try:
            if raw_ts is not None:
                created_at_ms = self._timestamps.parse(raw_ts.decode())
            event = OutboxEvent(
                id_.decode(),
                aggregate_type.decode(),
                aggregate_id.decode(),
                event_type.decode(),
                payload,
                created_at_ms,
                wal_start,
            )
            if relation.carried:
                carried = [None if v is None else v.decode() for v in values[_FIELDS:]]
                count = self._extra_count
                event.extra = tuple(carried[:count])
                event.traceparent, event.tracestate = carried[count], carried[count + 1]
            return event
        except ValueError as exc:  # includes UnicodeDecodeError
            raise self._error(wal_start, f"bad value in {relation.name}: {exc}") from exc


def _compiled_entry(plans: dict[int, _Plan], slow: DecodeFunction) -> CompiledDecode | None:
    """The entry point that tries the compiled fast path over ``plans`` before ``slow``, per
    the process's choice (accel.py); None for the pure path."""
    module = accel.extension("_cpgoutput")
    if module is None:
        return None
    entry: CompiledDecode = module.Decode(module.Reader(plans, OutboxEvent).insert, slow, Lsn)
    return entry


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(b"\x00", pos)
    return buf[pos:end].decode(), end + 1


def _error(wal_start: Lsn, what: str, previous: Lsn | None = None) -> DecodeError:
    where = f"LSN {wal_start}"
    if not wal_start and previous:
        where += f" (pgoutput sends no position with this message; the last one was {previous})"
    return DecodeError(f"cannot decode the pgoutput message at {where}: {what}")

"""Decode wal2json format-version 2 messages into Changes.

Owns: turning one v2 message (one JSON object per B / I / C / ...) into a ``Begin``, an
``OutboxEvent`` or a ``Commit``. The text-to-value conversions both decoders share
(``text_value``, ``TimestampParser``) live in decoding/values.py, the option list the
replication source passes (``plugin_options``) in decoding/wal2json_options.py; both are
re-exported here.

Must not: do I/O, import a driver, or skip anything it cannot read. Every malformed
message raises ``DecodeError`` naming the LSN: the relay then stops without confirming
past it (docs/design.md, WAL mode). Messages that are well formed but not outbox inserts (other tables,
U, D, T) decode to None.

Logical decoding messages (``M``, the tableless outbox of ``outbox.emit_message``):
wal2json passes only the relay's prefix (``add-msg-prefixes``). A transactional one is
an outbox event in its transaction's B/C pair, decoded by ``decode_envelope``
(decoding/envelope.py) into the same OutboxEvent a row would give; a non-transactional
one becomes ``IgnoredMessage`` (counted, never published: it would appear even if the
writer rolled back). A rolled-back transaction's messages are never decoded.

Carried columns (``--header``, ``--partition-column``, and ``traceparent`` /
``tracestate`` when the table has them) are looked up by name in a second, separately
cached plan (decoding/carried.py): absent from the row, a named column is a DecodeError and a
trace column is simply None. The plan is rebuilt when the column count or a name at a
remembered position changes, or when a trace column the plan lacks appears by a rename
that keeps the count, so a trace column added or renamed while streaming is picked up.

Partitioned outboxes: rows are logged under their partition's name, and wal2json's
``add-tables`` matches names literally (``*`` only as a whole schema or table name), so
it cannot follow partitions created later. For a partitioned outbox the relay passes no
``add-tables`` (``plugin_options(table, partitioned=True)``) and the decoder decides per
table name, asking a ``PartitionCatalog`` (pg/partitions.py, the I/O) the first time an
outbox-shaped table name shows up; the answers are remembered. A row whose table lacks
the outbox's columns cannot be a partition's (partitions have exactly the parent's
columns) and is ignored without asking. No row is skipped before that decision.

Row positions: an ``I`` message's ``lsn`` is the start of the row's WAL record, and the
XLogData ``wal_start`` of the same message is that same value (wal2json and the
walsender both print ``change->lsn``; pgoutput reports it too). ``OutboxEvent.lsn`` is
therefore taken from ``wal_start`` and the field is not parsed again (the fixture tests
check they agree). A ``C`` message's ``nextlsn`` is the commit record's end (= its
``wal_start``): the position to confirm. Its ``lsn`` is the commit record's start and is
never confirmed. A ``B`` message's ``wal_start`` is the transaction's first record.

Column values: wal2json writes every value with the column type's output function, as a
JSON string, except numbers (bare), booleans and NULL. ``jsonb`` therefore arrives as a
string in jsonb's normal form (the same text pgoutput sends); the payload is that string
re-encoded as UTF-8. Integer ids (``bigint``) arrive as JSON numbers and are turned back
into their decimal text. The database encoding must be UTF8.

The compiled fast path (docs/design.md, "The compiled decoders"): when
``cdc_relay.decoding._cwal2json`` is built, ``decode`` first hands the message to its
``Reader.row``, which reads the common outbox insert in one scan, its carried columns
included, and returns the finished OutboxEvent (created_at parsed in C), declining
everything else; a declined message takes the pure path below, unchanged. It reads at
the positions of both plans (the six mapped columns' and the carried one's) and checks
the names there, and the other columns' names against the carried names the plan lacks,
but never plans: it takes a row only when its column count is the carried plan's and no
such name appears, so the first row of a shape, and a row whose names moved, is the pure
path's, which replans. ``--pure-python`` (cdc_relay/accel.py) forces the pure path, for
the timestamp parse too.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from cdc_relay import accel
from cdc_relay.config import TableRef
from cdc_relay.decoding.carried import MISSING as _MISSING
from cdc_relay.decoding.carried import CarriedPlan
from cdc_relay.decoding.compiled import CompiledDecode, DecodeFunction, position_lsn
from cdc_relay.decoding.envelope import decode_envelope
from cdc_relay.decoding.values import TimestampParser, text_value
from cdc_relay.decoding.wal2json_options import escape_add_tables, plugin_options
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

__all__ = [
    "MESSAGE_PREFIX",
    "PartitionCatalog",
    "TimestampParser",
    "Wal2JsonDecoder",
    "escape_add_tables",
    "plugin_options",
    "text_value",
]

_MALFORMED = "insert without a well-formed 'columns' list of names and values"
# wal2json's v2 actions. I (on the outbox table), M (relay prefix), B and C become Changes.
_IGNORED_ACTIONS = frozenset(("U", "D", "T"))

class PartitionCatalog(Protocol):
    """Which tables' rows are outbox rows (a partitioned outbox; see the module docstring)."""

    def refresh(self, schema: str, table: str) -> tuple[frozenset[tuple[str, str]], bool]:
        """(every table now in the outbox's partition tree, whether ``schema.table``'s
        rows are outbox rows). Raises a RelayError when it cannot tell."""
        ...

def _compiled_reader(schema: str, table: str, names: tuple[str, str, str, str, str, str],
                     timestamped: bool, extras: tuple[str, ...], slow: DecodeFunction,
                     ) -> tuple[Any | None, CompiledDecode | None]:
    """The compiled Reader for one table and the entry point that tries its ``row`` before
    ``slow``, per the process's choice (accel.py); (None, None) for the pure path."""
    module = accel.extension("_cwal2json")
    if module is None:
        return None, None
    reader = module.Reader(schema, table, names, timestamped, extras, TRACE_COLUMNS, OutboxEvent)
    entry: CompiledDecode = module.Decode(reader.row, slow, Lsn)
    return reader, entry


def _lsn(text: object) -> Lsn:
    if type(text) is not str:
        raise ValueError(f"not an LSN: {text!r}")
    return Lsn.parse(text)


class Wal2JsonDecoder:
    """Decodes wal2json v2 messages for one outbox table (see the module docstring)."""

    __slots__ = ("_carried", "_compiled_entry", "_created_at", "_entry", "_extra_count",
                 "_members", "_names", "_others", "_partitions", "_plan", "_reader", "_required",
                 "_schema", "_table", "_timestamps")

    def __init__(self, table: TableRef, columns: OutboxColumns,
                 partitions: PartitionCatalog | None = None, *,
                 extra_columns: tuple[str, ...] = ()) -> None:
        """The compiled fast path is taken where the process's choice allows (accel.py)."""
        self._schema = table.schema
        self._table = table.name
        # A partitioned outbox: tables known to hold outbox rows, and outbox-shaped
        # tables known not to (each asked once).
        self._partitions = partitions
        self._members: set[tuple[str, str]] = set()
        self._others: set[tuple[str, str]] = set()
        # An empty created_at name means "the table has no creation time column".
        self._created_at = columns.created_at or None
        # The six looked-up columns, in OutboxEvent field order. Without a created_at
        # column the sixth slot repeats the id column and its value is not used.
        self._names = (
            columns.id,
            columns.aggregate_type,
            columns.aggregate_id,
            columns.event_type,
            columns.payload,
            columns.created_at or columns.id,
        )
        # Positions of those columns in the last row seen. wal2json lists the columns in
        # table order, which changes only with DDL: checking six names at known positions
        # is cheaper than indexing every column of every row by name.
        self._plan = (0, 1, 2, 3, 4, 5)
        self._required = frozenset(self._names)
        self._timestamps = TimestampParser()
        self._extra_count = len(extra_columns)
        self._carried = CarriedPlan(extra_columns, text_value)
        # The compiled Reader (its row and set_plan) and the entry point over it, or None.
        self._reader, self._compiled_entry = _compiled_reader(
            self._schema, self._table, self._names, self._created_at is not None, extra_columns,
            self._decode)
        self._sync_plan()
        self._entry: DecodeFunction = self._compiled_entry or self._decode

    @property
    def compiled(self) -> bool:
        """Whether ``decode`` tries the compiled fast path first (see the module docstring)."""
        return self._compiled_entry is not None

    def reset(self) -> None:
        """On reconnect: forget which outbox-shaped tables are not partitions (ask again).

        Every wal2json v2 message is self-describing; known partitions are kept, since
        a dropped one's rows may still be ahead in the stream.
        """
        self._others.clear()

    @property
    def decode(self) -> DecodeFunction:
        """``decode(payload, wal_start)``: one message (``wal_start`` an int or Lsn) as a
        Change, or None for messages that are not outbox Changes. Where the compiled fast
        path is built this is its entry point (``Decode``: the Reader's row first, no
        Python frame for a common insert), else the pure decoder (see the module docstring)."""
        return self._entry

    def _sync_plan(self) -> None:
        """Give the compiled Reader the plans it reads rows by (after the pure path made them)."""
        if self._reader is not None:
            carried = self._carried
            self._reader.set_plan(self._plan, carried.plan, carried.ncols)

    def _decode(self, payload: bytes | memoryview, wal_start: int) -> Change | None:
        """The pure decoder: every message, or those the compiled fast path declined."""
        if type(wal_start) is not Lsn:
            wal_start = position_lsn(wal_start)
        try:
            msg = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise _error(wal_start, f"not JSON ({exc})") from exc
        if type(msg) is not dict:
            raise _error(wal_start, f"expected a JSON object, got {type(msg).__name__}")
        action = msg.get("action")
        if action == "I":
            schema = msg.get("schema")
            table = msg.get("table")
            if type(schema) is not str or type(table) is not str:
                raise _error(wal_start, "insert without 'schema' and 'table' (include-schemas=1?)")
            if (table != self._table or schema != self._schema) and not self._is_partition(
                    schema, table, msg.get("columns")):
                return None
            try:
                return self._insert(msg.get("columns"), wal_start)
            finally:  # the plans may have changed, even for a row then rejected: the
                self._sync_plan()  # compiled Reader reads the next rows by the same ones
        if action == "B":
            commit_lsn = msg.get("lsn")  # include-lsn: the commit record's LSN
            try:
                return Begin(_xid(msg, wal_start), None if commit_lsn is None else _lsn(commit_lsn))
            except ValueError as exc:
                raise _error(wal_start, f"bad 'lsn' in begin: {exc}") from exc
        if action == "M":
            return self._message(msg, wal_start)
        if action == "C":
            nextlsn = msg.get("nextlsn")
            if nextlsn is None:
                end_lsn = wal_start
            else:
                try:
                    end_lsn = _lsn(nextlsn)
                except ValueError as exc:
                    raise _error(wal_start, f"bad 'nextlsn' in commit: {exc}") from exc
            return Commit(end_lsn, _xid(msg, wal_start))
        if type(action) is str and action in _IGNORED_ACTIONS:
            return None
        if action is None:
            raise _error(wal_start, "message without 'action'")
        raise _error(wal_start, f"unknown action {action!r}")

    def _is_partition(self, schema: str, table: str, columns: Any) -> bool:
        """True if this row of another table than the outbox's is an outbox row."""
        if self._partitions is None:
            return False
        key = (schema, table)
        if key in self._members:
            return True
        if key in self._others or not self._shaped(columns):
            return False
        members, outbox = self._partitions.refresh(schema, table)
        self._members.update(members)
        (self._members if outbox else self._others).add(key)
        return outbox

    def _shaped(self, columns: Any) -> bool:
        """Whether the row has every column the outbox mapping names."""
        try:
            return self._required <= {column["name"] for column in columns}
        except (KeyError, TypeError):
            return False

    def _insert(self, columns: Any, wal_start: Lsn) -> OutboxEvent:
        # The row's LSN is wal_start: wal2json writes the same change->lsn into both the
        # XLogData header and the "lsn" field, so the field is not parsed again.
        values = self._pick(columns)
        if values is None:
            values = self._replan(columns, wal_start)
        id_, aggregate_type, aggregate_id, event_type, payload, created_at = values
        if not (
            type(id_) is str
            and type(aggregate_type) is str
            and type(aggregate_id) is str
            and type(event_type) is str
            and type(payload) is str
        ):
            id_, aggregate_type, aggregate_id, event_type, payload = self._texts(values, wal_start)
        created_at_ms = None
        if created_at is not None and self._created_at is not None:
            created_at_ms = self._created_at_ms(self._created_at, created_at, wal_start)
        event = OutboxEvent(
            id_, aggregate_type, aggregate_id, event_type, payload.encode(), created_at_ms,
            wal_start,
        )
        carried = self._carried
        if carried.active or len(columns) != carried.ncols or carried.appeared(columns):
            problem = carried.fill(event, columns)
            if problem is not None:
                name, raw = problem
                raise _error(wal_start, _MALFORMED if name is None else self._problem(name, raw))
        return event

    def _created_at_ms(self, column: str, created_at: object, wal_start: Lsn) -> int | None:
        if type(created_at) is not str:
            raise _error(wal_start, self._problem(column, created_at))
        try:
            return self._timestamps.parse(created_at)
        except ValueError as exc:
            raise _error(wal_start, f"column {column!r}: {exc}") from exc

    def _message(self, msg: dict[str, Any], wal_start: Lsn) -> Change | None:
        """A logical decoding message: an outbox event if transactional with our prefix."""
        if msg.get("prefix") != MESSAGE_PREFIX:
            return None  # add-msg-prefixes keeps others out; never publish a stranger's
        if msg.get("transactional") is not True:
            return IgnoredMessage(MESSAGE_PREFIX)
        content = msg.get("content")
        if type(content) is not str:
            raise _error(wal_start, "logical decoding message without a text 'content'")
        try:
            return decode_envelope(content.encode(), wal_start, self._extra_count)
        except ValueError as exc:
            raise _error(wal_start, str(exc)) from exc

    def _pick(self, columns: Any) -> tuple[Any, ...] | None:
        """The six values if the columns sit where they sat last time, else None."""
        i0, i1, i2, i3, i4, i5 = self._plan
        n0, n1, n2, n3, n4, n5 = self._names
        try:
            c0 = columns[i0]
            c1 = columns[i1]
            c2 = columns[i2]
            c3 = columns[i3]
            c4 = columns[i4]
            c5 = columns[i5]
            if (
                c0["name"] == n0
                and c1["name"] == n1
                and c2["name"] == n2
                and c3["name"] == n3
                and c4["name"] == n4
                and c5["name"] == n5
            ):
                return (
                    c0["value"], c1["value"], c2["value"], c3["value"], c4["value"], c5["value"]
                )
        except (IndexError, KeyError, TypeError):
            pass
        return None

    def _replan(self, columns: Any, wal_start: Lsn) -> tuple[Any, ...]:
        """Find the columns by name (first row, or after DDL) and remember where they are."""
        malformed = _MALFORMED
        try:
            index = {column["name"]: i for i, column in enumerate(columns)}
        except (KeyError, TypeError) as exc:
            raise _error(wal_start, malformed) from exc
        for name in self._names:
            if name not in index:
                raise _error(wal_start, self._problem(name, _MISSING))
        i0, i1, i2, i3, i4, i5 = (index[name] for name in self._names)
        self._plan = (i0, i1, i2, i3, i4, i5)
        values = self._pick(columns)
        if values is None:  # a mapped column without a "value"
            raise _error(wal_start, malformed)
        return values

    def _texts(self, values: tuple[Any, ...], wal_start: Lsn) -> tuple[str, str, str, str, str]:
        """The five required values as text; DecodeError for NULL or non-text values."""
        texts = []
        for name, raw in zip(self._names[:5], values, strict=False):
            text = text_value(raw)
            if text is None:
                raise _error(wal_start, self._problem(name, raw))
            texts.append(text)
        return texts[0], texts[1], texts[2], texts[3], texts[4]

    def _problem(self, name: str, raw: object) -> str:
        where = f"column {name!r} of {self._schema}.{self._table}"
        if raw is _MISSING:
            return (
                f"{where} is missing from the row: check the column mapping (--columns) "
                "against the table"
            )
        if raw is None:
            return (
                f"{where} is NULL: outbox rows need id, aggregate type and id, event type "
                "and payload"
            )
        return f"{where} has a value of JSON type {type(raw).__name__}; expected text"


def _xid(msg: dict[str, Any], wal_start: Lsn) -> int | None:
    xid = msg.get("xid")
    if xid is None or type(xid) is int:
        return xid
    raise _error(wal_start, f"bad 'xid' {xid!r}")


def _error(wal_start: Lsn, what: str) -> DecodeError:
    return DecodeError(f"cannot decode the wal2json message at LSN {wal_start}: {what}")

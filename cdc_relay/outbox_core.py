"""The application side's pure core: one event row and one dedup mark, whatever the driver.

Every application-side helper - ``cdc_relay.outbox`` / ``cdc_relay.consumer`` (psycopg 3)
and ``cdc_relay.integrations`` (SQLAlchemy, asyncpg, Django) - is a thin adapter over
this module (docs/design.md, "The application side"). It owns:

* the checks made before anything reaches the database: names (validated, then quoted
  here), argument types, the payload (``serialize_payload``), the W3C trace context;
* the event id (a random UUID unless given) and the trace context of the current
  OpenTelemetry span, when ``opentelemetry-api`` is installed;
* the statements, as SQL text in the driver's parameter style (``%s`` for psycopg and
  Django, ``$1`` for asyncpg, ``:p1`` for SQLAlchemy's ``text()``), and their order: a
  helper is a generator of ``Query`` values (``emit_steps``, ``mark_steps``) that an
  adapter runs with its own ``execute`` (``run_sync`` / ``run_async``), so the logic,
  including the once-per-database lookup of the trace columns, exists once;
* the errors: ConfigError for a bad name, TypeError / ValueError for bad arguments,
  EventIdError for an id that is not a UUID, TransactionRequired for ``process_once``
  outside a transaction.

Must not: import a driver (tests/unit/test_purity.py), open connections or
transactions, commit or roll back - the event commits or vanishes with the caller's
transaction, and a failed statement would abort that transaction, so every check the
core can make is made before the first statement.
"""

from __future__ import annotations

import functools
import importlib
import re
import uuid
from collections.abc import Awaitable, Callable, Generator, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar, Unpack

import orjson

from cdc_relay.config import TableRef, validated_columns, validated_table
from cdc_relay.errors import ConfigError
from cdc_relay.model import TRACE_COLUMNS, OutboxColumns

DEFAULT_TABLE = "public.outbox_events"
DEFAULT_PROCESSED_TABLE = "public.processed_events"
STYLES = ("format", "numeric", "named")  # %s, $1, :p1

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
# JSON text escaping U+0000: valid JSON, refused by jsonb ("unsupported Unicode escape
# sequence"). Preceded by an even number of backslashes, so ``\\u0000`` (an escaped
# backslash followed by "u0000") is not matched.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")

T = TypeVar("T")
Params = Sequence[Any] | Mapping[str, Any]


class EventIdError(ValueError):
    """An event id (or a message's id header) is not a UUID."""


class TransactionRequired(RuntimeError):
    """``process_once`` was called where its mark would commit on its own."""


class EmitOptions(TypedDict, total=False):
    """The keyword options every ``emit`` takes (docs/application-side.md).

    ``id`` (or its long name ``event_id``): the event's UUID (a ``uuid.UUID`` or its
    text, e.g. ``"1b4e28ba-2fa1-11d2-883f-0016d3cca427"``), random by default - the ``id``
    header consumers deduplicate on. ``table`` / ``columns``: the outbox and its
    column names (default ``public.outbox_events``, init's names). ``traceparent`` /
    ``tracestate``: the W3C trace context (default: the current OpenTelemetry span's).
    """

    id: uuid.UUID | str | None
    event_id: uuid.UUID | str | None
    table: str | TableRef
    columns: OutboxColumns | None
    traceparent: str | None
    tracestate: str | None


@dataclass(frozen=True, slots=True)
class Query:
    """One statement for the adapter to run; ``fetch``: send back its first row (or None)."""

    text: str
    params: Params
    fetch: bool = False


# ---------------------------------------------------------------- names and statements

def quote(*names: str) -> str:
    """``"schema"."name"``: validated names, double-quoted (as psycopg's sql.Identifier)."""
    return ".".join('"' + name.replace('"', '""') + '"' for name in names)


def placeholders(style: str, count: int, first: int = 1) -> list[str]:
    """``count`` parameter markers in ``style``, numbered from ``first``."""
    if style == "format":
        return ["%s"] * count
    if style == "numeric":
        return [f"${n}" for n in range(first, first + count)]
    if style == "named":
        return [f":p{n}" for n in range(first, first + count)]
    raise ValueError(f"unknown parameter style {style!r}: use one of {', '.join(STYLES)}")


def bind(style: str, values: Sequence[Any]) -> Params:
    """The parameters of ``values`` for ``style`` (a dict ``p1``... for ``named``)."""
    if style == "named":
        return {f"p{n}": value for n, value in enumerate(values, 1)}
    return tuple(values)


@functools.lru_cache(maxsize=256)
def insert_sql(table: str | TableRef = DEFAULT_TABLE, columns: OutboxColumns | None = None,
               trace: bool = False, style: str = "format") -> str:
    """The INSERT of one event; ConfigError for an invalid name (before any I/O).

    Parameters: id, aggregate_type, aggregate_id, event_type, payload (JSON text), then
    with ``trace`` traceparent and tracestate. Cached: every argument is hashable.
    """
    ref = validated_table(table)
    cols = validated_columns(columns)
    names = [cols.id, cols.aggregate_type, cols.aggregate_id, cols.event_type, cols.payload]
    if trace:
        names += list(TRACE_COLUMNS)
    return (f"INSERT INTO {quote(ref.schema, ref.name)} ({', '.join(quote(n) for n in names)})"
            f" VALUES ({', '.join(placeholders(style, len(names)))})")


@functools.lru_cache(maxsize=64)
def mark_sql(table: str | TableRef = DEFAULT_PROCESSED_TABLE, style: str = "format") -> str:
    """The INSERT that marks an event processed (one parameter: the id); a row iff new."""
    ref = validated_table(table)
    return (f"INSERT INTO {quote(ref.schema, ref.name)} (event_id) VALUES "
            f"({placeholders(style, 1)[0]}) ON CONFLICT (event_id) DO NOTHING RETURNING 1")


def trace_lookup(table: str | TableRef, style: str) -> Query:
    """How many of the trace context columns ``table`` has (a catalog read, no lock)."""
    ref = validated_table(table)
    marks = placeholders(style, 3)
    text = ("SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(" + marks[0] + ")"
            f" AND attname IN ({marks[1]}, {marks[2]}) AND attnum > 0 AND NOT attisdropped")
    return Query(text, bind(style, (quote(ref.schema, ref.name), *TRACE_COLUMNS)), fetch=True)


# ---------------------------------------------------------------- values

def serialize_payload(payload: Any) -> str:
    """The payload as JSON text, checked before it reaches PostgreSQL.

    * ``bytes`` / ``bytearray`` / ``memoryview``: already-serialised JSON (UTF-8); it is
      validated and stored as is (jsonb normalises it).
    * anything else is serialised with orjson: dict, list, str (a JSON *string*, not
      JSON text - pass bytes for that), int, float, bool, None, and what orjson
      handles natively (datetime, UUID, dataclasses, ...).

    Raises TypeError for a value orjson cannot serialise and ValueError for bytes that
    are not JSON, or for a U+0000 character, which jsonb cannot store.
    """
    if isinstance(payload, bytes | bytearray | memoryview):
        data = bytes(payload)
        try:
            orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"payload bytes are not valid JSON: {exc}") from exc
    else:
        try:
            data = orjson.dumps(payload)
        except orjson.JSONEncodeError as exc:
            raise TypeError(f"payload is not JSON-serialisable: {exc}") from exc
    if b"\\u0000" in data and _NUL_ESCAPE.search(data):
        raise ValueError("payload contains a U+0000 (NUL) character, which jsonb cannot store")
    return data.decode("utf-8")


def event_row(aggregate_type: str, aggregate_id: str, event_type: str, payload: Any,
              event_id: uuid.UUID | str | None) -> tuple[uuid.UUID, str, str, str, str]:
    """(id, aggregate_type, aggregate_id, event_type, payload JSON text), all checked; a
    text ``event_id`` is parsed (EventIdError when it is no UUID)."""
    for what, value in (("aggregate_type", aggregate_type), ("aggregate_id", aggregate_id),
                        ("event_type", event_type)):
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if event_id is None:
        event_id = uuid.uuid4()
    elif isinstance(event_id, str):
        event_id = event_uuid(event_id)
    elif not isinstance(event_id, uuid.UUID):
        raise TypeError(f"event_id must be a uuid.UUID or its text, got {type(event_id).__name__}")
    return (event_id, aggregate_type, aggregate_id, event_type, serialize_payload(payload))


def one_event_id(event_id: uuid.UUID | str | None,
                 id: uuid.UUID | str | None) -> uuid.UUID | str | None:
    """The event id given as ``event_id=`` or as its alias ``id=`` (not both)."""
    if id is None:
        return event_id
    if event_id is not None:
        raise TypeError("pass the event id once: event_id= or id=, not both")
    return id


def event_uuid(event_id: uuid.UUID | str) -> uuid.UUID:
    """``event_id`` as a UUID; EventIdError when it is not one."""
    if isinstance(event_id, uuid.UUID):
        return event_id
    try:
        return uuid.UUID(event_id)
    except (ValueError, TypeError, AttributeError) as exc:
        raise EventIdError(f"event id {event_id!r} is not a UUID") from exc


def transaction_required(hint: str) -> TransactionRequired:
    """The error of ``process_once`` outside a transaction; ``hint`` says how to open one."""
    # The mark would commit at once: if processing then failed, the event would count as
    # done and be lost.
    return TransactionRequired(
        f"process_once needs the consumer's transaction: call it inside {hint}, in the same "
        "transaction that applies the event"
    )


# ---------------------------------------------------------------- trace context

def trace_context(traceparent: str | None, tracestate: str | None) -> tuple[str | None, str | None]:
    """The explicit trace context (checked), else the current OpenTelemetry span's, else none."""
    if traceparent is None:
        if tracestate is not None:
            raise ValueError("tracestate without traceparent: pass both, or neither")
        return current_span_context()
    if not isinstance(traceparent, str) or not _TRACEPARENT.match(traceparent):
        raise ValueError(
            f"traceparent {traceparent!r} is not a W3C traceparent "
            "(version-traceid-spanid-flags in lower-case hex, e.g. 00-<32 hex>-<16 hex>-01)"
        )
    if tracestate is not None and not isinstance(tracestate, str):
        raise TypeError(f"tracestate must be a str, got {type(tracestate).__name__}")
    return traceparent, tracestate or None


@functools.cache
def _opentelemetry_trace() -> Any:
    """``opentelemetry.trace``, or None without the optional ``opentelemetry-api``."""
    try:
        return importlib.import_module("opentelemetry.trace")
    except ImportError:
        return None


def current_span_context() -> tuple[str | None, str | None]:
    """(traceparent, tracestate) of the current OpenTelemetry span; (None, None) without one."""
    trace = _opentelemetry_trace()
    if trace is None:
        return None, None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None, None
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    return traceparent, context.trace_state.to_header() or None


# (where the database is, "schema.table") -> whether the table has both trace columns.
# Looked up once per database and table; a table given the columns later (init
# --with-trace-context) is seen by processes started after that.
_TRACE_COLUMNS_SEEN: dict[tuple[Hashable, str], bool] = {}


def _trace_usable(has_columns: bool, table: str | TableRef, explicit: str | None) -> bool:
    if has_columns:
        return True
    if explicit is not None:
        raise ConfigError(
            f"table {validated_table(table)} has no traceparent/tracestate columns: run "
            "`cdc-relay init --with-trace-context` (or omit traceparent)"
        )
    return False


# ---------------------------------------------------------------- the steps

def emit_steps(aggregate_type: str, aggregate_id: str, event_type: str, payload: Any, *,
               style: str, where: Callable[[], Hashable],
               **options: Unpack[EmitOptions]) -> Generator[Query, Any, uuid.UUID]:
    """Insert one event: every check now (before any I/O), then - once per database and
    table, when there is a trace context - the trace column lookup, then the INSERT. The
    generator returns the event id.

    ``where``: called only for the lookup; names the database (e.g. host, port, dbname).
    """
    return _steps(lambda event_id: event_row(aggregate_type, aggregate_id, event_type, payload,
                                             event_id), style, where, options)


def emit_bytes_steps(aggregate_type: str, aggregate_id: str, event_type: str, data: bytes, *,
                     style: str, where: Callable[[], Hashable],
                     **options: Unpack[EmitOptions]) -> Generator[Query, Any, uuid.UUID]:
    """:func:`emit_steps` for a ``bytea`` payload column: ``data`` is stored as it is (the
    registry-encoded payloads of docs/messages.md; no JSON check)."""
    if not isinstance(data, bytes):
        raise TypeError(f"the encoded payload must be bytes, got {type(data).__name__}")
    return _steps(lambda event_id: (*event_row(aggregate_type, aggregate_id, event_type, None,
                                               event_id)[:4], data), style, where, options)


def _steps(row_of: Callable[[uuid.UUID | str | None], tuple[Any, ...]], style: str,
           where: Callable[[], Hashable], options: EmitOptions) -> Generator[Query, Any, uuid.UUID]:
    table = options.get("table", DEFAULT_TABLE)
    columns = options.get("columns")
    plain = insert_sql(table, columns, False, style)  # first: bad names fail before any I/O
    row = row_of(one_event_id(options.get("event_id"), options.get("id")))
    traceparent = options.get("traceparent")
    trace = trace_context(traceparent, options.get("tracestate"))
    return _emit(plain, row, trace, table, columns, style, where, explicit=traceparent)


def _emit(plain: str, row: tuple[Any, ...], trace: tuple[str | None, str | None],
          table: str | TableRef, columns: OutboxColumns | None, style: str,
          where: Callable[[], Hashable], *, explicit: str | None,
          ) -> Generator[Query, Any, uuid.UUID]:
    event_id: uuid.UUID = row[0]
    if trace[0] is None:
        yield Query(plain, bind(style, row))
        return event_id
    key = (where(), str(validated_table(table)))
    if key not in _TRACE_COLUMNS_SEEN:
        found = yield trace_lookup(table, style)
        _TRACE_COLUMNS_SEEN[key] = found is not None and int(found[0]) == len(TRACE_COLUMNS)
    if _trace_usable(_TRACE_COLUMNS_SEEN[key], table, explicit):
        yield Query(insert_sql(table, columns, True, style), bind(style, (*row, *trace)))
    else:
        yield Query(plain, bind(style, row))
    return event_id


def mark_steps(event_id: uuid.UUID | str, *, table: str | TableRef,
               style: str) -> Generator[Query, Any, bool]:
    """Mark ``event_id`` processed (checks now); the generator returns True the first
    time, False for a duplicate."""
    return _mark(Query(mark_sql(table, style), bind(style, (event_uuid(event_id),)), fetch=True))


def _mark(query: Query) -> Generator[Query, Any, bool]:
    found = yield query
    return found is not None


def run_sync(steps: Generator[Query, Any, T], execute: Callable[[Query], Any]) -> T:
    """Run ``steps`` with ``execute`` (a Query -> its first row when ``fetch``, else anything)."""
    try:
        query = next(steps)
        while True:
            query = steps.send(execute(query))
    except StopIteration as stop:
        result: T = stop.value
        return result


async def run_async(steps: Generator[Query, Any, T],
                    execute: Callable[[Query], Awaitable[Any]]) -> T:
    """The asyncio twin of :func:`run_sync`."""
    try:
        query = next(steps)
        while True:
            query = steps.send(await execute(query))
    except StopIteration as stop:
        result: T = stop.value
        return result

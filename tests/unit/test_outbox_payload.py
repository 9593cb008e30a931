"""``cdc_relay.outbox`` without a database: payload checks and refusing bad input early."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import orjson
import pytest

from cdc_relay.config import TableRef
from cdc_relay.consumer import process_once
from cdc_relay.errors import ConfigError
from cdc_relay.model import OutboxColumns
from cdc_relay.outbox import EventIdError, emit, serialize_payload


class UntouchableConnection:
    """Stands in for a psycopg connection; any use of it fails the test."""

    autocommit = False

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the database was touched: conn.{name}")


class RecordingConnection:
    """Records what emit sends, instead of a database."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []

    def execute(self, query: Any, params: Any = None) -> None:
        self.calls.append((query, params))


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"a": [1, {"b": None}]}, {"a": [1, {"b": None}]}),
        ([1, "x"], [1, "x"]),
        ("plain text", "plain text"),
        (12.5, 12.5),
        (None, None),
        (b'{"already": "json"}', {"already": "json"}),
        (bytearray(b"[1,2]"), [1, 2]),
        (memoryview(b'"s"'), "s"),
        ({"emoji": "🎉", "jp": "東京"}, {"emoji": "🎉", "jp": "東京"}),
        ({"at": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)},
         {"at": "2024-01-02T03:04:05+00:00"}),
    ],
)
def test_payloads_become_json_text(payload: Any, expected: Any) -> None:
    assert orjson.loads(serialize_payload(payload)) == expected


def test_bytes_payload_is_kept_verbatim() -> None:
    assert serialize_payload(b'{"b": 1,  "a": 2}') == '{"b": 1,  "a": 2}'


@pytest.mark.parametrize("payload", [b"{nope", b"", "caf\xe9".encode("latin-1")])
def test_bytes_that_are_not_json_are_refused(payload: bytes) -> None:
    with pytest.raises(ValueError, match="not valid JSON"):
        serialize_payload(payload)


@pytest.mark.parametrize("payload", [{"s": "a\x00b"}, b'{"s": "a\\u0000b"}',
                                     b'["\\\\\\u0000"]'])
def test_nul_characters_are_refused_before_jsonb_would(payload: Any) -> None:
    with pytest.raises(ValueError, match="U\\+0000"):
        serialize_payload(payload)


def test_an_escaped_backslash_before_u0000_is_not_a_nul() -> None:
    # JSON "\\u0000" is the six characters \u0000, which jsonb stores fine.
    assert serialize_payload(b'["\\\\u0000"]') == '["\\\\u0000"]'
    assert serialize_payload({"s": "\\u0000"}) == '{"s":"\\\\u0000"}'


def test_unserialisable_payload_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        serialize_payload({"x": object()})


@pytest.mark.parametrize(
    "options",
    [
        {"table": "x; drop table y"},
        {"table": TableRef("public", "x; drop table y")},
        {"columns": OutboxColumns(payload="payload; --")},
        {"columns": OutboxColumns(id="payload")},
    ],
)
def test_emit_refuses_invalid_names_without_touching_the_connection(
    options: dict[str, Any],
) -> None:
    with pytest.raises(ConfigError):
        emit(UntouchableConnection(), "a", "1", "e", {}, **options)  # type: ignore[arg-type]


def test_emit_refuses_wrong_argument_types_without_touching_the_connection() -> None:
    with pytest.raises(TypeError, match="aggregate_id must be a str"):
        emit(UntouchableConnection(), "a", 1, "e", {})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"event_id must be a uuid\.UUID or its text"):
        emit(UntouchableConnection(), "a", "1", "e", {}, event_id=7)  # type: ignore[arg-type]
    with pytest.raises(EventIdError, match="event id 'not-a-uuid' is not a UUID"):
        emit(UntouchableConnection(), "a", "1", "e", {}, event_id="not-a-uuid")


def test_process_once_refuses_invalid_table_without_touching_the_connection() -> None:
    with pytest.raises(ConfigError):
        process_once(UntouchableConnection(), uuid.uuid4(),  # type: ignore[arg-type]
                     table="processed_events; --")


def test_emit_sends_one_insert_and_returns_the_event_id() -> None:
    conn = RecordingConnection()
    given = uuid.uuid4()
    returned = emit(conn, "order", "o-1", "created", {"k": "v"},  # type: ignore[arg-type]
                    event_id=given)
    assert returned == given
    [(_, params)] = conn.calls
    assert params == (given, "order", "o-1", "created", '{"k":"v"}')


def test_emit_generates_distinct_ids() -> None:
    conn = RecordingConnection()
    ids = {emit(conn, "a", "1", "e", {}) for _ in range(3)}  # type: ignore[arg-type]
    assert len(ids) == 3

"""Reading the event id from Kafka headers (``cdc_relay.consumer``), no services."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from cdc_relay.consumer import EventIdError, event_id_from_headers

EVENT = uuid.UUID("3f1c2a7e-8d4b-4c1e-9a3f-0b6d5e4c3b2a")


@pytest.mark.parametrize(
    "headers",
    [
        [("id", str(EVENT).encode())],
        [("event_type", b"created"), ("id", str(EVENT).encode()), ("aggregate_type", b"o")],
        [("id", str(EVENT))],
        {"id": str(EVENT).encode()},
        {"id": str(EVENT)},
        [("id", f'"{EVENT}"'.encode())],
        [("id", f" {EVENT} \n".encode())],
        [("id", EVENT.hex.encode())],
        [("id", b"00000000-0000-0000-0000-000000000000"), ("id", str(EVENT).encode())],
    ],
)
def test_event_id_is_read_from_the_id_header(headers: Any) -> None:
    assert event_id_from_headers(headers) == EVENT


def test_another_header_name_can_be_used() -> None:
    assert event_id_from_headers([("eventId", str(EVENT).encode())], name="eventId") == EVENT


@pytest.mark.parametrize("headers", [None, [], {}, [("event_type", b"x")], [("id", None)],
                                     {"ID": str(EVENT)}])
def test_missing_id_header_is_a_clear_error(headers: Any) -> None:
    with pytest.raises(EventIdError, match="no 'id' header"):
        event_id_from_headers(headers)


@pytest.mark.parametrize("value", [b"not-a-uuid", b"\xff\xfe", "", b'""'])
def test_malformed_id_header_is_a_clear_error(value: Any) -> None:
    with pytest.raises(EventIdError, match="is not a UUID"):
        event_id_from_headers([("id", value)])


def test_event_id_error_is_a_value_error() -> None:
    assert issubclass(EventIdError, ValueError)

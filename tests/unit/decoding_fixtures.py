"""The captured server output both decoder test modules read (tests/fixtures).

The fixtures were captured by tests/fixtures/capture_decoding.py from PostgreSQL 15 with
wal2json 2.5 and pgoutput v1; expected_outbox.json is the database's own account of
each committed row.

``NOT_OUTBOX_EVENTS``: classes both compiled Readers must refuse as the event class.
``WAL2JSON_PATHS`` runs a wal2json test on both decoding paths: the pure-Python one and
the compiled fast path (decoding/_cwal2json.c). The compiled case is skipped when the
extension is not built; test_decoding_wal2json_compiled.py then fails, so a broken build
shows.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, fields, make_dataclass
from pathlib import Path
from typing import Any

import pytest

from cdc_relay.config import TableRef
from cdc_relay.decoding.pgoutput import PgOutputDecoder
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.model import Lsn, OutboxColumns, OutboxEvent

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXPECTED = json.loads((FIXTURES / "expected_outbox.json").read_text(encoding="utf-8"))
OUTBOX = TableRef("public", "outbox_events")
DEBEZIUM = TableRef("public", "outbox_debezium")
WIDE = TableRef("public", "outbox_wide")
AT = Lsn.parse("16/B374D848")


@dataclass(slots=True)
class _Subclass(OutboxEvent):
    pass


_NAMES = [f.name for f in fields(OutboxEvent)]
# Classes the compiled Readers must refuse to fill as if they were OutboxEvent.
NOT_OUTBOX_EVENTS: dict[str, Any] = {
    "not-a-class": "OutboxEvent",
    "object": object,
    "other-dataclass": OutboxColumns,
    "subclass": _Subclass,
    "without-slots": make_dataclass("Plain", _NAMES),
    "a-field-more": make_dataclass("Wider", [*_NAMES, "more"], slots=True),
    "reordered": make_dataclass("Reordered", _NAMES[::-1], slots=True),
}


# Both paths (the ``compiled`` fixture, tests/conftest.py): tests taking ``compiled`` run
# on each; this marks the ones that need it only for the path they build on.
WAL2JSON_PATHS = pytest.mark.usefixtures("compiled")


def load(name: str) -> list[tuple[Lsn, bytes]]:
    """(wal_start, payload) of every message in a fixture; pgoutput payloads are base64."""
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    binary = name.startswith("pgoutput")
    out = []
    for line in lines:
        message = json.loads(line)
        payload = message["payload"]
        raw = base64.b64decode(payload) if binary else payload.encode()
        out.append((Lsn.parse(message["wal_start"]), raw))
    return out


def expected_rows(table: TableRef, partial: bool = False) -> list[dict[str, Any]]:
    rows = EXPECTED["rows"][: EXPECTED["rows_before_batch"]] if partial else EXPECTED["rows"]
    return [row for row in rows if row["table"] == str(table)]


def as_row(event: OutboxEvent, table: TableRef) -> dict[str, Any]:
    """An event in expected_outbox.json's shape (large payloads by length and hash)."""
    row: dict[str, Any] = {
        "table": str(table),
        "id": event.id,
        "aggregate_type": event.aggregate_type,
        "aggregate_id": event.aggregate_id,
        "event_type": event.event_type,
        "created_at_ms": event.created_at_ms,
    }
    if len(event.payload) > 4096:
        row["payload_len"] = len(event.payload)
        row["payload_sha256"] = hashlib.sha256(event.payload).hexdigest()
    else:
        row["payload"] = event.payload.decode()
    return row


def decode_all(name: str, table: TableRef, columns: OutboxColumns) -> list[Any]:
    """Decode a whole fixture with the decoder its name says (on the test's path)."""
    decoder: PgOutputDecoder | Wal2JsonDecoder
    if name.startswith("pgoutput"):
        decoder = PgOutputDecoder(table, columns)
    else:
        decoder = Wal2JsonDecoder(table, columns)
    return [decoder.decode(payload, wal_start) for wal_start, payload in load(name)]


def events(changes: list[Any]) -> list[OutboxEvent]:
    return [change for change in changes if isinstance(change, OutboxEvent)]

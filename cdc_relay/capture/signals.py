"""Incremental snapshots' signals: a signal table row (Debezium's ``id``, ``type``, ``data``) read.

Owns ``parse_signal``: ``execute-snapshot`` and ``stop-snapshot`` with Debezium's ``data``
(``data-collections``, ``type`` ``incremental``) become a ``Request``; what the relay cannot
act on is a ``SignalRefused`` whose message is the one line to log; other signal types
are not a snapshot's (None). Must not: act on a request (capture/incremental.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from cdc_relay.capture.qualified import parse_qualified
from cdc_relay.errors import ConfigError

__all__ = ["INCREMENTAL", "Request", "SignalRefused", "parse_signal"]

INCREMENTAL = "incremental"  # source.snapshot of an incremental snapshot's rows, as Debezium's


class SignalRefused(ValueError):
    """A signal the relay cannot act on: its message is the one line to log."""


@dataclass(frozen=True, slots=True)
class Request:
    """``execute`` (snapshot ``tables`` in order) or ``stop`` (them; all when empty)."""

    action: str
    tables: tuple[tuple[str, str], ...]
    signal_id: str


def parse_signal(signal_id: str, kind: str, data: str | None) -> Request | None:
    """A signal table row (Debezium's ``id``, ``type``, ``data``) → a Request; None for a
    type that is not a snapshot's (Debezium's ``log``, ...); SignalRefused otherwise."""
    if kind not in ("execute-snapshot", "stop-snapshot"):
        return None
    try:
        body = json.loads(data) if data else {}
    except ValueError as exc:
        raise SignalRefused(f"signal {signal_id!r}: data is not JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise SignalRefused(f"signal {signal_id!r}: data must be a JSON object")
    snapshot_type = str(body.get("type", INCREMENTAL)).lower()
    if snapshot_type != INCREMENTAL:
        raise SignalRefused(f"signal {signal_id!r}: snapshot type {snapshot_type!r} is not "
                            "supported (only incremental)")
    if body.get("additional-conditions") or body.get("additional-condition"):
        raise SignalRefused(f"signal {signal_id!r}: additional-conditions are not supported")
    names = body.get("data-collections", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SignalRefused(f"signal {signal_id!r}: data-collections must be a list of names")
    if kind == "execute-snapshot" and not names:
        raise SignalRefused(f"signal {signal_id!r}: execute-snapshot names no data-collections")
    try:
        tables = tuple(_table_name(n) for n in names)
    except ConfigError as exc:
        raise SignalRefused(f"signal {signal_id!r}: {exc}") from exc
    return Request("execute" if kind == "execute-snapshot" else "stop", tables, signal_id)


def _table_name(name: str) -> tuple[str, str]:
    """Debezium's ``schema.table`` (split at the first dot, taken as written; a bare name is
    ``public``'s), or with a double quote the quoted grammar of ``--capture``."""
    if '"' in name:
        return parse_qualified(name, "data-collections name", default_schema="public")
    schema, dot, table = name.strip().partition(".")
    return (schema, table) if dot else ("public", schema)

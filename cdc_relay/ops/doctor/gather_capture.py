"""Gathers the facts ``doctor --capture`` judges (ops/doctor/capture.py).

Reads, never writes: the tables ``--capture`` names and their shapes, the role's SELECT
privilege and ownership of each, what the publication covers (pg/catalog.py). A table
that does not exist is a fact (a failing check), not an error that ends doctor.
"""

from __future__ import annotations

from cdc_relay.capture.selection import Selection
from cdc_relay.errors import ConfigError, RelayError
from cdc_relay.ops.doctor.capture import CaptureFacts, capture_checks
from cdc_relay.ops.verdicts import Check, Verdict
from cdc_relay.pg.catalog import expand, lacks_select, owns, publication_coverage, table_shape
from cdc_relay.pg.db import connect


def run_capture_checks(dsn: str, option: str, publication: str, plugin: str = "pgoutput",
                       own: tuple[tuple[str, str], ...] = ()) -> list[Check]:
    """The capture checks; one failing Check when the facts cannot be gathered. ``own``:
    the outbox table, which no pattern takes (capture/selection.py)."""
    try:
        facts = _gather(dsn, option, publication, plugin, own)
    except RelayError as exc:
        return [Check("captured tables", Verdict.FAIL, f"cannot gather the facts: {exc}")]
    return capture_checks(facts)


def _gather(dsn: str, option: str, publication: str, plugin: str,
            own: tuple[tuple[str, str], ...]) -> CaptureFacts:
    try:
        selection = Selection.parse(option, own)
    except ConfigError as exc:
        return CaptureFacts(option, publication, error=str(exc))
    with connect(dsn, autocommit=True, application_name="cdc-relay doctor") as conn:
        try:
            tables = expand(conn, selection)
        except ConfigError as exc:
            return CaptureFacts(option, publication, error=str(exc))
        if not tables:
            return CaptureFacts(option, publication,
                                error=f"--capture {option!r} matches no table")
        shapes = tuple(s for s in (table_shape(conn, *t) for t in tables) if s is not None)
        return CaptureFacts(
            option, publication, shapes,
            no_select=tuple(f"{s}.{t}" for s, t in tables if lacks_select(conn, s, t)),
            not_owned=tuple(f"{s}.{t}" for s, t in tables if not owns(conn, s, t)),
            coverage=publication_coverage(conn, publication) if plugin == "pgoutput" else None,
            plugin=plugin)

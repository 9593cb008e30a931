"""Strict per-aggregate order in polling mode: what a failure does to later events."""

from __future__ import annotations

from psycopg import sql

from cdc_relay.config import OutboxConfig
from cdc_relay.model import OutboxEvent
from cdc_relay.polling.settlement import Unsettled, settle
from cdc_relay.polling.sql import OutboxQueries, locked_prefix
from cdc_relay.sink.base import DeliveryError, ErrorKind

RETRY = DeliveryError(ErrorKind.RETRIABLE, "leader not available")
PERM = DeliveryError(ErrorKind.PERMANENT, "too large")


def ev(n: int, aggregate: str = "a") -> OutboxEvent:
    return OutboxEvent(f"id-{n}", "order", aggregate, "Placed", b"{}", attempt=1)


def test_an_acked_event_after_its_aggregate_s_failure_is_not_marked_processed() -> None:
    events = [ev(1, "a"), ev(2, "a"), ev(3, "b")]
    result = settle(events, [RETRY, None, None], strict=True)
    assert result.failures == [(events[0], "leader not available")]
    assert result.released == [events[1]]  # goes out again after event 1
    assert result.processed == [events[2]]


def test_an_unreported_event_blocks_its_aggregate_s_acked_successors() -> None:
    events = [ev(1, "a"), ev(2, "a"), ev(3, "b")]
    result = settle(events, [Unsettled.UNREPORTED, None, None], strict=True)
    assert result.processed == [events[2]]
    assert result.released == [events[0], events[1]]
    assert result.failures == []


def test_without_strict_order_acked_events_are_processed_whatever_came_before() -> None:
    events = [ev(1, "a"), ev(2, "a")]
    result = settle(events, [PERM, None], strict=False)
    assert result.processed == [events[1]]


def row(name: str, aggregate: str) -> tuple[object, ...]:
    return (name, "order", aggregate, "Placed", "{}", 0, 0, f"raw-{name}")


def test_locked_prefix_stops_an_aggregate_at_a_row_that_was_not_locked() -> None:
    rows = [row("a1", "a"), row("b1", "b"), row("a2", "a"), row("a3", "a"), row("b2", "b")]
    locked = {"raw-a1", "raw-b1", "raw-a3", "raw-b2"}  # a2: taken by another poller
    assert [r[0] for r in locked_prefix(rows, locked)] == ["a1", "b1", "b2"]


def test_the_row_lock_rechecks_that_rows_are_pending_and_skips_held_ones() -> None:
    text = OutboxQueries(OutboxConfig()).lock_rows().as_string(None)
    assert "processed_at IS NULL AND dead_lettered_at IS NULL" in text
    assert "attempts < %(max)s" in text
    assert text.endswith("FOR UPDATE SKIP LOCKED")
    assert isinstance(OutboxQueries(OutboxConfig()).lock_rows(), sql.Composed)

"""Polling mode's pure parts: backoff, strict-order prefixes, settling a batch, row mapping."""

from __future__ import annotations

import pytest
from psycopg import sql

from cdc_relay.config import OutboxConfig, TableRef
from cdc_relay.errors import ConfigError
from cdc_relay.model import OutboxColumns, OutboxEvent
from cdc_relay.polling.settlement import (
    BackoffPolicy,
    Unsettled,
    backoff_delay,
    settle,
)
from cdc_relay.polling.sql import Candidate, OutboxQueries, event_from_row, ready_prefix
from cdc_relay.sink.base import DeliveryError, ErrorKind

POLICY = BackoffPolicy(base=1.0, maximum=300.0, jitter=0.1)


# -- backoff ---------------------------------------------------------------------

@pytest.mark.parametrize(("failures", "expected"), [(0, 1.0), (1, 2.0), (2, 4.0), (5, 32.0),
                                                    (8, 256.0), (9, 300.0), (40, 300.0)])
def test_backoff_doubles_from_base_and_stops_at_the_maximum(failures: int, expected: float) -> None:
    assert backoff_delay(failures, POLICY, rand=0.5) == expected


def test_backoff_jitter_stays_within_its_band_and_never_exceeds_the_maximum() -> None:
    assert backoff_delay(2, POLICY, rand=0.0) == pytest.approx(3.6)
    assert backoff_delay(2, POLICY, rand=0.999999) == pytest.approx(4.4, rel=1e-5)
    assert backoff_delay(20, POLICY, rand=0.999999) == 300.0


def test_backoff_survives_absurd_attempt_counts() -> None:
    assert backoff_delay(10_000, POLICY, rand=0.5) == 300.0
    assert backoff_delay(-3, POLICY, rand=0.5) == 1.0


# -- strict order: the ready prefix of each aggregate ----------------------------

def cand(key: int, name: str, ready: bool = True) -> Candidate:
    return Candidate(key, ready, (name,))


def test_ready_prefix_stops_each_aggregate_at_its_first_waiting_row() -> None:
    rows = [cand(1, "a1"), cand(2, "b1", ready=False), cand(1, "a2"), cand(2, "b2"),
            cand(3, "c1"), cand(1, "a3", ready=False), cand(1, "a4"), cand(3, "c2")]
    assert ready_prefix(rows, 10) == [("a1",), ("a2",), ("c1",), ("c2",)]


def test_ready_prefix_keeps_global_order_and_the_limit() -> None:
    rows = [cand(1, "a1"), cand(2, "b1"), cand(1, "a2"), cand(2, "b2")]
    assert ready_prefix(rows, 3) == [("a1",), ("b1",), ("a2",)]


# -- settling a batch --------------------------------------------------------------

def ev(n: int, aggregate: str = "a") -> OutboxEvent:
    return OutboxEvent(f"id-{n}", "order", aggregate, "Placed", b"{}", attempt=1)


PERM = DeliveryError(ErrorKind.PERMANENT, "illegal topic")
RETRY = DeliveryError(ErrorKind.RETRIABLE, "leader not available")
FATAL = DeliveryError(ErrorKind.FATAL, "message timed out")


def test_successes_are_processed_and_the_event_s_own_failures_count() -> None:
    events = [ev(1), ev(2), ev(3)]
    result = settle(events, [None, PERM, RETRY], strict=False)
    assert result.processed == [events[0]]
    assert result.failures == [(events[1], "illegal topic"), (events[2], "leader not available")]
    assert not result.broker_down and not result.discard_sink


def test_a_batch_with_no_ack_and_broker_trouble_counts_no_attempt_but_keeps_permanent_ones() -> None:
    events = [ev(1), ev(2), ev(3)]
    result = settle(events, [RETRY, PERM, Unsettled.UNREPORTED], strict=False)
    assert result.broker_down and result.discard_sink
    assert result.failures == [(events[1], "illegal topic")]
    assert result.released == [events[0], events[2]]


def test_fatal_failures_are_never_the_event_s_fault_even_when_others_succeed() -> None:
    events = [ev(1), ev(2)]
    result = settle(events, [None, FATAL], strict=False)
    assert result.processed == [events[0]] and result.released == [events[1]]
    assert result.failures == [] and result.discard_sink and not result.broker_down


def test_a_batch_of_poison_only_is_not_a_broker_outage() -> None:
    result = settle([ev(1), ev(2)], [PERM, PERM], strict=False)
    assert not result.broker_down and len(result.failures) == 2


def test_strict_order_counts_only_the_first_failure_of_an_aggregate() -> None:
    events = [ev(1, "a"), ev(2, "b"), ev(3, "a"), ev(4, "a"), ev(5, "b")]
    results = [PERM, None, RETRY, Unsettled.HELD, None]
    result = settle(events, results, strict=True)
    assert result.failures == [(events[0], "illegal topic")]
    assert result.released == [events[2], events[3]]
    assert result.processed == [events[1], events[4]]


def test_without_strict_order_every_failure_counts() -> None:
    events = [ev(1, "a"), ev(2, "a")]
    assert len(settle(events, [PERM, PERM], strict=False).failures) == 2


# -- rows and statements -----------------------------------------------------------

def test_a_claimed_row_becomes_the_event_wal_mode_would_send() -> None:
    row = ("7616f707-0000-4000-8000-000000000001", "order", "o-1", "Placed",
           '{"amount": 12.5, "orderId": "o-1"}', 1796037824024, 2, object())
    event = event_from_row(row)
    assert event == OutboxEvent("7616f707-0000-4000-8000-000000000001", "order", "o-1", "Placed",
                                b'{"amount": 12.5, "orderId": "o-1"}', 1796037824024, attempt=3)


def _text(composed: sql.Composable) -> str:
    return composed.as_string(None)


def test_statements_quote_configured_names_and_never_interpolate_values() -> None:
    outbox = OutboxConfig(TableRef("Sales", "Outbox"), OutboxColumns.debezium())
    queries = OutboxQueries(outbox)
    claim = _text(queries.claim())
    assert '"Sales"."Outbox"' in claim and '"aggregatetype"::text' in claim
    assert "FOR UPDATE SKIP LOCKED" in claim and "%(limit)s" in claim
    assert '"type"::text' in _text(queries.list_dead_letters())
    assert 'WHERE "id" = ANY(%(ids)s)' in _text(queries.mark_processed())


def test_invalid_names_are_refused_before_any_sql_is_built() -> None:
    with pytest.raises(ConfigError):
        OutboxQueries(OutboxConfig(TableRef("public", 'x"; DROP TABLE y; --')))
    with pytest.raises(ConfigError):
        OutboxQueries(OutboxConfig(columns=OutboxColumns(payload="attempts")))

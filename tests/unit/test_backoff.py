"""The shared capped exponential backoff (cdc_relay/backoff.py)."""

from __future__ import annotations

from cdc_relay.backoff import Backoff


def test_delays_double_up_to_the_maximum() -> None:
    backoff = Backoff(0.5, 4.0)
    assert [backoff.next_delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_healthy_period_brings_the_delay_back_to_the_minimum() -> None:
    backoff = Backoff(1.0, 30.0, healthy_after=60.0)
    assert [backoff.next_delay(t) for t in range(5)] == [1, 2, 4, 8, 16]
    backoff.healthy(100.0)
    backoff.healthy(130.0)  # still the same healthy stretch: it began at 100
    assert backoff.next_delay(160.0) == 1.0
    backoff.healthy(200.0)
    assert backoff.next_delay(210.0) == 2.0  # 10 s of health is not enough


def test_reset_starts_again_from_the_minimum() -> None:
    backoff = Backoff(2.0, 10.0)
    backoff.next_delay()
    backoff.next_delay()
    backoff.reset()
    assert backoff.current == 2.0 and backoff.next_delay() == 2.0

"""The first producer warms up on a thread during start-up; the relay's first session takes it."""

from __future__ import annotations

import logging
import threading

import pytest

from cdc_relay.delivery.engine import ProducerFailed
from cdc_relay.errors import BrokerError
from cdc_relay.sink.base import ignore_reports
from cdc_relay.testing import FakeSink, FakeSinkFactory
from cdc_relay.wal.stream.loop import SinkWarmUp
from tests.support import wait_for
from tests.unit.wal_harness import Harness, txns


def _relay_over_a_warming_sink(count: int, size: int
                               ) -> tuple[FakeSinkFactory, FakeSink, SinkWarmUp, Harness]:
    """A relay whose first sink warms up before it runs (as ``run_wal`` builds it)."""
    factory, stop = FakeSinkFactory(), threading.Event()
    early = factory(ignore_reports)
    warm = SinkWarmUp(early, stop, timeout=5)
    harness = Harness(txns(count, size), factory, first_sink=warm)
    harness.stop = stop
    return factory, early, warm, harness


def test_the_relay_streams_through_the_sink_warmed_up_before_it_ran() -> None:
    factory, early, _warm, harness = _relay_over_a_warming_sink(3, 2)
    harness.run()
    assert early.warmed_up and factory.generations == 1  # no second producer was built
    assert harness.slot.confirmed == harness.slot.txns[-1].end_lsn
    assert len(harness.acked_ids()) == 6  # the reports reached the session (set_handler)


def test_an_unreachable_broker_is_a_producer_failure_raised_to_the_taker_and_the_sink_closed() -> None:
    factory = FakeSinkFactory(lambda sink: setattr(sink, "unreachable", True))
    sink = factory(ignore_reports)
    warm = SinkWarmUp(sink, threading.Event(), timeout=0.05)
    with pytest.raises(ProducerFailed, match="broker not reachable"):
        warm.result()
    assert sink.closed


def test_a_stop_during_the_warm_up_gives_no_sink_and_closes_it() -> None:
    factory = FakeSinkFactory(lambda sink: setattr(sink, "unreachable", True))
    sink = factory(ignore_reports)
    stop = threading.Event()
    stop.set()
    assert SinkWarmUp(sink, stop, timeout=30).result() is None
    assert sink.closed


def test_cancel_closes_the_sink_when_start_up_fails_before_the_relay_runs() -> None:
    factory = FakeSinkFactory(lambda sink: setattr(sink, "unreachable", True))
    sink = factory(ignore_reports)
    warm = SinkWarmUp(sink, threading.Event(), timeout=30)  # would retry for 30 s
    warm.cancel()
    assert sink.closed and not warm._thread.is_alive()


def test_a_relay_stopped_before_its_first_session_closes_the_warming_sink() -> None:
    factory, early, warm, harness = _relay_over_a_warming_sink(1, 1)
    harness.stop.set()  # a SIGTERM between start-up and the relay's loop
    harness.run()
    assert early.closed and not warm._thread.is_alive()
    assert factory.generations == 1 and early.produced == []


class _LoggingDownSink(FakeSink):
    """A sink whose warm-up logs what librdkafka would about a broker that is down."""

    def warm_up(self, timeout: float) -> None:
        logging.getLogger("cdc_relay.kafka").warning("broker down")
        raise BrokerError("fake broker unreachable")


@pytest.mark.parametrize("taken", [True, False])
def test_what_the_warm_up_logs_is_held_until_taken_and_dropped_on_cancel(
        taken: bool, caplog: pytest.LogCaptureFixture) -> None:
    root = logging.getLogger()
    root.addHandler(caplog.handler)  # lines are held by a filter on the root's handlers
    try:
        sink = _LoggingDownSink(ignore_reports)
        warm = SinkWarmUp(sink, threading.Event(), timeout=0.05 if taken else 30)
        wait_for(lambda: warm._lines.held, timeout=5, message="a line logged by the warm-up")
        assert "broker down" not in caplog.text  # held while start-up goes on
        if taken:
            with pytest.raises(ProducerFailed):
                warm.result()
            assert "broker down" in caplog.text
        else:
            warm.cancel()
            assert "broker down" not in caplog.text
    finally:
        root.removeHandler(caplog.handler)
